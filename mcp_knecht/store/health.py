"""How often the store failed: database errors counted per dialect where the backends translate
them into `StoreError` (read by the metrics; a process-wide tally, like the driver's own state)."""

from __future__ import annotations

import threading
from collections import Counter

from mcp_knecht.errors import StoreError

_counts: Counter[str] = Counter()
_lock = threading.Lock()


def store_error(dialect: str, message: str, details: dict[str, object] | None = None, *,
                kind: type[StoreError] = StoreError) -> StoreError:
    """The `StoreError` (or the subclass `kind`) for a driver error that just entered, counted."""
    with _lock:
        _counts[dialect] += 1
    return kind(message, details=details)


def store_error_counts() -> dict[str, int]:
    with _lock:
        return dict(_counts)

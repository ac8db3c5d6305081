"""One clock and one timestamp format for everything stored.

Timestamps are UTC text in one fixed format (`2026-12-01T09:43:08.123456Z`), so that they sort and
compare correctly as text on every backend (SQLite, and PostgreSQL columns with the `C` collation).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
_second: tuple[int, str] = (-1, "")
"""The last whole second formatted, and its text: most timestamps fall in the second before."""


def now() -> datetime:
    """The current moment, aware, in UTC."""
    return datetime.now(UTC)


def timestamp(moment: datetime | None = None) -> str:
    """`moment` (default: now) in the stored format (`FORMAT`, written without strftime: every audit
    row takes one, and this is three times faster)."""
    if moment is None:
        return timestamp_ns(time.time_ns())
    if moment.tzinfo is not UTC:
        moment = moment.astimezone(UTC)
    return f"{moment.isoformat(timespec='microseconds')[:-6]}Z"


def timestamp_ns(epoch_ns: int) -> str:
    """`time.time_ns()`'s reading in the stored format. The date and time of day are formatted once
    per second: a call's audit entry takes the moment when the call ends, and formats it later."""
    global _second
    second, nanoseconds = divmod(epoch_ns, 1_000_000_000)
    cached_second, text = _second
    if second != cached_second:
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        _second = (second, text)
    return f"{text}.{nanoseconds // 1000:06d}Z"


def stored(value: object) -> str:
    """A stored moment read back as text: anything else ("" for a BLOB, which SQLite keeps as bytes even in
    a TEXT column) was written around the store, and reads as long past, since "" sorts before every
    timestamp. So one such row reads as expired instead of failing every read that compares it."""
    return value if isinstance(value, str) else ""


def parse(text: str) -> datetime:
    """A stored timestamp (this format, or any ISO 8601 form older rows used) as an aware datetime."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def readable(value: object) -> datetime | None:
    """A stored moment as an aware datetime, or None when it is none: not text (bytes), or text that is no
    ISO 8601 moment ('garbage'). Only a row written around the store holds one; where a moment is only
    shown or waited on, reading it this way keeps that row from failing the read of every other."""
    if not isinstance(value, str):
        return None
    try:
        return parse(value)
    except ValueError:
        return None


def seconds_until(value: object) -> float | None:
    """Seconds from now until the stored moment `value` (negative once it has passed); None when `value` is
    no moment (`readable`)."""
    moment = readable(value)
    return None if moment is None else (moment - now()).total_seconds()

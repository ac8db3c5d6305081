"""A JSON object as stored (a proposal's arguments as shown, its preview, its result), read for showing.

Text that is no JSON object was written around the store: it is shown as it is, under `unreadable`,
rather than failing every read that shows its row (every listing holding it, for everyone). What
runs is never read this way: its text is sealed, and a row whose seal holds is what was written.
"""

from __future__ import annotations

import json
from typing import Any

UNREADABLE = "unreadable"


def decoded(value: object) -> object:
    """Bytes (SQLite keeps a BLOB as bytes in any column) read as UTF-8 text, with replacement characters
    where they are none; any other value as it is."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def json_object(value: object) -> dict[str, Any] | None:
    """`value` parsed, if it is a JSON object; None for no value; otherwise `{"unreadable": value}`."""
    if value is None or value == "":
        return None
    try:
        parsed = json.loads(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        parsed = None
    if isinstance(parsed, dict):
        return parsed
    return {UNREADABLE: str(decoded(value))}

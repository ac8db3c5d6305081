"""Durations as people write them: `30m`, `8h`, `7d`, `3600s`, `1h30m`."""

from __future__ import annotations

import re
from datetime import timedelta

from mcp_knecht.errors import UsageError

_PART = re.compile(r"(\d{1,9})([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_duration(text: str, *, maximum: timedelta | None = None, what: str = "duration") -> timedelta:
    """Parse a positive duration; `UsageError` names the text and the expected form."""
    compact = text.strip().lower().replace(" ", "") if isinstance(text, str) else ""
    if not compact or _PART.sub("", compact):
        raise UsageError(
            f"Invalid duration {text!r} for the {what.lower()}: use a number with a unit, e.g. 30m, 8h, 7d or 3600s."
        )
    try:
        duration = sum(
            (timedelta(**{_UNITS[unit]: int(number)}) for number, unit in _PART.findall(compact)), timedelta(0)
        )
    except OverflowError:
        raise UsageError(f"Duration {text!r} is too long for the {what.lower()}.") from None
    if duration <= timedelta(0):
        raise UsageError(f"Duration {text!r} for the {what.lower()} must be longer than zero.")
    if maximum is not None and duration > maximum:
        raise UsageError(f"Duration {text!r} for the {what.lower()} is longer than the maximum of {describe(maximum)}.")
    return duration


def describe(duration: timedelta) -> str:
    """`timedelta(days=30)` → "30 days"; `timedelta(hours=8)` → "8 hours"."""
    seconds = int(duration.total_seconds())
    for unit, size in (("day", 86_400), ("hour", 3_600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = seconds // size
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds} seconds"

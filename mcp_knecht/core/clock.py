"""One clock and one timestamp format for everything stored.

Timestamps are UTC text in one fixed format (`2026-12-01T09:43:08.123456Z`), so that they sort and
compare correctly as text on every backend (SQLite, and PostgreSQL columns with the `C` collation).
"""

from __future__ import annotations

from datetime import UTC, datetime

FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def now() -> datetime:
    """The current moment, aware, in UTC."""
    return datetime.now(UTC)


def timestamp(moment: datetime | None = None) -> str:
    """`moment` (default: now) in the stored format (`FORMAT`, written without strftime: every audit
    row takes one, and this is three times faster)."""
    moment = moment or now()
    if moment.tzinfo is not UTC:
        moment = moment.astimezone(UTC)
    return f"{moment.isoformat(timespec='microseconds')[:-6]}Z"


def parse(text: str) -> datetime:
    """A stored timestamp (this format, or any ISO 8601 form older rows used) as an aware datetime."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def seconds_until(text: str) -> float:
    """Seconds from now until the stored timestamp `text` (negative once it has passed)."""
    return (parse(text) - now()).total_seconds()

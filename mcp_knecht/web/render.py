"""Templates: one Jinja2 environment (autoescaped, strict about undefined names) and the filters the
pages share. No template contains a script or a style attribute; the policy would refuse them."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from starlette.responses import HTMLResponse

from mcp_knecht.core import clock

STATUS_LABELS = {
    "succeeded": "Succeeded", "failed": "Failed", "running": "Running", "queued": "Queued",
    "cancelled": "Cancelled", "skipped": "Skipped", "pending": "Pending", "approved": "Approved",
    "executing": "Executing", "rejected": "Rejected", "expired": "Expired",
}


def when(text: str | None) -> str:
    """A stored timestamp for people: `2026-12-01 09:43 UTC`; a value that is none, as it is."""
    if not text:
        return "—"
    if (at := clock.readable(text)) is None:
        return str(text)
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def ago(text: str | None, now: datetime | None = None) -> str:
    if not text or (at := clock.readable(text)) is None:
        return ""
    seconds = ((now or clock.now()) - at).total_seconds()
    future = seconds < 0
    seconds = abs(seconds)
    for size, unit in ((86400, "day"), (3600, "hour"), (60, "minute")):
        if seconds >= size:
            count = int(seconds // size)
            amount = f"{count} {unit}{'s' if count != 1 else ''}"
            return f"in {amount}" if future else f"{amount} ago"
    return "just now"


def moment(text: str | None, now: datetime | None = None) -> str:
    """"5 minutes ago" for the last week, else the date and time."""
    if not text:
        return "—"
    if (at := clock.readable(text)) is None:
        return str(text)
    seconds = ((now or clock.now()) - at).total_seconds()
    return ago(text, now) if 0 <= seconds < 7 * 86400 else when(text)


def duration(seconds: int | None) -> str:
    if seconds is None:
        return "—"
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def diff_lines(diff: str) -> list[tuple[str, str]]:
    """A unified diff as (kind, line): kind is add, del, hunk, file or same."""
    lines = []
    for line in diff.splitlines():
        if line.startswith(("+++", "---")):
            kind = "file"
        elif line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        else:
            kind = "same"
        lines.append((kind, line))
    return lines


def kind_of(value: Any) -> str:
    """How the preview template shows a value: a nested table, a list, a block of text, or inline."""
    if isinstance(value, dict):
        return "map"
    if isinstance(value, list):
        return "list"
    if isinstance(value, str) and ("\n" in value or len(value) > 120):
        return "block"
    return "inline"


def status_label(status: str | None) -> str:
    return STATUS_LABELS.get(status or "", (status or "unknown").capitalize())


def build_environment() -> Environment:
    env = Environment(
        loader=PackageLoader("mcp_knecht.web", "templates"),
        autoescape=select_autoescape(["html"], default=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(when=when, ago=ago, moment=moment, duration=duration, pretty_json=pretty_json,
                       diff_lines=diff_lines, kind_of=kind_of, status_label=status_label)
    return env


class Renderer:
    def __init__(self) -> None:
        self.env = build_environment()

    def html(self, template: str, context: dict[str, Any]) -> str:
        return self.env.get_template(template).render(**context)

    def response(self, template: str, context: dict[str, Any], status: int = 200) -> HTMLResponse:
        return HTMLResponse(self.html(template, context), status_code=status)

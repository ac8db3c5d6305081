"""The server's log on stderr: `text` (the default: warnings and errors, as a person reads them)
or `json` (one JSON object per line, for a log shipper), with one event per gate outcome.

A gate event carries the fields of its audit row — `at`, `source`, `subject`, `client`, `tool`,
`action`, `outcome`, `rule`, `proposal_id`, `arguments_hash`, `duration_ms`, `error` — and never
the arguments:

    {"ts": "2026-12-01T09:43:08.123456Z", "level": "info", "logger": "mcp_knecht.gate",
     "event": "gate_outcome", "message": "get_run ran", "at": "…", "source": "mcp", "tool": "get_run", …}
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from mcp_knecht.core.audit import AuditEntry
from mcp_knecht.core.clock import timestamp
from mcp_knecht.core.settings import LogFormat

GATE_EVENT = "gate_outcome"

event_logger = logging.getLogger("mcp_knecht.gate")
_RESERVED = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


def gate_event(entry: AuditEntry) -> dict[str, Any]:
    """An audit entry as a log event: the row's fields, without the arguments of refused calls."""
    return {
        "at": entry.at, "source": entry.source, "subject": entry.subject, "client": entry.client,
        "tool": entry.tool, "action": entry.action, "outcome": entry.outcome, "rule": entry.rule,
        "proposal_id": entry.proposal_id, "arguments_hash": entry.arguments_hash,
        "duration_ms": entry.duration_ms,
        **{key: value for key, value in entry.detail.items() if key != "arguments"},
    }


def log_gate_outcome(entry: AuditEntry) -> None:
    """The gate hook for logs: one INFO event per outcome."""
    if event_logger.isEnabledFor(logging.INFO):
        call = f"{entry.tool}.{entry.action}" if entry.action else entry.tool
        event_logger.info("%s %s", call, entry.outcome, extra={"event": GATE_EVENT, **gate_event(entry)})


class JsonFormatter(logging.Formatter):
    """One JSON object per record; fields given with `extra=` become top-level keys."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": timestamp(datetime.fromtimestamp(record.created, UTC)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update({key: value for key, value in record.__dict__.items() if key not in _RESERVED})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure_logging(log_format: LogFormat) -> None:
    """`json`: every record as a JSON line on stderr, our own from INFO (the gate events), other
    libraries' from WARNING. `text`: left as it is (Python's defaults and uvicorn's own)."""
    if log_format != "json":
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("mcp_knecht").setLevel(logging.INFO)

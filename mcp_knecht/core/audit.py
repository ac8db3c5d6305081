"""Audit entries and the sink the gate writes them to (the store implements the sink)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol

import msgspec

from mcp_knecht.core.clock import timestamp

Outcome = Literal[
    "ran", "failed", "invalid", "denied", "staged", "forbidden",
    "approved", "approval_recorded", "rejected", "executed", "execution_failed", "settled", "expired", "tampered",
]


class AuditEntry(msgspec.Struct, frozen=True):
    """One row of the audit log: who did what, through which tool, and how it ended."""
    source: str
    subject: str
    client: str
    tool: str
    outcome: Outcome
    action: str | None = None
    rule: str | None = None
    proposal_id: int | None = None
    arguments_hash: str | None = None
    detail: dict[str, Any] = msgspec.field(default_factory=dict)
    duration_ms: float | None = None
    at: str = msgspec.field(default_factory=timestamp)


PendingEntry = Callable[[], AuditEntry]
"""An entry the sink builds when it writes it: the gate hands over what a call's entry is made of
(its moment and duration taken at once), and the labels, timestamp text and arguments hash are
worked out in the writer's batch instead of on the caller's path. Never raises."""

Observer = Callable[[AuditEntry], None]
"""Sees every gate outcome's audit entry after it is recorded (metrics, traces, log events); must
not block, and its failures never reach the caller."""


class AuditSink(Protocol):
    def record(self, entry: AuditEntry | PendingEntry) -> None:
        """Accept an entry (or one to build when written) without blocking the caller; durability
        is the sink's job."""
        ...

    def accepting(self) -> bool:
        """False while the sink cannot keep up (a busy store): new work should wait."""
        ...


class DurableAuditSink(AuditSink, Protocol):
    async def flush(self) -> None:
        """Make every recorded entry durable before returning."""
        ...

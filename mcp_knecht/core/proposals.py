"""Proposals: frozen calls, and the repository interface the store implements for them.

A proposal's status as every reader sees it is *effective*: a pending proposal whose expiry has
passed reads as `expired` on every path (get, list, statuses), whether or not a sweep has written
that yet. The repository (`mcp_knecht.store.proposals`) is the one place rows become proposals.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from mcp_knecht.core.actor import Actor

Status = Literal["pending", "approved", "executing", "succeeded", "failed", "rejected", "expired"]
STATUSES: tuple[Status, ...] = ("pending", "approved", "executing", "succeeded", "failed", "rejected", "expired")
OPEN: frozenset[str] = frozenset({"pending", "approved", "executing"})


@dataclass(frozen=True)
class Proposal:
    id: int
    tool: str
    action: str | None
    arguments_json: str
    arguments_hash: str
    proposer_subject: str
    proposer_client: str
    proposer_scopes: tuple[str, ...]
    rule: str
    preview: dict[str, Any] | None
    status: Status
    created_at: str
    expires_at: str
    decided_by: str | None = None
    decided_at: str | None = None
    reason: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    result: dict[str, Any] | None = None
    error: str | None = None
    arguments_shown: str | None = None
    """The arguments with secrets masked: what people see. `arguments_json` is what runs."""

    @property
    def arguments(self) -> dict[str, Any]:
        return json.loads(self.arguments_json)  # type: ignore[no-any-return]

    @property
    def shown_arguments(self) -> dict[str, Any]:
        shown: dict[str, Any] = json.loads(self.arguments_shown) if self.arguments_shown else self.arguments
        return shown

    @property
    def proposer(self) -> Actor:
        return Actor(self.proposer_subject, self.proposer_client, frozenset(self.proposer_scopes))

    @property
    def call_name(self) -> str:
        return f"{self.tool}.{self.action}" if self.action else self.tool

    @property
    def shown_status(self) -> str:
        """What an operator should read: a proposal left `executing` by a crash is not "running"."""
        return "executing (outcome unknown if the approver stopped)" if self.status == "executing" else self.status

    def public(self) -> dict[str, Any]:
        """The proposal as the proposer's agent sees it."""
        return {
            "id": self.id, "tool": self.tool, "action": self.action, "status": self.status,
            "arguments": self.shown_arguments, "arguments_hash": self.arguments_hash,
            "created_at": self.created_at, "expires_at": self.expires_at,
            "decided_by": self.decided_by, "decided_at": self.decided_at, "reason": self.reason,
            "finished_at": self.finished_at, "result": self.result, "error": self.error,
        }


@dataclass(frozen=True)
class NewProposal:
    tool: str
    action: str | None
    arguments_json: str
    arguments_hash: str
    arguments_shown: str
    proposer: Actor
    rule: str
    preview: dict[str, Any] | None
    created_at: str
    expires_at: str


class ProposalRepository(Protocol):
    """Persistence of proposals. Every transition is one conditional, atomic update; every read
    shows the effective status (an overdue pending proposal reads as `expired`)."""

    async def create(self, proposal: NewProposal) -> int: ...
    async def get(self, proposal_id: int) -> Proposal | None: ...
    async def list(self, *, status: str | None = None, subject: str | None = None,
                   limit: int = 100, after_id: int = 0, oldest_first: bool = False) -> builtins.list[Proposal]: ...
    async def expire_overdue(self, now: str) -> builtins.list[Proposal]:
        """Write `expired` on every overdue pending proposal; return those it changed."""
        ...
    async def claim(self, proposal_id: int, operator: str, now: str) -> bool:
        """pending (not expired, not the operator's own) → approved. True for exactly one caller."""
        ...
    async def reject(self, proposal_id: int, operator: str, reason: str, now: str) -> bool: ...
    async def start_execution(self, proposal_id: int, now: str) -> bool:
        """approved → executing."""
        ...
    async def finish(self, proposal_id: int, *, succeeded: bool, result_json: str | None,
                     error: str | None, now: str) -> bool:
        """executing → succeeded | failed."""
        ...
    async def statuses(self, ids: Sequence[int]) -> dict[int, tuple[str, str]]:
        """`id → (status, proposer subject)` for the ids that exist."""
        ...

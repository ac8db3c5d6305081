"""Staging: a call the policy sends for approval becomes a frozen, sealed, pending proposal."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Protocol

from mcp_knecht.core import clock
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.audit import AuditEntry
from mcp_knecht.core.gate import FrozenCall
from mcp_knecht.core.keys import ServerKeys
from mcp_knecht.core.proposals import NewProposal, ProposalRepository, preview_text
from mcp_knecht.core.scrub import Scrubber
from mcp_knecht.core.settings import DEFAULT_PROPOSAL_TTL
from mcp_knecht.core.tools import ToolContext


class _DataMasking(Protocol):
    def data(self, value: Any, keep: frozenset[str] = frozenset()) -> Any: ...


class ProposalStager:
    def __init__(
        self,
        proposals: ProposalRepository,
        keys: ServerKeys,
        *,
        ttl: timedelta = DEFAULT_PROPOSAL_TTL,
        scrub: _DataMasking | None = None,
    ) -> None:
        self._proposals = proposals
        self._keys = keys
        self._ttl = ttl
        self._scrub = scrub if scrub is not None else Scrubber()

    async def _preview(self, call: FrozenCall, actor: Actor) -> dict[str, Any] | None:
        """The current state, as the proposer may read it, masked value by value (operators read it)."""
        if call.tool.preview is None:
            return None
        preview = await call.tool.preview(call.arguments, ToolContext(actor=actor, source=call.source))
        if preview is None:
            return None
        masked: dict[str, Any] = self._scrub.data(preview)
        return masked

    async def stage(self, call: FrozenCall, actor: Actor, staged: AuditEntry) -> dict[str, Any]:
        preview = await self._preview(call, actor)
        now = clock.now()
        expires = clock.timestamp(now + self._ttl)
        proposal = NewProposal(
            tool=call.tool.name,
            action=call.action,
            arguments_json=call.arguments_json,
            arguments_hash=call.arguments_hash,
            arguments_shown=call.arguments_shown or call.arguments_json,
            proposer=actor,
            rule=call.decision.rule,
            preview_json=preview_text(preview),
            created_at=clock.timestamp(now),
            expires_at=expires,
            approvers=call.decision.approvers if call.decision.mode == "approve" else 1,
            policy_reason=call.decision.reason,
        )
        proposal_id, created = await self._proposals.create(
            proposal, staged, lambda new_id: self._keys.mac("seal", proposal.seal_text(new_id)))
        return {
            "id": proposal_id,
            "status": "pending",
            "created": created,
            "tool": call.tool.name,
            "action": call.action,
            "arguments_hash": call.arguments_hash,
            "expires_at": expires,
            **({"reason": call.decision.reason} if call.decision.reason else {}),
            **({"approvers": call.decision.approvers} if call.decision.approvers > 1 else {}),
            "next": f"A human decides; follow up with get_proposal(id={proposal_id}).",
        }

"""Deciding proposals: approve (then execute exactly once) or reject.

    approve(id)  pending ──claim──▶ approved ──▶ executing ──▶ succeeded | failed
    reject(id)   pending ──────────▶ rejected
    settle(id)                               executing ──▶ succeeded | failed   (by a person)

The claim is one conditional update: of racing operators exactly one wins, and only the winner
executes. Execution runs the frozen arguments (hash re-checked, re-validated) through the gate's
own execution path, as the proposer with the scopes it held, with no model involved. A crash
while executing leaves `executing`: nothing here ever picks it up again. An operator who has
checked the effect by hand may `settle` it — record the outcome; nothing runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta

from mcp_knecht.core import clock
from mcp_knecht.core.audit import AuditEntry, DurableAuditSink
from mcp_knecht.core.canonical import sha256_hex
from mcp_knecht.core.gate import Gate
from mcp_knecht.core.proposals import Proposal, ProposalRepository
from mcp_knecht.core.tools import APPROVAL
from mcp_knecht.core.validation import validate_arguments
from mcp_knecht.errors import (
    DecisionError,
    HashMismatchError,
    InvalidArgumentsError,
    NotPendingError,
    SelfApprovalError,
    UsageError,
)

MIN_EXPECTED_HASH = 8
SETTLE_AFTER = timedelta(minutes=5)
"""An execution younger than this may still be running: settling it needs `force`."""


@dataclass(frozen=True)
class Operator:
    name: str
    client: str = "knecht-approve"


class ApprovalService:
    def __init__(self, proposals: ProposalRepository, gate: Gate, audit: DurableAuditSink) -> None:
        self._proposals = proposals
        self._gate = gate
        self._audit = audit

    async def _current(self, proposal_id: int) -> Proposal:
        proposal = await self._proposals.get(proposal_id)
        if proposal is None:
            raise NotPendingError(f"Proposal #{proposal_id} does not exist.")
        return proposal

    @staticmethod
    def _not_pending(proposal: Proposal) -> NotPendingError:
        if proposal.status == "expired":
            return NotPendingError(f"Proposal #{proposal.id} expired at {proposal.expires_at}; it cannot be decided.")
        who = f" by {proposal.decided_by} at {proposal.decided_at}" if proposal.decided_by else ""
        return NotPendingError(f"Proposal #{proposal.id} is not pending any more: {proposal.shown_status}{who}.")

    def _record(self, operator: Operator, proposal: Proposal, outcome: str, **detail: object) -> None:
        self._audit.record(AuditEntry(
            source="approval", subject=operator.name, client=operator.client, tool=proposal.tool,
            action=proposal.action, outcome=outcome,  # type: ignore[arg-type]
            rule=proposal.rule, proposal_id=proposal.id, arguments_hash=proposal.arguments_hash,
            detail={"proposer": proposal.proposer_subject, **detail},
        ))

    async def approve(self, proposal_id: int, operator: Operator, *, expect_hash: str | None = None) -> Proposal:
        proposal = await self._current(proposal_id)
        if proposal.status != "pending":
            raise self._not_pending(proposal)
        if proposal.proposer_subject == operator.name:
            raise SelfApprovalError(
                f"Proposal #{proposal_id} was proposed by {operator.name}; another operator must approve it."
            )
        if expect_hash is not None:
            expected = expect_hash.strip().lower()
            if len(expected) < MIN_EXPECTED_HASH:
                raise UsageError(f"--expect-hash needs at least {MIN_EXPECTED_HASH} hex digits of the hash.")
            if not proposal.arguments_hash.startswith(expected):
                raise HashMismatchError(
                    f"Proposal #{proposal_id} has hash {proposal.arguments_hash[:16]}…, not {expected}…; "
                    "look at it again with `knecht-approve show`."
                )
        if not await self._proposals.claim(proposal_id, operator.name, clock.timestamp()):
            raise self._not_pending(await self._current(proposal_id))
        self._record(operator, proposal, "approved")
        await self._audit.flush()  # the decision is on record before anything runs
        return await self._execute(proposal_id, operator)

    async def reject(self, proposal_id: int, operator: Operator, reason: str) -> Proposal:
        if not reason.strip():
            raise UsageError("A rejection needs a reason (--reason TEXT): the agent learns from it.")
        proposal = await self._current(proposal_id)
        if not await self._proposals.reject(proposal_id, operator.name, reason.strip(), clock.timestamp()):
            raise self._not_pending(await self._current(proposal_id))
        self._record(operator, proposal, "rejected", reason=reason.strip())
        await self._audit.flush()
        return await self._current(proposal_id)

    async def settle(self, proposal_id: int, operator: Operator, *, succeeded: bool, note: str,
                     force: bool = False) -> Proposal:
        """Record the outcome of an execution whose approver stopped ("outcome unknown")."""
        if not note.strip():
            raise UsageError("Settling needs --reason: say what you checked.")
        proposal = await self._current(proposal_id)
        if proposal.status != "executing":
            raise DecisionError(
                f"Proposal #{proposal_id} is {proposal.shown_status}; only an execution whose outcome is unknown "
                "can be settled."
            )
        started = clock.parse(proposal.started_at or proposal.created_at)
        if not force and clock.now() - started < SETTLE_AFTER:
            raise DecisionError(
                f"Proposal #{proposal_id} started executing at {proposal.started_at}; its approver may still be "
                "running. Check the effect, then settle it with --force (or wait)."
            )
        settled = {"settled_by": operator.name, "note": note.strip()}
        if not await self._proposals.finish(
            proposal_id, succeeded=succeeded, now=clock.timestamp(),
            result_json=json.dumps(settled, ensure_ascii=False) if succeeded else None,
            error=None if succeeded else f"Settled as failed by {operator.name}: {note.strip()}",
        ):
            raise self._not_pending(await self._current(proposal_id))
        self._record(operator, proposal, "settled", settled_as="succeeded" if succeeded else "failed",
                     note=note.strip())
        await self._audit.flush()
        return await self._current(proposal_id)

    async def _execute(self, proposal_id: int, operator: Operator) -> Proposal:
        if not await self._proposals.start_execution(proposal_id, clock.timestamp()):
            raise self._not_pending(await self._current(proposal_id))
        proposal = await self._current(proposal_id)
        succeeded, result_json, error = await self._run(proposal)
        await self._proposals.finish(
            proposal_id, succeeded=succeeded, result_json=result_json, error=error, now=clock.timestamp()
        )
        self._record(operator, proposal, "executed" if succeeded else "execution_failed",
                     **({"error": error} if error else {}))
        await self._audit.flush()
        return await self._current(proposal_id)

    async def _run(self, proposal: Proposal) -> tuple[bool, str | None, str | None]:
        if sha256_hex(proposal.arguments_json) != proposal.arguments_hash:
            return False, None, "The stored arguments do not match their hash; refusing to run a changed call."
        tool = self._gate.registry.get(proposal.tool)
        if tool is None:
            return False, None, f"Tool {proposal.tool} is no longer served by this installation."
        if not proposal.proposer.holds(needed := tool.scope_of(proposal.action)):
            return False, None, f"The proposer did not hold scope {needed}."
        if self._gate.policy().decide(tool, proposal.action).mode == "deny":
            return False, None, f"{proposal.call_name} has been denied by policy since it was proposed."
        try:
            arguments = validate_arguments(tool.name, tool.input_model, proposal.arguments)
        except InvalidArgumentsError as exc:
            return False, None, exc.message
        result = await self._gate.execute(proposal.proposer, tool, arguments, source=APPROVAL)
        result_json = json.dumps(result.data, ensure_ascii=False) if result.data is not None else None
        return (not result.is_error), result_json, (result.text if result.is_error else None)

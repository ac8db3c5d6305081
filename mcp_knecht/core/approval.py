"""Deciding proposals: approve (then execute exactly once), reject, settle, expire.

    approve(id)  pending ──claim──▶ approved + executing ──▶ succeeded | failed   (one commit, then one)
                 pending ──record──▶ pending        (an approval short of the quorum)
    reject(id)   pending ──────────▶ rejected
    expire_due()  pending ─────────▶ expired                        (by the server's clock)
    settle(id)                               executing ──▶ succeeded | failed   (by a person)

A proposal needs `approvers` distinct operators (1 unless the rule that staged it asks for more;
never the proposer). Each approval is recorded and sealed; the one that completes the quorum claims
the proposal in the same transaction, with one conditional update: of racing operators exactly one
wins, and only the winner executes; a proposal claimed once is not claimed again when its row is
written back to pending (`store.quorum` says how far that holds). One operator rejecting is enough.
Each transition commits together with its audit row. Before a proposal is shown or approved its seal (and each of its
approvals' seals) is checked — a server-keyed MAC over everything that decides what runs and who
must approve it — so a row rewritten in the database is refused (and the refusal audited), never
run. The claim compares the row it changes with that checked proposal, inside its transaction, and
execution runs the checked proposal: what runs is what the operator approved, whatever is written
into the row afterwards. Execution runs the frozen arguments (re-validated) through the gate's own
execution path, as the proposer with the scopes it held, with no model involved.

Racing approvals of one proposal wait for its turn (`ProposalRepository.turn`), outside any
transaction; one that had to wait and finds the proposal decided, or comes late, is answered from
its status alone (one short row: the seal covers what would run, never the status). A crash while
executing leaves `executing`: nothing here ever picks it up again. An operator who has checked the
effect by hand may `settle` it.

Who decides is an `Operator`: verified (from an operator token: the API, `--server`, or
`KNECHT_OPERATOR_TOKEN`) or local (the name a local CLI user gave, recorded as `local:NAME`).
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import anyio
import msgspec
from msgspec.structs import replace

from mcp_knecht.core import clock
from mcp_knecht.core.audit import AuditEntry, DurableAuditSink, Outcome
from mcp_knecht.core.gate import Gate, GateResult
from mcp_knecht.core.keys import ServerKeys
from mcp_knecht.core.proposals import (
    Approval,
    Proposal,
    ProposalRepository,
    ProposalState,
    QuorumResult,
    person,
    same_person,
)
from mcp_knecht.core.tools import APPROVAL
from mcp_knecht.core.validation import label, validate_arguments
from mcp_knecht.errors import (
    AlreadyApprovedError,
    DecisionError,
    HashMismatchError,
    InvalidArgumentsError,
    NotPendingError,
    SelfApprovalError,
    StoreBusyError,
    StoreError,
    StoreInterruptedError,
    TamperedError,
    UnknownProposalError,
    UsageError,
)

MIN_EXPECTED_HASH = 8
SETTLE_AFTER = timedelta(minutes=5)
"""An execution younger than this may still be running: settling it needs `force`."""
FINISH_ATTEMPTS = 4
"""Tries at recording an execution's outcome while the store fails: busy (another process holding its write
lock past the busy timeout, each try waiting that long), or the transaction undone under it (PostgreSQL
ended its session, or restarted). The call has run; given up, its outcome would read "unknown" until a
person settles it."""
FINISH_PAUSE = 0.25
"""Seconds before the second try after a failure that is not "busy" (twice that before the third, …)."""


class Operator(msgspec.Struct, frozen=True):
    """Who decides: a verified token subject or a local name, as `decided_by` records it (`recorded_as`)."""
    name: str
    client: str = "knecht-approve"
    verified: bool = False
    """True when `name` is the subject of a verified operator token."""

    @property
    def recorded_as(self) -> str:
        """What `decided_by` says: the verified subject, or `local:NAME` for a name nobody checked."""
        return self.name if self.verified else f"local:{self.name}"


class ApprovalService:
    def __init__(self, proposals: ProposalRepository, gate: Gate, audit: DurableAuditSink, keys: ServerKeys) -> None:
        self._proposals = proposals
        self._gate = gate
        self._audit = audit
        self._keys = keys

    # --- reading, with the seal checked --------------------------------------------------------------

    def seal_holds(self, proposal: Proposal) -> bool:
        return (any(self._keys.verify("seal", text, proposal.seal) for text in proposal.seal_texts())
                and self._keys.verify("arguments", proposal.arguments_json, proposal.arguments_hash)
                and all(self._approval_holds(proposal.id, proposal.seal, a) for a in proposal.approvals))

    def _approval_holds(self, proposal_id: int, proposal_seal: str | None, approval: Approval) -> bool:
        return self._keys.verify("approval", approval.seal_text(proposal_id, proposal_seal), approval.seal)

    async def checked(self, proposal_id: int, reader: str = "knecht-approve") -> Proposal:
        """The proposal, refused (and the refusal audited) when its row fails its seal."""
        return await self._check(await self._proposals.get(proposal_id), proposal_id, reader)

    async def _check(self, proposal: Proposal | None, proposal_id: int, reader: str = "knecht-approve") -> Proposal:
        if proposal is None:
            raise UnknownProposalError(f"Proposal #{proposal_id} does not exist.")
        if proposal.seal is not None and not self.seal_holds(proposal):
            raise await self._tampered(Operator(reader), proposal, "seal broken")
        return proposal

    async def _tampered(self, operator: Operator, proposal: Proposal, problem: str,
                        told: str | None = None) -> TamperedError:
        """The refusal of a row changed outside mcp-knecht, audited before it is told."""
        self._record(operator, proposal, "tampered", problem=problem)
        await self._audit.flush()
        return TamperedError(
            told or f"Proposal #{proposal.id} fails its seal: its row was changed outside mcp-knecht (arguments, "
            "tool, proposer, scopes, quorum, preview or an approval). It will not be shown or run; check the "
            "database and `mcp-knecht audit verify`.")

    @staticmethod
    def _not_pending(proposal: ProposalState | None, proposal_id: int | None = None) -> NotPendingError:
        if proposal is None:
            return UnknownProposalError(f"Proposal #{proposal_id} does not exist.")
        if proposal.status == "expired":
            return NotPendingError(f"Proposal #{proposal.id} expired at {proposal.expires_at}; it cannot be decided.")
        who = f" by {proposal.decided_by} at {proposal.decided_at}" if proposal.decided_by else ""
        return NotPendingError(f"Proposal #{proposal.id} is not pending any more: {proposal.shown_status}{who}.",
                               details={"status": proposal.status, "decided_by": proposal.decided_by})

    def _entry(self, operator: Operator, proposal: Proposal, outcome: Outcome, **detail: Any) -> AuditEntry:
        return AuditEntry(
            source="approval", subject=operator.recorded_as, client=operator.client, tool=proposal.tool,
            action=proposal.action, outcome=outcome, rule=proposal.rule, proposal_id=proposal.id,
            arguments_hash=proposal.arguments_hash, detail={"proposer": proposal.proposer_subject, **detail},
        )

    def _record(self, operator: Operator, proposal: Proposal, outcome: Outcome, **detail: Any) -> None:
        self._audit.record(self._entry(operator, proposal, outcome, **detail))

    # --- decisions -----------------------------------------------------------------------------------

    async def approve(self, proposal_id: int, operator: Operator, *, expect_hash: str | None = None) -> Proposal:
        # An operator who comes late, or finds the proposal settled by the turn before, is told from its
        # status alone, without the seal check (the seal covers what would run, never the status).
        async with self._proposals.turn(proposal_id) as turn:
            if not turn.ours:
                raise self._not_pending(turn.state, proposal_id)
            # What the turn read is as good as a read now: the claim's transaction checks the row again.
            proposal = await (self._check(turn.proposal, proposal_id) if turn.proposal is not None
                              else self.checked(proposal_id))
            result = await self._approve(proposal, operator, expect_hash)
        if result.outcome == "claimed" and result.claimed is not None:
            return await self._execute(result.claimed, operator)
        if result.outcome == "recorded":
            # As this approval left it: a read now could already show another operator's claim and
            # tell this one "approved and executed" although it only counted toward the quorum.
            return replace(proposal, approvals=result.approvals)
        if result.outcome == "changed":
            raise await self._tampered(operator, proposal, "row changed before its claim")
        if result.outcome == "claimed_before":
            raise await self._tampered(
                operator, proposal, "claimed before, status written back to pending",
                f"Proposal #{proposal_id} was approved and run before: its row was written back to pending outside "
                "mcp-knecht. It will not run again; check the database and `mcp-knecht audit verify`.")
        if result.outcome == "rejected_before":
            raise await self._tampered(
                operator, proposal, "rejected before, status written back to pending",
                f"Proposal #{proposal_id} was rejected before: its row was written back to pending outside "
                "mcp-knecht. It will not run; check the database and `mcp-knecht audit verify`.")
        if result.outcome == "duplicate":
            current = await self.checked(proposal_id)
            raise AlreadyApprovedError(f"You approved proposal #{proposal_id} already ({current.quorum}).")
        raise self._not_pending(result.state, proposal_id)

    async def _approve(self, proposal: Proposal, operator: Operator, expect_hash: str | None) -> QuorumResult:
        """Record this operator's approval of `proposal` (in its turn), which claims it if it completes the
        quorum; refused before anything is written when this operator may not approve it."""
        proposal_id = proposal.id
        if proposal.status != "pending":
            raise self._not_pending(proposal.state)
        if proposal.seal is None:
            raise DecisionError(
                f"Proposal #{proposal_id} was staged by an older release, before proposals were sealed; it cannot "
                "be approved. Reject it and have the call proposed again."
            )
        if same_person(proposal.proposer_subject, operator.name):
            raise SelfApprovalError(
                f"Proposal #{proposal_id} was proposed by {proposal.proposer_subject}; another operator must "
                "approve it."
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
        if any(approval.person == person(operator.name) for approval in proposal.approvals):
            raise AlreadyApprovedError(
                f"You approved proposal #{proposal_id} already ({proposal.quorum}); another operator must approve "
                "it too.")

        def audit(counted: tuple[Approval, ...], completes: bool) -> AuditEntry:
            return self._entry(operator, proposal, "approved" if completes else "approval_recorded",
                               approvals=[a.operator for a in counted], approvers=proposal.approvers)

        return await self._proposals.add_approval(
            proposal_id, self._approval(proposal, operator), required=proposal.approvers,
            counts=lambda a: self._approval_holds(proposal.id, proposal.seal, a), audit=audit, approved_as=proposal,
        )

    def _approval(self, proposal: Proposal, operator: Operator) -> Approval:
        unsealed = Approval(operator.recorded_as, person(operator.name), clock.timestamp(), "")
        seal = self._keys.mac("approval", unsealed.seal_text(proposal.id, proposal.seal))
        return Approval(unsealed.operator, unsealed.person, unsealed.approved_at, seal)

    async def reject(self, proposal_id: int, operator: Operator, reason: str) -> Proposal:
        if not reason.strip():
            raise UsageError("A rejection needs a reason (--reason TEXT): the agent learns from it.")
        proposal = await self.checked(proposal_id)
        if not await self._proposals.reject(proposal_id, operator.recorded_as, reason.strip(), clock.timestamp(),
                                            self._entry(operator, proposal, "rejected", reason=reason.strip())):
            raise self._not_pending((await self.checked(proposal_id)).state)
        return await self.checked(proposal_id)

    async def settle(self, proposal_id: int, operator: Operator, *, succeeded: bool, note: str,
                     force: bool = False) -> Proposal:
        """Record the outcome of an execution whose approver stopped ("outcome unknown")."""
        if not note.strip():
            raise UsageError("Settling needs --reason: say what you checked.")
        proposal = await self.checked(proposal_id)
        if proposal.status != "executing":
            raise DecisionError(
                f"Proposal #{proposal_id} is {proposal.shown_status}; only an execution whose outcome is unknown "
                "can be settled."
            )
        start = proposal.started_at or proposal.created_at
        started = clock.readable(start)
        if not force and started is None:  # written around the store: how long it has run cannot be told
            raise DecisionError(
                f"Proposal #{proposal_id} has a start time that is no timestamp ({label(repr(start))}): "
                "its row was changed outside mcp-knecht, and how long its approver has run cannot be told. Check "
                "the effect, then settle it with --force."
            )
        if not force and started is not None and clock.now() - started < SETTLE_AFTER:
            raise DecisionError(
                f"Proposal #{proposal_id} started executing at {proposal.started_at}; its approver may still be "
                "running. Check the effect, then settle it with --force (or wait)."
            )
        settled = {"settled_by": operator.recorded_as, "note": note.strip()}
        entry = self._entry(operator, proposal, "settled", settled_as="succeeded" if succeeded else "failed",
                            note=note.strip())
        if not await self._proposals.finish(
            proposal_id, succeeded=succeeded, now=clock.timestamp(), audit=entry,
            result_json=json.dumps(settled, ensure_ascii=False) if succeeded else None,
            error=None if succeeded else f"Settled as failed by {operator.recorded_as}: {note.strip()}",
        ):
            raise self._not_pending((await self.checked(proposal_id)).state)
        return await self.checked(proposal_id)

    async def expire_due(self) -> list[Proposal]:
        """Write `expired` (audited) on every pending proposal whose time has passed."""
        system = Operator("mcp-knecht", client="expiry", verified=True)
        return await self._proposals.expire_overdue(
            clock.timestamp(), lambda p: self._entry(system, p, "expired", expires_at=p.expires_at))

    # --- execution -----------------------------------------------------------------------------------

    async def _execute(self, proposal: Proposal, operator: Operator) -> Proposal:
        """Run a proposal this operator's approval claimed, as the claim left it (`executing`): the row the
        claim changed was the very proposal the operator approved (`Proposal.sealed`), and what runs is
        that, whatever is written into the row afterwards. Then record the outcome (tried again while the store
        fails: `FINISH_ATTEMPTS`)."""
        succeeded, result_json, error = await self._run(proposal)
        outcome: Outcome = "executed" if succeeded else "execution_failed"
        audit = self._entry(operator, proposal, outcome, **({"error": error} if error else {}))
        for attempt in range(1, FINISH_ATTEMPTS + 1):
            try:
                finished = await self._proposals.finish(
                    proposal.id, succeeded=succeeded, result_json=result_json, error=error, now=clock.timestamp(),
                    audit=audit, approvals=proposal.approvals,
                )
                break
            except StoreError as exc:
                # Busy, or its transaction undone under it (a session the server ended, a restart): the outcome
                # is known, and the finish changes only an `executing` row, so trying again is safe.
                busy = isinstance(exc, StoreBusyError)
                if attempt == FINISH_ATTEMPTS:
                    ended = "succeeded" if succeeded else "failed"
                    why = (f"the store stayed busy through {FINISH_ATTEMPTS} tries" if busy
                           else f"the store failed {FINISH_ATTEMPTS} tries (the last: {exc.message})")
                    raise (StoreBusyError if busy else StoreError)(
                        f"Proposal #{proposal.id} was executed ({ended}), but its outcome could not be recorded: "
                        f"{why}. It shows as executing (outcome unknown); once the store is free, record it with "
                        f"`knecht-approve settle {proposal.id} --outcome {ended} --reason TEXT --force`.") from None
                if not busy:  # a busy try has waited the busy timeout already
                    await anyio.sleep(FINISH_PAUSE * attempt)
        if finished is None:  # settled meanwhile by someone who thought this approver gone
            return await self.checked(proposal.id)
        return finished

    async def _run(self, proposal: Proposal) -> tuple[bool, str | None, str | None]:
        tool = self._gate.registry.get(proposal.tool)
        if tool is None:
            return False, None, f"Tool {proposal.tool} is no longer served by this installation."
        proposer = proposal.proposer
        if not proposer.holds(needed := tool.scope_of(proposal.action)):
            return False, None, f"The proposer did not hold scope {needed}."
        try:
            arguments = validate_arguments(tool.name, tool.input_model, proposal.arguments)
        except InvalidArgumentsError as exc:
            return False, None, exc.message
        decision = await self._gate.decide(proposer, tool, proposal.action, arguments, source=APPROVAL)
        if isinstance(decision, GateResult):
            return False, None, decision.text
        if decision.mode == "deny":
            return False, None, f"{proposal.call_name} has been denied by policy since it was proposed."
        result = await self._gate.execute(proposer, tool, arguments, source=APPROVAL)
        result_json = json.dumps(result.data, ensure_ascii=False) if result.data is not None else None
        if result.is_error and result.error_code in (StoreBusyError.code, StoreInterruptedError.code):
            # Its "retry" cannot mean approving again: this proposal is decided now, as failed (its effect
            # wrote nothing: the store refused or undid it).
            return False, result_json, (f"{result.text} This approved call failed with it: to run it, propose "
                                        "it again.")
        return (not result.is_error), result_json, (result.text if result.is_error else None)

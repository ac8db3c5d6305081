"""Approvals in SQL: the two-person rule (and its one-person case).

    add_approval(id, approval)           in one durable transaction (the approval service waits for the
                                          proposal's turn first: `ProposalRepository.turn`):
      lock `proposal:<id>`                every approval of this proposal, on every replica, queues here
      read it with its approvals          (each statement after the lock sees what the previous holder committed);
        and whether it was approved       no longer pending → `not_pending` at once, nothing written
      insert this one, and in the same    at most one per person (also a UNIQUE key);
        statement (`tx.fetch_all_with`)   on PostgreSQL one round trip for both
      the quorum complete?  yes → UPDATE … SET status = 'executing' WHERE id = ? AND status = 'pending' …
                            no  → UPDATE … SET status = status   WHERE id = ? AND status = 'pending' …
      the UPDATE changed no row → roll back: `not_pending` (rejected, expired, claimed meanwhile)
      the audit row                        `approved` or `approval_recorded`, committed with it
      a claimed row unlike the proposal the operator approved (`approved` answers None) → roll back: `changed`

A proposal claimed once is never claimed again, even when someone with write access to the database
writes its row back to `pending` (the seal covers what would run, not the status): the claim is refused
(`claimed_before`, nothing written) when the approvals recorded before this one already complete the
quorum, or when the audit log holds an `approved` row for it. To get past both, the writer must delete
the approvals and that audit row, which breaks the audit chain (`mcp-knecht audit verify` names it).
A rejection is as final: a proposal whose `rejected` row the audit log holds is not approved again
(`rejected_before`, nothing written) when its row is written back to pending.

Both UPDATEs are conditional on the proposal still being pending, so an approval never lands on a
proposal a rejection or expiry committed first (on PostgreSQL the UPDATE waits for such a writer's row
lock and then re-checks). Of any number of racing operators, the ones before the quorum record, the
one that completes it claims — exactly one — and the ones after find it no longer pending. The claim
goes straight to `executing` (approved and started in one commit): the one durable write a decision
costs, after which the proposal can never run again, even after a power loss.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from mcp_knecht.core.audit import AuditEntry
from mcp_knecht.core.clock import stored, timestamp
from mcp_knecht.core.database import Database, Row, Transaction, by_keys
from mcp_knecht.core.proposals import Approval, Proposal, ProposalState, QuorumResult
from mcp_knecht.store.audit_log import AuditChain
from mcp_knecht.store.written_around import as_text


class _NotPending(Exception):
    """Rolls the transaction back: the proposal was not pending when this approval came to count."""

    def __init__(self, state: ProposalState | None = None) -> None:
        super().__init__()
        self.state = state


class _Changed(Exception):
    """Rolls the claim back: the row is not the proposal the operator approved."""


class _ClaimedBefore(Exception):
    """Rolls the approval back: the proposal was claimed once already, and its row was written back to pending."""


class _RejectedBefore(Exception):
    """Rolls the approval back: the proposal was rejected, and its row was written back to pending."""


def approval(row: Row, prefix: str = "") -> Approval:
    row = as_text(row)
    return Approval(operator=row[f"{prefix}operator"], person=row[f"{prefix}person"],
                    approved_at=row[f"{prefix}approved_at"], seal=row[f"{prefix}seal"])


_STATE = "SELECT id, status, expires_at, decided_by, decided_at FROM proposals WHERE id = ?"
# What a claim reads, in its transaction: the proposal's state, its approvals, and whether it was approved
# or rejected before (`decided_as`: 'approved' wins, being the smaller). `l.outcome || ''`: an expression no
# index covers, so the planner reads the proposal's few audit rows (`audit_by_proposal`). On `l.outcome`
# itself, an aggregate tempts it to walk every `approved` row of the log in id order (`audit_by_outcome`)
# until one is this proposal's: a decision that grew with the log.
CLAIM_READ = (
    "SELECT p.status, p.expires_at, p.decided_by, p.decided_at, a.operator, a.person, a.approved_at, a.seal,"
    " (SELECT MIN(l.outcome || '') FROM audit_log l WHERE l.proposal_id = p.id"
    "  AND l.outcome || '' IN ('approved', 'rejected')) AS decided_as"
    " FROM proposals p LEFT JOIN proposal_approvals a ON a.proposal_id = p.id WHERE p.id = ? ORDER BY a.id"
)


def proposal_state(row: Row, now: str) -> ProposalState:
    """The state of a row with `id, status, expires_at, decided_by, decided_at`; pending past its expiry
    reads as expired."""
    expires_at = stored(row["expires_at"])
    status = "expired" if row["status"] == "pending" and expires_at <= now else row["status"]
    return ProposalState(row["id"], status, expires_at, row["decided_by"], row["decided_at"])  # type: ignore[arg-type]


async def read_state(db: Database, proposal_id: int) -> ProposalState | None:
    rows = await db.lookup(_STATE, (proposal_id,))
    return proposal_state(rows[0], timestamp()) if rows else None


async def add_approval(
    db: Database, chain: AuditChain, proposal_id: int, new: Approval, *, required: int,
    counts: Callable[[Approval], bool], audit: Callable[[tuple[Approval, ...], bool], AuditEntry],
    approved: Callable[[Transaction, Row, tuple[Approval, ...]], Awaitable[Proposal | None]] | None = None,
) -> QuorumResult:
    """`approved(tx, row, approvals)`: awaited in the transaction that completes the quorum, with the
    proposal's row and the approvals that complete it; the proposal it answers is the claim's (None: the
    row is not what was approved — rolled back)."""
    claimed: Proposal | None = None
    counted: tuple[Approval, ...] = ()
    try:
        async with db.transaction(durable=True) as tx:
            await tx.lock(f"proposal:{proposal_id}")
            rows = await tx.fetch_all(CLAIM_READ, (proposal_id,))
            if not rows:
                raise _NotPending()
            if rows[0]["status"] != "pending" or stored(rows[0]["expires_at"]) <= new.approved_at:
                raise _NotPending(proposal_state({**rows[0], "id": proposal_id}, new.approved_at))
            earlier = [approval(row) for row in rows if row["person"] is not None]
            if any(a.person == new.person for a in earlier):
                return QuorumResult("duplicate")
            counted_before = [a for a in earlier if counts(a)]
            if rows[0]["decided_as"] == "approved" or len({a.person for a in counted_before}) >= required:
                raise _ClaimedBefore
            if rows[0]["decided_as"] == "rejected":
                raise _RejectedBefore
            # The approval and the UPDATE in one statement (where the store can): neither reads the other's table.
            insert = ("INSERT INTO proposal_approvals (proposal_id, operator, person, approved_at, seal)"
                      " VALUES (?, ?, ?, ?, ?)", (proposal_id, new.operator, new.person, new.approved_at, new.seal))
            counted = (*counted_before, new)
            completes = len({a.person for a in counted}) >= required
            pending = "WHERE id = ? AND status = 'pending' AND expires_at > ? AND proposer_subject <> ?"
            params: tuple[Any, ...] = (proposal_id, new.approved_at, new.operator)
            if completes:
                rows = await tx.fetch_all_with([insert], (
                    "UPDATE proposals SET status = 'executing', decided_by = ?, decided_at = ?, started_at = ?"
                    f" {pending} RETURNING *"), (new.operator, new.approved_at, new.approved_at, *params))
                changed = len(rows)
                if changed == 1 and approved is not None and (claimed := await approved(tx, rows[0], counted)) is None:
                    raise _Changed
            else:  # changes nothing, but only while pending, and holds the row until this commits
                changed = len(await tx.fetch_all_with(
                    [insert], f"UPDATE proposals SET status = status {pending} RETURNING id", params))
            if changed != 1:
                raise _NotPending(await read_state(db, proposal_id))
            await chain.append(tx, [audit(counted, completes)])
    except _NotPending as exc:
        return QuorumResult("not_pending", state=exc.state)
    except _Changed:
        return QuorumResult("changed")
    except _ClaimedBefore:
        return QuorumResult("claimed_before")
    except _RejectedBefore:
        return QuorumResult("rejected_before")
    if not completes:
        return QuorumResult("recorded", approvals=counted)
    return QuorumResult("claimed", claimed=claimed, approvals=counted)


async def approvals_of(db: Database, ids: Sequence[int]) -> dict[int, tuple[Approval, ...]]:
    """The approvals of each proposal in `ids`, oldest first."""
    found: dict[int, list[Approval]] = {}
    for start in range(0, len(ids), 500):
        source, match, params = by_keys(db.dialect, "proposal_approvals a", "a.proposal_id", ids[start:start + 500])
        rows = await db.fetch_all(f"SELECT a.* FROM {source} WHERE {match} ORDER BY a.id", params)
        for row in rows:
            found.setdefault(int(row["proposal_id"]), []).append(approval(row))
    return {proposal_id: tuple(found.get(proposal_id, ())) for proposal_id in ids}

"""Approvals in SQL: the two-person rule (and its one-person case).

    add_approval(id, approval)           in one durable transaction:
      lock `proposal:<id>`                every approval of this proposal, on every replica, queues here
      read it with its approvals          (each statement after the lock sees what the previous holder committed);
                                          no longer pending → `not_pending` at once, nothing written
      insert this one                     at most one per person (also a UNIQUE key)
      the quorum complete?  yes → UPDATE … SET status = 'executing' WHERE id = ? AND status = 'pending' …
                            no  → UPDATE … SET status = status   WHERE id = ? AND status = 'pending' …
      the UPDATE changed no row → roll back: `not_pending` (rejected, expired, claimed meanwhile)
      the audit row                        `approved` or `approval_recorded`, committed with it

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
from mcp_knecht.core.database import Database, Row, Transaction
from mcp_knecht.core.proposals import Approval, QuorumOutcome
from mcp_knecht.store.audit_log import AuditChain


class _NotPending(Exception):
    """Rolls the transaction back: the proposal was not pending when this approval came to count."""


def approval(row: Row, prefix: str = "") -> Approval:
    return Approval(operator=row[f"{prefix}operator"], person=row[f"{prefix}person"],
                    approved_at=row[f"{prefix}approved_at"], seal=row[f"{prefix}seal"])


async def add_approval(
    db: Database, chain: AuditChain, proposal_id: int, new: Approval, *, required: int,
    counts: Callable[[Approval], bool], audit: Callable[[tuple[Approval, ...], bool], AuditEntry],
    approved: Callable[[Transaction, Row], Awaitable[object]] | None = None,
) -> QuorumOutcome:
    """`approved(tx, row)`: awaited in the transaction that completes the quorum, with the proposal's row."""
    try:
        async with db.transaction(durable=True) as tx:
            await tx.lock(f"proposal:{proposal_id}")
            rows = await tx.fetch_all(
                "SELECT p.status, p.expires_at, a.operator, a.person, a.approved_at, a.seal FROM proposals p"
                " LEFT JOIN proposal_approvals a ON a.proposal_id = p.id WHERE p.id = ? ORDER BY a.id", (proposal_id,))
            if not rows or rows[0]["status"] != "pending" or rows[0]["expires_at"] <= new.approved_at:
                raise _NotPending  # decided (or expired) before this approval's turn: nothing written
            earlier = [approval(row) for row in rows if row["person"] is not None]
            if any(a.person == new.person for a in earlier):
                return "duplicate"
            await tx.execute(
                "INSERT INTO proposal_approvals (proposal_id, operator, person, approved_at, seal)"
                " VALUES (?, ?, ?, ?, ?)",
                (proposal_id, new.operator, new.person, new.approved_at, new.seal),
            )
            counted = (*(a for a in earlier if counts(a)), new)
            completes = len({a.person for a in counted}) >= required
            pending = "WHERE id = ? AND status = 'pending' AND expires_at > ? AND proposer_subject <> ?"
            params: tuple[Any, ...] = (proposal_id, new.approved_at, new.operator)
            if completes:
                claimed = await tx.fetch_all(
                    "UPDATE proposals SET status = 'executing', decided_by = ?, decided_at = ?, started_at = ?"
                    f" {pending} RETURNING *", (new.operator, new.approved_at, new.approved_at, *params))
                changed = len(claimed)
                if changed == 1 and approved is not None:
                    await approved(tx, claimed[0])
            else:  # changes nothing, but only while pending, and holds the row until this commits
                changed = await tx.execute(f"UPDATE proposals SET status = status {pending}", params)
            if changed != 1:
                raise _NotPending
            await chain.append(tx, [audit(counted, completes)])
    except _NotPending:
        return "not_pending"
    return "claimed" if completes else "recorded"


async def approvals_of(db: Database, ids: Sequence[int]) -> dict[int, tuple[Approval, ...]]:
    """The approvals of each proposal in `ids`, oldest first."""
    found: dict[int, list[Approval]] = {}
    for start in range(0, len(ids), 500):
        chunk = list(ids[start:start + 500])
        rows = await db.fetch_all(
            f"SELECT * FROM proposal_approvals WHERE proposal_id IN ({', '.join('?' * len(chunk))}) ORDER BY id",
            chunk)
        for row in rows:
            found.setdefault(int(row["proposal_id"]), []).append(approval(row))
    return {proposal_id: tuple(found.get(proposal_id, ())) for proposal_id in ids}

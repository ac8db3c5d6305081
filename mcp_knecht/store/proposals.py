"""Proposals in SQL: the one place rows become `Proposal`s and back.

Each state change is a single `UPDATE … WHERE status = <expected>`, so of any number of racing
processes (or replicas) exactly one sees a row change — and it commits, in the same `durable`
transaction, the audit row that records it: no proposal without its `staged` row, no decision
without its row. Every read applies expiry: a pending row whose `expires_at` has passed reads as
`expired`, on every path.

`on_status(tx, proposal)`, if given, is awaited inside the transaction of every status change with
the proposal as it now is (notifications write their outbox there: no change without its event,
and no event without its change).
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from msgspec.structs import replace

from mcp_knecht.core import clock
from mcp_knecht.core.audit import AuditEntry
from mcp_knecht.core.database import Database, Row, Transaction, by_keys, exact_matches
from mcp_knecht.core.proposals import (
    Approval,
    NewProposal,
    Proposal,
    ProposalState,
    QuorumResult,
    Sealer,
    Turn,
)
from mcp_knecht.core.stored_json import json_object
from mcp_knecht.store.audit_log import AuditChain
from mcp_knecht.store.quorum import add_approval, approval, approvals_of, read_state
from mcp_knecht.store.written_around import as_text, quorum_size

_SELECT = "SELECT * FROM proposals"
_SELECT_WITH_APPROVALS = (
    "SELECT p.*, a.operator AS approval_operator, a.person AS approval_person,"
    " a.approved_at AS approval_approved_at, a.seal AS approval_seal"
    " FROM proposals p LEFT JOIN proposal_approvals a ON a.proposal_id = p.id WHERE p.id = ? ORDER BY a.id"
)

StatusHook = Callable[[Transaction, Proposal], Awaitable[None]]
"""`hook(tx, proposal)`: awaited inside the transaction that gave `proposal` its status."""


def _effective_status(row: Row, now: str) -> str:
    return "expired" if row["status"] == "pending" and clock.stored(row["expires_at"]) <= now else str(row["status"])


def _proposal(row: Row, now: str, approvals: tuple[Approval, ...] = ()) -> Proposal:
    row = as_text(row)
    return Proposal(
        id=row["id"], tool=row["tool"], action=row["action"],
        arguments_json=row["arguments_json"], arguments_hash=row["arguments_hash"],
        proposer_subject=row["proposer_subject"], proposer_client=row["proposer_client"],
        proposer_scopes=tuple(row["proposer_scopes"].split()), rule=row["rule"],
        preview=json_object(row["preview_json"]), preview_json=row["preview_json"],
        status=_effective_status(row, now),  # type: ignore[arg-type]
        created_at=row["created_at"], expires_at=clock.stored(row["expires_at"]),
        decided_by=row["decided_by"], decided_at=row["decided_at"], reason=row["reason"],
        started_at=row["started_at"], finished_at=row["finished_at"],
        result=json_object(row["result_json"]), error=row["error"],
        arguments_shown=row.get("arguments_shown"), seal=row.get("seal"),
        approvers=quorum_size(row.get("approvers")), policy_reason=row.get("policy_reason"), approvals=approvals,
    )


OVERDUE = "status = 'pending' AND expires_at || '' <= ?"
"""The pending proposals whose time has run out (they read as `expired`), in the form the index on their
expiry (`proposals_overdue`, on `expires_at || ''` over pending rows: sql/<dialect>/0009) serves."""


def overdue_source(dialect: str) -> str:
    """`proposals`, told on SQLite to read `OVERDUE` from its index: with no histograms, SQLite's planner
    would walk every pending row instead (in id order, for a LIMIT; by proposer, for one proposer's)."""
    return "proposals INDEXED BY proposals_overdue" if dialect == "sqlite" else "proposals"


def _expiry_sweep(dialect: str) -> str:
    """What writes `expired` on every overdue proposal: a range of the index, not a walk of every pending row
    under the writers' lock (81.8 ms every 30 s over 1,000,000 proposals, a tenth pending; now 0.3 ms)."""
    return f"UPDATE {overdue_source(dialect)} SET status = 'expired' WHERE {OVERDUE} RETURNING *"


def _status_condition(status: str | None, now: str) -> tuple[list[str], list[Any]]:
    """WHERE conditions for an effective status other than `expired` (`_expired_listing`)."""
    if status == "pending":
        return ["status = 'pending'", "expires_at > ?"], [now]
    return exact_matches({"status": status})


def _narrowing(subject: str | None, after_id: int, before_id: int | None) -> tuple[list[str], list[object]]:
    """A listing's conditions beside its status. An id bound only where one was asked for: SQLite's planner
    takes `id > 0` for a range of the primary key to walk, and where its statistics say one status holds
    every row (taken while all proposals were pending) it walked that range for a status none had, instead
    of the status index: 34 ms over 200,000 proposals, against 0.01 ms."""
    conditions, values = exact_matches({"proposer_subject": subject})
    if after_id:
        conditions.append("id > ?")
        values.append(after_id)
    if before_id is not None:
        conditions.append("id < ?")
        values.append(before_id)
    return conditions, values


def _listing(dialect: str, status: str | None, subject: str | None, after_id: int, before_id: int | None,
             oldest_first: bool, limit: int, now: str) -> tuple[str, tuple[Any, ...]]:
    """The statement of `list`."""
    narrowing, narrowing_values = _narrowing(subject, after_id, before_id)
    order = f"ORDER BY id {'ASC' if oldest_first else 'DESC'} LIMIT ?"
    if status == "expired":
        return _expired_listing(dialect, narrowing, narrowing_values, order, limit, now)
    where, params = _status_condition(status, now)
    conditions = [*where, *narrowing]
    where_clause = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    return f"{_SELECT}{where_clause} {order}", (*params, *narrowing_values, limit)


def _expired_listing(dialect: str, narrowing: list[str], values: list[object], order: str, limit: int,
                     now: str) -> tuple[str, tuple[Any, ...]]:
    """`expired` is two kinds of row: those written `expired` (a walk of the status index in id order, as any
    status) and the pending ones whose time has run out (a range of `proposals_overdue`: the expiry sweep
    writes them `expired` within 30 s while a server runs, so they are few). One `status IN (…)` over both
    walked every pending row and sorted (88 to 92 ms over 1,000,000 proposals, a tenth pending). The overdue ones
    are MATERIALIZED so that neither planner walks the pending rows in id order to serve the LIMIT."""
    also = "".join(f" AND {condition}" for condition in narrowing)
    return (f"WITH overdue AS MATERIALIZED (SELECT * FROM {overdue_source(dialect)} WHERE {OVERDUE}{also}),"
            f" written AS (SELECT * FROM proposals WHERE status = 'expired'{also} {order})"
            f" SELECT * FROM overdue UNION ALL SELECT * FROM written {order}",
            (now, *values, *values, limit, limit))


def _settled(dialect: str, ids: Sequence[int], now: str) -> tuple[str, tuple[Any, ...]]:
    """The statement reading which of `ids` are no longer pending (a lookup per id: `by_keys`)."""
    source, match, params = by_keys(dialect, "proposals p", "p.id", ids)
    return (f"SELECT p.id, p.status, p.expires_at, p.proposer_subject FROM {source}"
            f" WHERE {match} AND (p.status <> 'pending' OR p.expires_at <= ?)", (*params, now))


class SqlProposalRepository:
    def __init__(self, db: Database, chain: AuditChain, *, on_status: StatusHook | None = None) -> None:
        self._db = db
        self._chain = chain
        self._on_status = on_status
        self._inside: dict[int, int] = {}
        """Per proposal: this process's decisions inside its turn, holding it or queued for it."""
        self._left: dict[int, ProposalState] = {}
        """Per proposal: the settled state a decision inside its turn left for those queued (`_leave`)."""

    async def _changed(self, tx: Transaction, row: Row, approvals: tuple[Approval, ...] = ()) -> Proposal:
        """`row` as the proposal it now is, after the status hook has seen it."""
        proposal = _proposal(row, clock.timestamp(), approvals)
        await self._tell(tx, proposal)
        return proposal

    async def _tell(self, tx: Transaction, proposal: Proposal) -> None:
        if self._on_status is not None:
            await self._on_status(tx, proposal)

    async def create(self, proposal: NewProposal, staged: AuditEntry, seal: Sealer) -> tuple[int, bool]:
        async with self._db.transaction(durable=True) as tx:
            subject, arguments_hash = proposal.proposer.subject, proposal.arguments_hash
            await tx.lock(f"proposal-call:{subject}:{arguments_hash}")
            waiting = await tx.fetch_all(
                "SELECT id, expires_at FROM proposals WHERE proposer_subject = ? AND arguments_hash = ? AND tool = ?"
                " AND status = 'pending' AND expires_at > ? ORDER BY id",
                (subject, arguments_hash, proposal.tool, proposal.created_at),
            )
            # An expiry written around the store as bytes passes `expires_at > ?` but reads as expired: not one to join.
            existing = next((r for r in waiting if clock.stored(r["expires_at"]) > proposal.created_at), None)
            if existing is not None:
                proposal_id = int(existing["id"])
                await self._chain.append(tx, [replace(staged, proposal_id=proposal_id,
                                                      detail={**staged.detail, "already_pending": True})])
                return proposal_id, False
            row = await tx.fetch_one(
                "INSERT INTO proposals (tool, action, arguments_json, arguments_hash, arguments_shown,"
                " proposer_subject, proposer_client, proposer_scopes, rule, preview_json, status, created_at,"
                " expires_at, seal, approvers, policy_reason)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?) RETURNING *",
                (
                    proposal.tool, proposal.action, proposal.arguments_json, arguments_hash,
                    proposal.arguments_shown, subject, proposal.proposer.client,
                    " ".join(sorted(proposal.proposer.scopes)), proposal.rule,
                    proposal.preview_json, proposal.created_at, proposal.expires_at, "", proposal.approvers,
                    proposal.policy_reason,
                ),
            )
            assert row is not None
            proposal_id = int(row["id"])
            # The seal binds the id, which only the insert gives; no one reads the row before the commit.
            row = {**row, "seal": seal(proposal_id)}
            await tx.execute_with_next("UPDATE proposals SET seal = ? WHERE id = ?", (row["seal"], proposal_id))
            await self._changed(tx, row)  # before the audit chain takes its (global) lock
            await self._chain.append(tx, [replace(staged, proposal_id=proposal_id)])
        return proposal_id, True

    async def get(self, proposal_id: int) -> Proposal | None:
        """The proposal with its approvals, in one statement (a decision reads it more than once)."""
        rows = await self._db.lookup(_SELECT_WITH_APPROVALS, (proposal_id,))
        if not rows:
            return None
        found = tuple(approval(row, prefix="approval_") for row in rows if row["approval_person"] is not None)
        return _proposal(rows[0], clock.timestamp(), found)

    async def state(self, proposal_id: int) -> ProposalState | None:
        return await read_state(self._db, proposal_id)

    @asynccontextmanager
    async def turn(self, proposal_id: int) -> AsyncIterator[Turn]:
        """One queued behind a decision of this process skips the first read and is told by that decision
        (`_leave`), not by the store."""
        queued_behind = proposal_id in self._inside
        self._inside[proposal_id] = self._inside.get(proposal_id, 0) + 1
        try:
            read_first: Proposal | None = None
            if not queued_behind:
                # Where it stands, first, outside the turn: an operator who comes late learns it from one read.
                # (Reading it inside the turn instead spares a waiter in another process one read, but makes the
                # late ones of one server queue for the turn of a proposal long decided.) Where the turn holds
                # back other processes, most of the racing ones never need more than one short row. Where it
                # cannot (PostgreSQL: they queue in the server, in the claim's transaction), each of them reads
                # the whole proposal anyway, so it is read here at once: a round trip fewer for every one.
                if self._db.turn_spans_processes:
                    state = await read_state(self._db, proposal_id)
                else:
                    read_first = await self.get(proposal_id)
                    state = read_first.state if read_first is not None else None
                if state is None or state.status != "pending":
                    yield Turn(False, state)
                    return
            looked: list[ProposalState | None] = []

            async def moved() -> bool:
                if (state := self._left.get(proposal_id)) is None:
                    self._leave(proposal_id, state := await read_state(self._db, proposal_id))
                looked.append(state)
                return state is None or state.status != "pending"

            async with self._db.turn(f"proposal:{proposal_id}", moved=moved) as ours:
                if not ours:
                    yield Turn(False, looked[-1])
                else:  # a proposal read before a wait may have changed meanwhile
                    yield Turn(True, proposal=None if looked else read_first)
        finally:
            if (inside := self._inside.pop(proposal_id) - 1) > 0:
                self._inside[proposal_id] = inside
            else:
                self._left.pop(proposal_id, None)

    def _leave(self, proposal_id: int, state: ProposalState | None) -> None:
        """What a decision inside the proposal's turn left it as, for those of this process queued behind
        it. Only a settled state is left (nothing moves a proposal back to pending), and only while
        somebody is inside the turn: the word never outlives the queue it was left for."""
        if state is not None and state.status != "pending" and proposal_id in self._inside:
            self._left[proposal_id] = state

    async def _with_approvals(self, proposals: builtins.list[Proposal]) -> builtins.list[Proposal]:
        found = await approvals_of(self._db, [p.id for p in proposals]) if proposals else {}
        return [replace(p, approvals=found[p.id]) if found.get(p.id) else p for p in proposals]

    async def list(self, *, status: str | None = None, subject: str | None = None, limit: int = 100,
                   after_id: int = 0, before_id: int | None = None,
                   oldest_first: bool = False) -> builtins.list[Proposal]:
        now = clock.timestamp()
        rows = await self._db.fetch_all(
            *_listing(self._db.dialect, status, subject, after_id, before_id, oldest_first, limit, now))
        found = [_proposal(row, now) for row in rows]
        if status is not None:  # a row whose expiry was written around the store as bytes passes `expires_at > ?`
            found = [proposal for proposal in found if proposal.status == status]
        return await self._with_approvals(found)

    async def _update(self, sql: str, params: tuple[object, ...], audit: AuditEntry | None, *,
                      durable: bool = True) -> bool:
        """One conditional UPDATE; its audit row commits with it, and only if it changed a row."""
        return await self._update_returning(sql, params, audit, durable=durable) is not None

    async def _update_returning(self, sql: str, params: tuple[object, ...], audit: AuditEntry | None, *,
                                durable: bool = True, approvals: tuple[Approval, ...] = ()) -> Proposal | None:
        """`_update`, answering the proposal as the UPDATE left it, with `approvals`."""
        async with self._db.transaction(durable=durable) as tx:
            changed = await tx.fetch_all(f"{sql} RETURNING *", params)
            if len(changed) != 1:
                return None
            proposal = await self._changed(tx, changed[0], approvals)  # before the audit chain takes its lock
            if audit is not None:
                await self._chain.append(tx, [audit])
        return proposal

    async def expire_overdue(self, now: str, audit: Callable[[Proposal], AuditEntry]) -> builtins.list[Proposal]:
        async with self._db.transaction(durable=True) as tx:
            rows = await tx.fetch_all(_expiry_sweep(self._db.dialect), (now,))
            expired = sorted((_proposal(row, now) for row in rows), key=lambda p: p.id)
            if self._on_status is not None:
                for proposal in expired:
                    await self._on_status(tx, proposal)
            await self._chain.append(tx, [audit(p) for p in expired])
        return expired

    async def add_approval(self, proposal_id: int, approval: Approval, *, required: int,
                           counts: Callable[[Approval], bool],
                           audit: Callable[[tuple[Approval, ...], bool], AuditEntry],
                           approved_as: Proposal | None = None) -> QuorumResult:
        async def claimed(tx: Transaction, row: Row, counted: tuple[Approval, ...]) -> Proposal | None:
            proposal = _proposal(row, approval.approved_at, counted)
            if approved_as is not None and proposal.sealed() != approved_as.sealed():
                return None
            await self._tell(tx, proposal)
            return proposal

        result = await add_approval(self._db, self._chain, proposal_id, approval, required=required, counts=counts,
                                    audit=audit, approved=claimed)
        self._leave(proposal_id, result.claimed.state if result.claimed is not None else result.state)
        return result

    async def reject(self, proposal_id: int, operator: str, reason: str, now: str, audit: AuditEntry) -> bool:
        return await self._update(
            "UPDATE proposals SET status = 'rejected', decided_by = ?, decided_at = ?, reason = ?"
            " WHERE id = ? AND status = 'pending' AND expires_at > ?",
            (operator, now, reason, proposal_id, now), audit,
        )

    async def finish(self, proposal_id: int, *, succeeded: bool, result_json: str | None,
                     error: str | None, now: str, audit: AuditEntry,
                     approvals: tuple[Approval, ...] = ()) -> Proposal | None:
        # Not `durable`: the claim already is. A power loss that takes this commit leaves the proposal
        # `executing` ("outcome unknown"): never run again, settled by a person.
        return await self._update_returning(
            "UPDATE proposals SET status = ?, finished_at = ?, result_json = ?, error = ?"
            " WHERE id = ? AND status = 'executing'",
            ("succeeded" if succeeded else "failed", now, result_json, error, proposal_id), audit, durable=False,
            approvals=approvals,
        )

    async def take_unseen(self, subject: str, limit: int) -> builtins.list[Proposal]:
        now = clock.timestamp()
        async with self._db.transaction() as tx:
            rows = await tx.fetch_all(
                "UPDATE proposals SET seen_at = ? WHERE id IN (SELECT id FROM proposals WHERE proposer_subject = ?"
                " AND seen_at IS NULL AND (status IN ('succeeded', 'failed', 'rejected', 'expired')"
                " OR (status = 'pending' AND expires_at <= ?)) ORDER BY id LIMIT ?) RETURNING *",
                (now, subject, now, limit),
            )
        return await self._with_approvals(sorted((_proposal(row, now) for row in rows), key=lambda p: p.id))

    async def mark_seen(self, proposal_id: int) -> None:
        async with self._db.transaction() as tx:
            await tx.execute("UPDATE proposals SET seen_at = ? WHERE id = ? AND seen_at IS NULL",
                             (clock.timestamp(), proposal_id))

    async def settled(self, ids: Sequence[int]) -> dict[int, tuple[str, str]]:
        """`id → (effective status, proposer subject)` for those of `ids` no longer pending."""
        now = clock.timestamp()
        found: dict[int, tuple[str, str]] = {}
        for start in range(0, len(ids), 500):
            rows = await self._db.fetch_all(*_settled(self._db.dialect, ids[start:start + 500], now))
            found.update({row["id"]: (_effective_status(row, now), row["proposer_subject"]) for row in rows})
        return found

"""Proposals in SQL. Each state change is a single `UPDATE … WHERE status = <expected>`, so of
any number of racing processes (or replicas) exactly one sees a row change.

`on_status(tx, id, status)`, if given, runs inside the transaction of every change it describes
(notifications write their outbox there: no state change without its event, and no event
without its state change)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence

from mcp_knecht.core.proposals import NewProposal, Proposal
from mcp_knecht.store.database import Database, Transaction, exact_matches

_SELECT = "SELECT * FROM proposals"

StatusHook = Callable[[Transaction, int, str], Awaitable[None]]
"""`hook(tx, proposal_id, new_status)`, awaited inside the transaction that made the change."""


class SqlProposalRepository:
    def __init__(self, db: Database, *, on_status: StatusHook | None = None) -> None:
        self._db = db
        self._on_status = on_status

    async def _changed(self, tx: Transaction, proposal_id: int, status: str) -> None:
        if self._on_status is not None:
            await self._on_status(tx, proposal_id, status)

    async def create(self, proposal: NewProposal) -> int:
        async with self._db.transaction() as tx:
            row = await tx.fetch_one(
                "INSERT INTO proposals (tool, action, arguments_json, arguments_hash, arguments_shown,"
                " proposer_subject, proposer_client, proposer_scopes, rule, preview_json, status, created_at,"
                " expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?) RETURNING id",
                (
                    proposal.tool, proposal.action, proposal.arguments_json, proposal.arguments_hash,
                    proposal.arguments_shown,
                    proposal.proposer.subject, proposal.proposer.client,
                    " ".join(sorted(proposal.proposer.scopes)), proposal.rule,
                    json.dumps(proposal.preview, ensure_ascii=False) if proposal.preview is not None else None,
                    proposal.created_at, proposal.expires_at,
                ),
            )
            assert row is not None
            await self._changed(tx, int(row["id"]), "pending")
        return int(row["id"])

    async def get(self, proposal_id: int) -> Proposal | None:
        row = await self._db.fetch_one(f"{_SELECT} WHERE id = ?", (proposal_id,))
        return Proposal.from_row(row) if row else None

    async def list(self, *, status: str | None = None, subject: str | None = None,
                   limit: int = 100, after_id: int = 0, oldest_first: bool = False) -> list[Proposal]:
        where, params = exact_matches({"status": status, "proposer_subject": subject})
        where, params = ["id > ?", *where], [after_id, *params]
        order = "ASC" if oldest_first else "DESC"
        rows = await self._db.fetch_all(
            f"{_SELECT} WHERE {' AND '.join(where)} ORDER BY id {order} LIMIT ?", (*params, limit)
        )
        return [Proposal.from_row(row) for row in rows]

    async def _update(self, sql: str, params: tuple[object, ...], *, proposal_id: int, status: str) -> bool:
        async with self._db.transaction() as tx:
            changed = await tx.execute(sql, params) == 1
            if changed:
                await self._changed(tx, proposal_id, status)
            return changed

    async def expire_overdue(self, now: str) -> int:
        async with self._db.transaction() as tx:
            expired = await tx.fetch_all(
                "UPDATE proposals SET status = 'expired' WHERE status = 'pending' AND expires_at <= ? RETURNING id",
                (now,),
            )
            for row in expired:
                await self._changed(tx, int(row["id"]), "expired")
        return len(expired)

    async def claim(self, proposal_id: int, operator: str, now: str) -> bool:
        return await self._update(
            "UPDATE proposals SET status = 'approved', decided_by = ?, decided_at = ?"
            " WHERE id = ? AND status = 'pending' AND expires_at > ? AND proposer_subject <> ?",
            (operator, now, proposal_id, now, operator), proposal_id=proposal_id, status="approved",
        )

    async def reject(self, proposal_id: int, operator: str, reason: str, now: str) -> bool:
        return await self._update(
            "UPDATE proposals SET status = 'rejected', decided_by = ?, decided_at = ?, reason = ?"
            " WHERE id = ? AND status = 'pending' AND expires_at > ?",
            (operator, now, reason, proposal_id, now), proposal_id=proposal_id, status="rejected",
        )

    async def start_execution(self, proposal_id: int, now: str) -> bool:
        return await self._update(
            "UPDATE proposals SET status = 'executing', started_at = ? WHERE id = ? AND status = 'approved'",
            (now, proposal_id), proposal_id=proposal_id, status="executing",
        )

    async def finish(self, proposal_id: int, *, succeeded: bool, result_json: str | None,
                     error: str | None, now: str) -> bool:
        status = "succeeded" if succeeded else "failed"
        return await self._update(
            "UPDATE proposals SET status = ?, finished_at = ?, result_json = ?, error = ?"
            " WHERE id = ? AND status = 'executing'",
            (status, now, result_json, error, proposal_id), proposal_id=proposal_id, status=status,
        )

    async def statuses(self, ids: Sequence[int]) -> dict[int, tuple[str, str]]:
        """`id → (status, proposer subject)` for the ids that exist."""
        found: dict[int, tuple[str, str]] = {}
        for start in range(0, len(ids), 500):
            chunk = list(ids[start:start + 500])
            rows = await self._db.fetch_all(
                f"SELECT id, status, proposer_subject FROM proposals WHERE id IN ({', '.join('?' * len(chunk))})",
                chunk,
            )
            found.update({row["id"]: (row["status"], row["proposer_subject"]) for row in rows})
        return found

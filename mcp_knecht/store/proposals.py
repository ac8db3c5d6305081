"""Proposals in SQL: the one place rows become `Proposal`s and back.

Each state change is a single `UPDATE … WHERE status = <expected>`, so of any number of racing
processes (or replicas) exactly one sees a row change. Writes that record what a human approves
or decides are `durable` transactions. Every read applies expiry: a pending row whose `expires_at`
has passed reads as `expired`, on every path.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Sequence
from typing import Any

from mcp_knecht.core import clock
from mcp_knecht.core.database import Database, Row, exact_matches
from mcp_knecht.core.proposals import NewProposal, Proposal

_SELECT = "SELECT * FROM proposals"


def _effective_status(row: Row, now: str) -> str:
    return "expired" if row["status"] == "pending" and row["expires_at"] <= now else str(row["status"])


def _proposal(row: Row, now: str) -> Proposal:
    return Proposal(
        id=row["id"], tool=row["tool"], action=row["action"],
        arguments_json=row["arguments_json"], arguments_hash=row["arguments_hash"],
        proposer_subject=row["proposer_subject"], proposer_client=row["proposer_client"],
        proposer_scopes=tuple(row["proposer_scopes"].split()), rule=row["rule"],
        preview=json.loads(row["preview_json"]) if row["preview_json"] else None,
        status=_effective_status(row, now),  # type: ignore[arg-type]
        created_at=row["created_at"], expires_at=row["expires_at"],
        decided_by=row["decided_by"], decided_at=row["decided_at"], reason=row["reason"],
        started_at=row["started_at"], finished_at=row["finished_at"],
        result=json.loads(row["result_json"]) if row["result_json"] else None, error=row["error"],
        arguments_shown=row.get("arguments_shown"),
    )


def _status_condition(status: str | None, now: str) -> tuple[list[str], list[Any]]:
    """WHERE conditions for an effective status."""
    if status == "pending":
        return ["status = 'pending'", "expires_at > ?"], [now]
    if status == "expired":
        return ["(status = 'expired' OR (status = 'pending' AND expires_at <= ?))"], [now]
    return exact_matches({"status": status})


class SqlProposalRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(self, proposal: NewProposal) -> int:
        async with self._db.transaction(durable=True) as tx:
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
        return int(row["id"])

    async def get(self, proposal_id: int) -> Proposal | None:
        row = await self._db.fetch_one(f"{_SELECT} WHERE id = ?", (proposal_id,))
        return _proposal(row, clock.timestamp()) if row else None

    async def list(self, *, status: str | None = None, subject: str | None = None,
                   limit: int = 100, after_id: int = 0, oldest_first: bool = False) -> builtins.list[Proposal]:
        now = clock.timestamp()
        where, params = _status_condition(status, now)
        subject_where, subject_params = exact_matches({"proposer_subject": subject})
        conditions = ["id > ?", *where, *subject_where]
        order = "ASC" if oldest_first else "DESC"
        rows = await self._db.fetch_all(
            f"{_SELECT} WHERE {' AND '.join(conditions)} ORDER BY id {order} LIMIT ?",
            (after_id, *params, *subject_params, limit),
        )
        return [_proposal(row, now) for row in rows]

    async def _update(self, sql: str, params: tuple[object, ...]) -> bool:
        async with self._db.transaction(durable=True) as tx:
            return await tx.execute(sql, params) == 1

    async def expire_overdue(self, now: str) -> builtins.list[Proposal]:
        async with self._db.transaction(durable=True) as tx:
            rows = await tx.fetch_all(
                "UPDATE proposals SET status = 'expired' WHERE status = 'pending' AND expires_at <= ? RETURNING *",
                (now,),
            )
        return [_proposal(row, now) for row in rows]

    async def claim(self, proposal_id: int, operator: str, now: str) -> bool:
        return await self._update(
            "UPDATE proposals SET status = 'approved', decided_by = ?, decided_at = ?"
            " WHERE id = ? AND status = 'pending' AND expires_at > ? AND proposer_subject <> ?",
            (operator, now, proposal_id, now, operator),
        )

    async def reject(self, proposal_id: int, operator: str, reason: str, now: str) -> bool:
        return await self._update(
            "UPDATE proposals SET status = 'rejected', decided_by = ?, decided_at = ?, reason = ?"
            " WHERE id = ? AND status = 'pending' AND expires_at > ?",
            (operator, now, reason, proposal_id, now),
        )

    async def start_execution(self, proposal_id: int, now: str) -> bool:
        return await self._update(
            "UPDATE proposals SET status = 'executing', started_at = ? WHERE id = ? AND status = 'approved'",
            (now, proposal_id),
        )

    async def finish(self, proposal_id: int, *, succeeded: bool, result_json: str | None,
                     error: str | None, now: str) -> bool:
        return await self._update(
            "UPDATE proposals SET status = ?, finished_at = ?, result_json = ?, error = ?"
            " WHERE id = ? AND status = 'executing'",
            ("succeeded" if succeeded else "failed", now, result_json, error, proposal_id),
        )

    async def statuses(self, ids: Sequence[int]) -> dict[int, tuple[str, str]]:
        """`id → (effective status, proposer subject)` for the ids that exist."""
        now = clock.timestamp()
        found: dict[int, tuple[str, str]] = {}
        for start in range(0, len(ids), 500):
            chunk = list(ids[start:start + 500])
            rows = await self._db.fetch_all(
                "SELECT id, status, expires_at, proposer_subject FROM proposals"
                f" WHERE id IN ({', '.join('?' * len(chunk))})",
                chunk,
            )
            found.update({row["id"]: (_effective_status(row, now), row["proposer_subject"]) for row in rows})
        return found

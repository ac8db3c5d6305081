"""Stored failure diagnoses, one row per run, and the claim that makes each one happen once.

    (no row) ──claim──▶ pending ──finish──▶ done | failed
    unavailable ─claim─▶ pending            (a model has been configured since)
    pending, lease over ─claim─▶ pending    (its worker stopped: restart, crash; at most MAX_ATTEMPTS)

The table is the Knecht toolset's (knecht/sql/<dialect>/0004_run_diagnoses.sql: state per run,
beside the runs); the AI layer writes it, `get_run` reads it.

A claim is one `INSERT … ON CONFLICT DO NOTHING`, or one conditional `UPDATE` of a row that may
be taken over: of any number of workers, processes or replicas exactly one sees a row change.
Only the owner of a claim can finish it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import msgspec

from mcp_knecht.core.database import Database, Row

MAX_ATTEMPTS = 3
PENDING_TEXT = "Knecht is looking into why the last run failed."


def _action_ids(stored: object) -> list[int]:
    """The action-log ids a diagnosis cites. Text written around the store that is no list of them cites
    none: it must not fail every `get_run` of that run."""
    try:
        ids = json.loads(stored or "[]")  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return []
    return ids if isinstance(ids, list) and all(type(i) is int for i in ids) else []


class StoredDiagnosis(msgspec.Struct, frozen=True):
    """A failure diagnosis as stored for a run."""
    run_id: int
    status: str
    summary: str | None
    action_ids: list[int]
    model: str | None
    error: str | None
    attempts: int
    updated_at: str

    @classmethod
    def from_row(cls, row: Row) -> StoredDiagnosis:
        return cls(int(row["run_id"]), row["status"], row["summary"], _action_ids(row["action_ids"]),
                   row["model"], row["error"], int(row["attempts"]), row["updated_at"])

    def shown(self) -> dict[str, Any]:
        """The contract's shape: `{"status", "summary"?, "actionIds"?, "model"?, "error"?}`."""
        if self.status == "done":
            return {"status": "done", "summary": self.summary, "actionIds": self.action_ids, "model": self.model,
                    "at": self.updated_at}
        if self.status == "pending":
            return {"status": "pending", "summary": PENDING_TEXT}
        return {"status": self.status, "error": self.error or "", "at": self.updated_at}


async def get_diagnosis(db: Database, run_id: int) -> StoredDiagnosis | None:
    row = await db.fetch_one("SELECT * FROM run_diagnoses WHERE run_id = ?", (run_id,))
    return StoredDiagnosis.from_row(row) if row else None


async def shown_diagnosis(db: Database, run_id: int) -> dict[str, Any] | None:
    stored = await get_diagnosis(db, run_id)
    return stored.shown() if stored else None


async def claim(db: Database, run_id: int, owner: str, *, now: str, lease_until: str,
                retake: Sequence[str] = ("unavailable",)) -> bool:
    """Make `owner` the one to diagnose `run_id`: True for exactly one of any racing claimants."""
    taken = tuple(s for s in retake if s in ("unavailable", "failed", "done"))
    statuses = ", ".join("?" * len(taken)) or "NULL"
    async with db.transaction() as tx:
        if await tx.execute(
            "INSERT INTO run_diagnoses (run_id, status, owner, lease_until, attempts, created_at, updated_at)"
            " VALUES (?, 'pending', ?, ?, 1, ?, ?) ON CONFLICT (run_id) DO NOTHING",
            (run_id, owner, lease_until, now, now),
        ) == 1:
            return True
        return await tx.execute(
            "UPDATE run_diagnoses SET status = 'pending', owner = ?, lease_until = ?, error = NULL, updated_at = ?,"
            " attempts = CASE WHEN status = 'pending' THEN attempts + 1 ELSE 1 END"
            f" WHERE run_id = ? AND (status IN ({statuses})"
            "  OR (status = 'pending' AND lease_until < ? AND attempts < ?))",
            (owner, lease_until, now, run_id, *taken, now, MAX_ATTEMPTS),
        ) == 1


async def give_up_stale(db: Database, *, now: str) -> int:
    """Pending claims whose lease ran out MAX_ATTEMPTS times become `failed`."""
    async with db.transaction() as tx:
        return await tx.execute(
            "UPDATE run_diagnoses SET status = 'failed', owner = NULL, updated_at = ?,"
            " error = 'The diagnosis was started several times and never finished; ask again to retry.'"
            " WHERE status = 'pending' AND lease_until < ? AND attempts >= ?",
            (now, now, MAX_ATTEMPTS),
        )


async def finish(db: Database, run_id: int, owner: str, *, status: str, now: str, summary: str | None = None,
                 action_ids: Sequence[int] = (), model: str | None = None, error: str | None = None,
                 feature_run: int | None = None) -> bool:
    """Record the outcome of `owner`'s claim; False when the claim was lost meanwhile."""
    async with db.transaction() as tx:
        return await tx.execute(
            "UPDATE run_diagnoses SET status = ?, summary = ?, action_ids = ?, model = ?, error = ?,"
            " feature_run = ?, owner = NULL, lease_until = NULL, updated_at = ?"
            " WHERE run_id = ? AND owner = ? AND status = 'pending'",
            (status, summary, json.dumps(list(action_ids)), model, error, feature_run, now, run_id, owner),
        ) == 1


async def release(db: Database, run_id: int, owner: str, *, now: str) -> None:
    """Give a claim back at once (on shutdown), so the next worker need not wait for its lease."""
    async with db.transaction() as tx:
        await tx.execute(
            "UPDATE run_diagnoses SET lease_until = ?, attempts = attempts - 1"
            " WHERE run_id = ? AND owner = ? AND status = 'pending'", (now, run_id, owner),
        )


async def store_unavailable(db: Database, run_id: int, error: str, *, now: str) -> None:
    """No model is configured: say so, unless the run already has a diagnosis or one is under way."""
    async with db.transaction() as tx:
        if await tx.execute(
            "INSERT INTO run_diagnoses (run_id, status, error, attempts, created_at, updated_at)"
            " VALUES (?, 'unavailable', ?, 0, ?, ?) ON CONFLICT (run_id) DO NOTHING", (run_id, error, now, now),
        ) == 0:
            await tx.execute(
                "UPDATE run_diagnoses SET error = ?, updated_at = ? WHERE run_id = ? AND status = 'unavailable'",
                (error, now, run_id),
            )


async def candidates(db: Database, *, now: str, finished_since: str | None, limit: int,
                     below: int | None = None) -> list[int]:
    """Failed runs that need a diagnosis (none yet, `unavailable`, or a lapsed claim), newest first;
    with `below`, only runs with a lower id (to go on through a backlog without re-reading its top)."""
    since = " AND r.finished_at >= ?" if finished_since is not None else ""
    under = " AND r.id < ?" if below is not None else ""
    rows = await db.fetch_all(
        "SELECT r.id FROM runs r LEFT JOIN run_diagnoses d ON d.run_id = r.id"
        f" WHERE r.status = 'failed'{since}{under}"
        " AND (d.run_id IS NULL OR d.status = 'unavailable' OR (d.status = 'pending' AND d.lease_until < ?))"
        " ORDER BY r.id DESC LIMIT ?",
        (*([finished_since] if finished_since is not None else []), *([below] if below is not None else []),
         now, limit),
    )
    return [int(row["id"]) for row in rows]

"""The audit log: group-committed, hash-chained, verifiable.

The gate hands entries over without waiting; a background task writes whatever has gathered
in one transaction every `flush_interval` seconds, so the hot path never pays a commit.
`aclose()` writes the rest, so a clean shutdown loses nothing.

Each row's hash covers its id, its fields and the previous row's hash: editing a row breaks
its own hash, deleting one breaks the link of the row after it. The chain is extended inside
the write transaction (which holds the database's write lock), so concurrent writers —
other processes, other replicas — still make one chain.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from mcp_knecht.core.audit import AuditEntry
from mcp_knecht.core.canonical import canonical_json, sha256_hex
from mcp_knecht.core.database import Database, Row, Transaction, exact_matches
from mcp_knecht.errors import StoreError

logger = logging.getLogger(__name__)

GENESIS = "0" * 64
_COLUMNS = (
    "id", "at", "source", "subject", "client", "tool", "action", "outcome", "rule",
    "proposal_id", "arguments_hash", "detail", "duration_ms",
)
_ENTRY_COLUMNS = tuple(c for c in _COLUMNS if c not in ("id", "detail"))
_INSERT = (
    f"INSERT INTO audit_log ({', '.join(_COLUMNS)}, prev_hash, hash) "
    f"VALUES ({', '.join('?' for _ in _COLUMNS)}, ?, ?)"
)


def _row_hash(fields: dict[str, Any], prev_hash: str) -> str:
    return sha256_hex(prev_hash + canonical_json(fields))


async def append_entries(tx: Transaction, entries: Sequence[AuditEntry]) -> None:
    """Extend the chain by `entries` inside an open write transaction."""
    await tx.lock("audit_log")
    last = await tx.fetch_one("SELECT id, hash FROM audit_log ORDER BY id DESC LIMIT 1")
    next_id, prev_hash = (last["id"] + 1, last["hash"]) if last else (1, GENESIS)
    rows = []
    for entry in entries:
        # Field by field: dataclasses.asdict deep-copies, ten times the cost, on the server's loop.
        fields: dict[str, Any] = {column: getattr(entry, column) for column in _ENTRY_COLUMNS}
        fields["detail"] = json.dumps(entry.detail, ensure_ascii=False, sort_keys=True, default=str)
        fields["id"] = next_id
        row_hash = _row_hash(fields, prev_hash)
        rows.append((*(fields[c] for c in _COLUMNS), prev_hash, row_hash))
        next_id, prev_hash = next_id + 1, row_hash
    await tx.execute_many(_INSERT, rows)


class AuditLog:
    """An `AuditSink` over a database, writing in groups."""

    def __init__(self, db: Database, *, flush_interval: float = 0.05) -> None:
        self._db = db
        self._interval = flush_interval
        self._pending: list[AuditEntry] = []
        self._closed = False
        self._flush_lock = anyio.Lock()

    def record(self, entry: AuditEntry) -> None:
        if self._closed:
            raise StoreError("The audit log is closed; no call may run without an audit record.")
        self._pending.append(entry)

    async def run(self) -> None:
        """Flush periodically until cancelled (run it in the server's task group)."""
        while True:
            await anyio.sleep(self._interval)
            if self._pending:
                await self.flush()

    async def flush(self) -> None:
        async with self._flush_lock:
            batch, self._pending = self._pending, []
            if not batch:
                return
            try:
                async with self._db.transaction() as tx:
                    await append_entries(tx, batch)
            except Exception:
                # Keep them for the next round rather than lose the record of what happened.
                self._pending[:0] = batch
                logger.exception("Writing %d audit entries failed; will retry", len(batch))
                raise

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            await self.flush()
            self._closed = True


@dataclass(frozen=True)
class ChainProblem:
    id: int
    problem: str


async def verify_chain(db: Database) -> list[ChainProblem]:
    """Recompute the chain; report every row whose hash or link does not hold."""
    problems: list[ChainProblem] = []
    prev_hash, expected_id = GENESIS, 1
    row: Row
    async for row in db.stream(f"SELECT {', '.join(_COLUMNS)}, prev_hash, hash FROM audit_log ORDER BY id"):
        if row["id"] != expected_id:
            problems.append(ChainProblem(expected_id, f"rows {expected_id}..{row['id'] - 1} are missing"))
        if row["prev_hash"] != prev_hash:
            problems.append(ChainProblem(row["id"], "does not link to the row before it (a row was deleted or edited)"))
        fields = {c: row[c] for c in _COLUMNS}
        if _row_hash(fields, row["prev_hash"]) != row["hash"]:
            problems.append(ChainProblem(row["id"], "content does not match its hash (the row was edited)"))
        prev_hash, expected_id = row["hash"], row["id"] + 1
    return problems


async def recent_entries(
    db: Database, *, tool: str | None = None, subject: str | None = None, outcome: str | None = None,
    source: str | None = None, proposal_id: int | None = None, limit: int = 50,
) -> list[Row]:
    """Newest first, filtered by exact matches."""
    where, params = exact_matches(
        {"tool": tool, "subject": subject, "outcome": outcome, "source": source, "proposal_id": proposal_id}
    )
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    rows = await db.fetch_all(f"SELECT * FROM audit_log {clause} ORDER BY id DESC LIMIT ?", (*params, limit))
    for row in rows:
        row["detail"] = json.loads(row["detail"])
    return rows

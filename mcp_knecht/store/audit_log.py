"""The audit log: a keyed hash chain with its head anchored outside the table; group-committed.

Each row's hash is an HMAC (the server key's `audit` key) over its id, its fields and the previous
row's hash: editing a row breaks its own hash, deleting one breaks the link of the row after it, and
without the key nobody can recompute the chain after an edit. The head — row count, last id, last
hash — is kept in `audit_anchor` under a MAC of its own, so deleting the newest rows is found too.
Rows written by release 0.1.0 (before the anchor's `keyed_from`) keep their plain SHA-256 links.

The chain is extended inside a write transaction under the lock "audit_log", so concurrent
writers — other processes, other replicas — still make one chain. `AuditChain.append` is called
in the same transaction as the state change a row records (a staged proposal, a decision), so
neither exists without the other. Everything else goes through `AuditLog`: the gate hands entries
over without waiting; a background task writes what has gathered every `flush_interval` seconds.
A store that is busy (a lock held by another process) delays the writes, never stops the server:
entries wait in a bounded buffer, retried with backoff, and once the buffer is full the gate refuses
new work ("store busy") instead of running calls it cannot record.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import anyio
import msgspec

from mcp_knecht.core.audit import AuditEntry, PendingEntry
from mcp_knecht.core.canonical import sha256_hex
from mcp_knecht.core.database import Database, Row, Transaction, exact_matches
from mcp_knecht.core.keys import ServerKeys
from mcp_knecht.core.stored_json import json_object
from mcp_knecht.errors import StoreError
from mcp_knecht.store.written_around import as_text

logger = logging.getLogger(__name__)

GENESIS = "0" * 64
MAX_PENDING = 50_000
"""Entries waiting for the store; beyond this the gate refuses new work until they are written."""
RETRY_BACKOFF = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0)
_COLUMNS = (
    "id", "at", "source", "subject", "client", "tool", "action", "outcome", "rule",
    "proposal_id", "arguments_hash", "detail", "duration_ms",
)
_ENTRY_COLUMNS = tuple(c for c in _COLUMNS if c not in ("id", "detail"))
_SORTED_COLUMNS = tuple(sorted(_COLUMNS))
# The canonical JSON of a row's fields (core.canonical: sorted keys, compact, UTF-8) without sorting
# each time: the fields are scalars, so a dict built in sorted key order encodes to the same text.
_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
_ENCODE_DETAIL = json.JSONEncoder(ensure_ascii=False, sort_keys=True, default=str).encode
"""`json.dumps(detail, ensure_ascii=False, sort_keys=True, default=str)`, the text rows have always
held, with its encoder built once instead of on every row."""
VERIFY_BATCH = 5_000
_INSERT = (
    f"INSERT INTO audit_log ({', '.join(_COLUMNS)}, prev_hash, hash) "
    f"VALUES ({', '.join('?' for _ in _COLUMNS)}, ?, ?)"
)


def _clean(text: str) -> str:
    """Text that can always be stored: lone surrogates (never valid UTF-8) become `\\udXXX`."""
    if text.isascii():  # ASCII holds no surrogate: no need to encode
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _row_fields(entry: AuditEntry, row_id: int) -> dict[str, Any]:
    # Field by field: dataclasses.asdict deep-copies, ten times the cost, on the server's loop.
    fields: dict[str, Any] = {column: getattr(entry, column) for column in _ENTRY_COLUMNS}
    for column, value in fields.items():
        if isinstance(value, str):
            fields[column] = _clean(value)
    fields["detail"] = _clean(_ENCODE_DETAIL(entry.detail))
    fields["id"] = row_id
    return fields


class Anchor(msgspec.Struct, frozen=True):
    """A signed checkpoint of the audit chain: its length and head when it was taken."""
    row_count: int
    head_id: int
    head_hash: str
    keyed_from: int
    mac: str

    def message(self) -> str:
        return f"{self.row_count}:{self.head_id}:{self.head_hash}:{self.keyed_from}"


class ChainProblem(msgspec.Struct, frozen=True):
    """A row of the audit log whose link does not hold, and what is wrong with it."""
    id: int
    problem: str


def _chain_end(anchor: Anchor, last_id: int | None, last_hash: str | None) -> tuple[int, str]:
    """The id and the previous hash of the next row. The anchor, read under the chain's lock, is the head
    as the lock's previous holder left it; the table's newest row may be older than that (on PostgreSQL
    it is read as of before the lock's wait: `lock_and_fetch_one`). Rows beyond the anchor were written
    around the store; the chain goes on after them, and `audit verify` reports them."""
    if last_id is not None and last_hash is not None and last_id > anchor.head_id:
        return last_id + 1, last_hash
    if anchor.head_id:
        return anchor.head_id + 1, anchor.head_hash
    return 1, GENESIS


class AuditChain:
    """Appends to and verifies the chain with the server's keys."""

    def __init__(self, keys: ServerKeys) -> None:
        self.keys = keys
        self._keys = keys

    def _link(self, fields: dict[str, Any], prev_hash: str, *, keyed: bool) -> str:
        text = prev_hash + _ENCODE({column: fields[column] for column in _SORTED_COLUMNS})
        return self._keys.mac("audit", text) if keyed else sha256_hex(text)

    def _signed(self, anchor: Anchor) -> Anchor:
        return Anchor(anchor.row_count, anchor.head_id, anchor.head_hash, anchor.keyed_from,
                      self._keys.mac("audit-anchor", anchor.message()))

    async def _anchor(self, source: Transaction | Database) -> Anchor | None:
        row = await source.fetch_one(
            "SELECT row_count, head_id, head_hash, keyed_from, mac FROM audit_anchor WHERE id = 1")
        return Anchor(**row) if row else None

    async def append(self, tx: Transaction, entries: Sequence[AuditEntry]) -> list[int]:
        """Extend the chain by `entries` inside an open write transaction; return their ids."""
        if not entries:
            return []
        row = await tx.lock_and_fetch_one(
            "audit_log",
            "SELECT row_count, head_id, head_hash, keyed_from, mac,"
            " (SELECT id FROM audit_log ORDER BY id DESC LIMIT 1) AS last_id,"
            " (SELECT hash FROM audit_log ORDER BY id DESC LIMIT 1) AS last_hash"
            " FROM audit_anchor WHERE id = 1")
        if row is None:
            raise StoreError("The audit log's head anchor is missing: the database was tampered with. "
                             "Run `mcp-knecht audit verify`.")
        last_id, last_hash = row.pop("last_id"), row.pop("last_hash")
        anchor = Anchor(**row)
        next_id, prev_hash = _chain_end(anchor, last_id, last_hash)
        rows, ids = [], []
        for entry in entries:
            fields = _row_fields(entry, next_id)
            row_hash = self._link(fields, prev_hash, keyed=True)
            rows.append((*(fields[c] for c in _COLUMNS), prev_hash, row_hash))
            ids.append(next_id)
            next_id, prev_hash = next_id + 1, row_hash
        head = self._signed(Anchor(anchor.row_count + len(rows), next_id - 1, prev_hash, anchor.keyed_from, ""))
        move_head = ("UPDATE audit_anchor SET row_count = ?, head_id = ?, head_hash = ?, mac = ? WHERE id = 1",
                     (head.row_count, head.head_id, head.head_hash, head.mac))
        if len(rows) == 1:  # a decision's row: with the head in one statement where the store can
            await tx.fetch_all_with([(_INSERT, rows[0])], *move_head)
        else:
            await tx.execute_many(_INSERT, rows)
            await tx.execute(*move_head)
        return ids

    async def verify(self, db: Database) -> AsyncIterator[ChainProblem | int]:
        """Recompute the chain in bounded memory; yields every problem found, and the number of rows
        checked so far every 100,000 rows (for progress lines)."""
        anchor = await self._anchor(db)
        keyed_from = anchor.keyed_from if anchor else 1
        prev_hash, expected_id, count = GENESIS, 1, 0
        row: Row
        async for row in db.stream(f"SELECT {', '.join(_COLUMNS)}, prev_hash, hash FROM audit_log ORDER BY id",
                                   batch=VERIFY_BATCH):
            count += 1
            if row["id"] != expected_id:
                yield ChainProblem(expected_id, f"rows {expected_id}..{row['id'] - 1} are missing")
            if row["prev_hash"] != prev_hash:
                yield ChainProblem(row["id"], "does not link to the row before it (a row was deleted or edited)")
            try:
                link = self._link(row, row["prev_hash"], keyed=row["id"] >= keyed_from)
            except TypeError:  # bytes, written around the store: read as text, it cannot match its hash
                link = self._link(text := as_text(row), text["prev_hash"], keyed=row["id"] >= keyed_from)
            if link != row["hash"]:
                yield ChainProblem(row["id"], "content does not match its hash (the row was edited, or the chain "
                                              "was recomputed without the server key)")
            prev_hash, expected_id = row["hash"], row["id"] + 1
            if count % 100_000 == 0:
                yield count
        for problem in self._check_anchor(anchor, count, expected_id - 1, prev_hash):
            yield problem

    def _check_anchor(self, anchor: Anchor | None, count: int, head_id: int, head_hash: str) -> list[ChainProblem]:
        if anchor is None:
            return [ChainProblem(head_id, "the head anchor is missing (rows may have been deleted)")]
        if anchor.mac == "":
            if anchor.head_id >= anchor.keyed_from:
                return [ChainProblem(head_id, "the head anchor is unsigned although keyed rows exist")]
        elif not self._keys.verify("audit-anchor", anchor.message(), anchor.mac):
            return [ChainProblem(head_id, "the head anchor's MAC does not hold (it was edited, or this process "
                                          "has another server key)")]
        if (anchor.row_count, anchor.head_id, anchor.head_hash) != (count, head_id, head_hash if count else ""):
            if anchor.head_id > head_id or anchor.row_count > count:
                return [ChainProblem(head_id + 1, f"rows {head_id + 1}..{anchor.head_id} at the head are missing "
                                                  "(the newest rows were deleted)")]
            return [ChainProblem(head_id, "the chain does not end where its head anchor says")]
        return []


async def verify_chain(db: Database, chain: AuditChain) -> list[ChainProblem]:
    return [found async for found in chain.verify(db) if isinstance(found, ChainProblem)]


FlushObserver = Callable[[int, float, bool], None]
"""`(entries, seconds, failed)` after each write that had something to write (for monitoring)."""


class AuditLog:
    """An `AuditSink` over a database, writing in groups, never stopped by a busy store."""

    def __init__(self, db: Database, chain: AuditChain, *, flush_interval: float = 0.05,
                 max_pending: int = MAX_PENDING) -> None:
        self._db = db
        self.chain = chain
        self._interval = flush_interval
        self._max_pending = max_pending
        self._pending: list[AuditEntry | PendingEntry] = []
        self._closed = False
        self._flush_lock = anyio.Lock()
        self.failures = 0
        """Consecutive failed writes (a busy or unreachable store)."""
        self.on_flush: FlushObserver | None = None

    def record(self, entry: AuditEntry | PendingEntry) -> None:
        if self._closed:
            raise StoreError("The audit log is closed; no call may run without an audit record.")
        self._pending.append(entry)

    @property
    def depth(self) -> int:
        """Entries waiting to be written."""
        return len(self._pending)

    def accepting(self) -> bool:
        """False while the buffer is full: new work would run without a durable record soon enough."""
        return len(self._pending) < self._max_pending

    async def run(self) -> None:
        """Flush periodically until cancelled; a failed write is retried with backoff, never raised."""
        while True:
            await anyio.sleep(self._interval if not self.failures else
                              RETRY_BACKOFF[min(self.failures, len(RETRY_BACKOFF)) - 1])
            if self._pending:
                try:
                    await self.flush()
                except StoreError as exc:
                    logger.warning("Audit entries wait (%d): %s; retrying", len(self._pending), exc.message)
                except Exception:
                    logger.exception("Writing %d audit entries failed; retrying", len(self._pending))

    async def flush(self) -> None:
        async with self._flush_lock:
            batch, self._pending = self._pending, []
            if not batch:
                return
            started = time.perf_counter()
            try:
                entries = [item if isinstance(item, AuditEntry) else item() for item in batch]  # before the lock
                async with self._db.transaction() as tx:
                    await self.chain.append(tx, entries)
            except BaseException:
                # Keep them for the next round rather than lose the record of what happened.
                self._pending[:0] = batch  # a pending entry builds the same entry again
                self.failures += 1
                self._flushed(len(batch), started, failed=True)
                raise
            self.failures = 0
            self._flushed(len(batch), started, failed=False)

    def _flushed(self, entries: int, started: float, *, failed: bool) -> None:
        if self.on_flush is not None:
            self.on_flush(entries, time.perf_counter() - started, failed)

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            for delay in (0, *RETRY_BACKOFF):
                await anyio.sleep(delay)
                try:
                    await self.flush()
                    break
                except Exception:
                    logger.exception("Writing the last %d audit entries failed", len(self._pending))
            self._closed = True


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
    return [_listed(row) for row in rows]


def _listed(row: Row) -> Row:
    """An audit row as `audit list` shows it. One written around the store is listed as it reads: the listing
    is how an operator looks into it."""
    readable = as_text(row)
    return {**readable, "detail": json_object(readable["detail"]) or {}}

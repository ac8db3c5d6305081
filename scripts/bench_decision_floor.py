"""The floor under a decision: the same commits a decision makes, with nothing of mcp-knecht around them.

    python scripts/bench_decision_floor.py [--proposals 2000] [--approvers 8] [--order lockstep|shuffled]
                                           [--claim-flush after-lock|in-commit] [--db postgresql://…]
                                           [--pg-statements separate|joined] [--json]

What does a decided-and-executed proposal cost at the least, on this machine, in Python? Each of K
racing processes tries every proposal (as `bench_approvals.py` does) with the bare driver — `sqlite3`
for SQLite, `asyncpg` for PostgreSQL — and only the statements a decision cannot do without:

    read the proposal; pending? ──no──▶ lost (nothing written)
    claim    one durable transaction: lock, re-read, insert the approval, UPDATE … WHERE status =
             'pending', the audit row; SQLite: committed at `NORMAL`, then flushed once the writers'
             lock is let go, with the store's own `WalFlush` (`--claim-flush in-commit`:
             `synchronous = FULL`, the disk waited for inside the lock, as before 2026-12-06)
    effect   the tool's own write (one row) and its audit row, committed
    finish   UPDATE … SET status = 'succeeded' and its audit row, committed (not flushed)

On PostgreSQL, `--pg-statements joined` makes each of the three transactions one statement (a `WITH` of
data-modifying statements, committed on its own; the claim's UPDATE … WHERE status = 'pending' returns
the arguments): 4 round trips a decision instead of 16, the fewest these commits can take.

No seals, no hash chain, no gate, no validation, no event loop on SQLite, no notification outbox:
every cost mcp-knecht adds is left out, so no implementation of these guarantees in Python on these
cores can decide faster than this. SQLite writers queue on a `flock` (as the store does); PostgreSQL
claims with `SELECT … FOR UPDATE` (joined: with the UPDATE itself). Baseline in the same run: one
process alone. Prints decisions/s, CPU per decision, and the disk's `fdatasync` rate beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mcp_knecht.store.wal_sync import WalFlush, share_database_file  # noqa: E402
from scripts.bench_approvals import fsync_rate, run_approvers  # noqa: E402
from scripts.bench_http import cpu_seconds  # noqa: E402

SCHEMA = [
    "CREATE TABLE IF NOT EXISTS floor_proposals (id INTEGER PRIMARY KEY, status TEXT NOT NULL,"
    " decided_by TEXT, decided_at TEXT, finished_at TEXT, arguments_json TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS floor_approvals (id INTEGER PRIMARY KEY, proposal_id INTEGER NOT NULL,"
    " operator TEXT NOT NULL, approved_at TEXT NOT NULL, UNIQUE (proposal_id, operator))",
    "CREATE TABLE IF NOT EXISTS floor_audit (id INTEGER PRIMARY KEY, at TEXT NOT NULL, subject TEXT NOT NULL,"
    " outcome TEXT NOT NULL, proposal_id INTEGER, detail_json TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS floor_effects (id INTEGER PRIMARY KEY, label TEXT NOT NULL)",
]
PG_SCHEMA = [s.replace("INTEGER PRIMARY KEY", "BIGSERIAL PRIMARY KEY") for s in SCHEMA]


def _cpu_seconds() -> float:
    return cpu_seconds(os.getpid())


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())


def _order(first: int, last: int, seed: int | None) -> list[int]:
    ids = list(range(first, last + 1))
    if seed is not None:
        random.Random(seed).shuffle(ids)
    return ids


# --- SQLite: the sqlite3 module, no event loop -------------------------------------------------


CLAIM_FLUSHES = ("after-lock", "in-commit")
PG_STATEMENTS = ("separate", "joined")


class _SQLiteWriter:
    def __init__(self, path: str, claim_flush: str = "after-lock") -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = NORMAL")
        self.conn.execute("PRAGMA busy_timeout = 15000")
        self.queue = os.open(f"{path}-floor-writers", os.O_RDWR | os.O_CREAT, 0o600)
        self.path = path
        self.flush_in_commit = claim_flush == "in-commit"
        # Held, never released, for as long as the worker's process lives, as the store holds it for as
        # long as it is open: a flush must not open and close the database file (`store.wal_sync`).
        self.database_fd = share_database_file(path)

    def transaction(self, statements: list[tuple[str, tuple[Any, ...]]], *, durable: bool,
                    guard: tuple[str, tuple[Any, ...]] | None = None) -> bool:
        """Run `statements` in one write transaction; `guard` (a SELECT) must return 'pending' first.
        `durable`: on disk before this returns."""
        # The store's own flush after the lock (the WAL's fdatasync, and the database file's if the WAL restarted).
        wal = (WalFlush.open(self.path, self.database_fd)
               if durable and not self.flush_in_commit and self.database_fd is not None else None)
        full = durable and wal is None
        try:
            fcntl.flock(self.queue, fcntl.LOCK_EX)
            try:
                if full:
                    self.conn.execute("PRAGMA synchronous = FULL")
                self.conn.execute("BEGIN IMMEDIATE")
                if guard is not None and self.conn.execute(*guard).fetchone()[0] != "pending":
                    self.conn.execute("ROLLBACK")
                    return False
                for sql, params in statements:
                    self.conn.execute(sql, params)
                if wal is not None:
                    wal.note()
                self.conn.execute("COMMIT")
            finally:
                if full:
                    self.conn.execute("PRAGMA synchronous = NORMAL")
                fcntl.flock(self.queue, fcntl.LOCK_UN)
            if wal is not None:
                wal.sync()
            return True
        finally:
            if wal is not None:
                wal.close()


def sqlite_worker(path: str, name: str, first: int, last: int, seed: int | None,
                  claim_flush: str = "after-lock") -> dict[str, Any]:
    writer = _SQLiteWriter(path, claim_flush)
    reader = sqlite3.connect(path, isolation_level=None)
    won = lost = 0
    started, cpu = time.perf_counter(), _cpu_seconds()
    for pid in _order(first, last, seed):
        if reader.execute("SELECT status FROM floor_proposals WHERE id = ?", (pid,)).fetchone()[0] != "pending":
            lost += 1
            continue
        now = _now()
        claimed = writer.transaction([
            ("INSERT INTO floor_approvals (proposal_id, operator, approved_at) VALUES (?, ?, ?)", (pid, name, now)),
            ("UPDATE floor_proposals SET status = 'executing', decided_by = ?, decided_at = ?"
             " WHERE id = ? AND status = 'pending'", (name, now, pid)),
            ("INSERT INTO floor_audit (at, subject, outcome, proposal_id, detail_json) VALUES (?, ?, ?, ?, ?)",
             (now, name, "approved", pid, json.dumps({"approvals": [name]}))),
        ], durable=True, guard=("SELECT status FROM floor_proposals WHERE id = ?", (pid,)))
        if not claimed:
            lost += 1
            continue
        arguments = json.loads(reader.execute("SELECT arguments_json FROM floor_proposals WHERE id = ?",
                                              (pid,)).fetchone()[0])
        writer.transaction([
            ("INSERT INTO floor_effects (label) VALUES (?)", (arguments["label"],)),
            ("INSERT INTO floor_audit (at, subject, outcome, proposal_id, detail_json) VALUES (?, ?, ?, ?, ?)",
             (now, "proposer", "ran", pid, "{}")),
        ], durable=False)
        writer.transaction([
            ("UPDATE floor_proposals SET status = 'succeeded', finished_at = ? WHERE id = ? AND status = 'executing'",
             (_now(), pid)),
            ("INSERT INTO floor_audit (at, subject, outcome, proposal_id, detail_json) VALUES (?, ?, ?, ?, ?)",
             (now, name, "executed", pid, "{}")),
        ], durable=False)
        won += 1
    return {"won": won, "lost": lost, "seconds": time.perf_counter() - started, "cpu_seconds": _cpu_seconds() - cpu}


def sqlite_stage(path: str, count: int, tag: str) -> tuple[int, int]:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    for statement in SCHEMA:
        conn.execute(statement)
    conn.execute("BEGIN")
    ids = [conn.execute("INSERT INTO floor_proposals (status, arguments_json) VALUES ('pending', ?) RETURNING id",
                        (json.dumps({"label": f"{tag}-{n}"}),)).fetchone()[0] for n in range(count)]
    conn.execute("COMMIT")
    conn.close()
    return min(ids), max(ids)


def sqlite_effects(path: str, tag: str) -> dict[str, int]:
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT label, COUNT(*) FROM floor_effects WHERE label LIKE ? GROUP BY label",
                        (f"{tag}-%",)).fetchall()
    conn.close()
    return dict(rows)


# --- PostgreSQL: asyncpg, the driver the store uses ----------------------------------------------


async def pg_worker(url: str, name: str, first: int, last: int, seed: int | None) -> dict[str, Any]:
    import asyncpg

    conn = await asyncpg.connect(url)
    won = lost = 0
    started, cpu = time.perf_counter(), _cpu_seconds()
    audit = "INSERT INTO floor_audit (at, subject, outcome, proposal_id, detail_json) VALUES ($1, $2, $3, $4, $5)"
    for pid in _order(first, last, seed):
        if await conn.fetchval("SELECT status FROM floor_proposals WHERE id = $1", pid) != "pending":
            lost += 1
            continue
        now = _now()
        async with conn.transaction():
            if await conn.fetchval("SELECT status FROM floor_proposals WHERE id = $1 FOR UPDATE", pid) != "pending":
                lost += 1
                continue
            await conn.execute("INSERT INTO floor_approvals (proposal_id, operator, approved_at) VALUES ($1, $2, $3)",
                               pid, name, now)
            await conn.execute("UPDATE floor_proposals SET status = 'executing', decided_by = $1, decided_at = $2"
                               " WHERE id = $3 AND status = 'pending'", name, now, pid)
            await conn.execute(audit, now, name, "approved", pid, json.dumps({"approvals": [name]}))
        arguments = json.loads(await conn.fetchval("SELECT arguments_json FROM floor_proposals WHERE id = $1", pid))
        async with conn.transaction():
            await conn.execute("INSERT INTO floor_effects (label) VALUES ($1)", arguments["label"])
            await conn.execute(audit, now, "proposer", "ran", pid, "{}")
        async with conn.transaction():
            await conn.execute("UPDATE floor_proposals SET status = 'succeeded', finished_at = $1"
                               " WHERE id = $2 AND status = 'executing'", _now(), pid)
            await conn.execute(audit, now, name, "executed", pid, "{}")
        won += 1
    result = {"won": won, "lost": lost, "seconds": time.perf_counter() - started, "cpu_seconds": _cpu_seconds() - cpu}
    await conn.close()
    return result


PG_JOINED_CLAIM = (
    "WITH claimed AS (UPDATE floor_proposals SET status = 'executing', decided_by = $1, decided_at = $2"
    " WHERE id = $3 AND status = 'pending' RETURNING id, arguments_json),"
    " approval AS (INSERT INTO floor_approvals (proposal_id, operator, approved_at) SELECT id, $1, $2 FROM claimed),"
    " audit AS (INSERT INTO floor_audit (at, subject, outcome, proposal_id, detail_json)"
    " SELECT $2, $1, 'approved', id, $4 FROM claimed)"
    " SELECT arguments_json FROM claimed"
)
PG_JOINED_EFFECT = (
    "WITH effect AS (INSERT INTO floor_effects (label) VALUES ($1))"
    " INSERT INTO floor_audit (at, subject, outcome, proposal_id, detail_json) VALUES ($2, 'proposer', 'ran', $3, '{}')"
)
PG_JOINED_FINISH = (
    "WITH finished AS (UPDATE floor_proposals SET status = 'succeeded', finished_at = $1"
    " WHERE id = $2 AND status = 'executing')"
    " INSERT INTO floor_audit (at, subject, outcome, proposal_id, detail_json) VALUES ($3, $4, 'executed', $2, '{}')"
)


async def pg_joined_worker(url: str, name: str, first: int, last: int, seed: int | None) -> dict[str, Any]:
    """Each transaction one statement (its own commit): a decision in 4 round trips — the read, the claim
    (which returns the arguments), the effect, the finish. Under READ COMMITTED the claim's UPDATE … WHERE
    status = 'pending' waits for a racing claim of the row and then checks the row as it was left, so only
    one of them claims it."""
    import asyncpg

    conn = await asyncpg.connect(url)
    won = lost = 0
    started, cpu = time.perf_counter(), _cpu_seconds()
    for pid in _order(first, last, seed):
        if await conn.fetchval("SELECT status FROM floor_proposals WHERE id = $1", pid) != "pending":
            lost += 1
            continue
        now = _now()
        arguments_json = await conn.fetchval(PG_JOINED_CLAIM, name, now, pid, json.dumps({"approvals": [name]}))
        if arguments_json is None:
            lost += 1
            continue
        await conn.execute(PG_JOINED_EFFECT, json.loads(arguments_json)["label"], now, pid)
        await conn.execute(PG_JOINED_FINISH, _now(), pid, now, name)
        won += 1
    result = {"won": won, "lost": lost, "seconds": time.perf_counter() - started, "cpu_seconds": _cpu_seconds() - cpu}
    await conn.close()
    return result


async def pg_stage(url: str, count: int, tag: str) -> tuple[int, int]:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        for statement in PG_SCHEMA:
            await conn.execute(statement)
        rows = await conn.fetch(
            "INSERT INTO floor_proposals (status, arguments_json) SELECT 'pending',"
            " json_build_object('label', $1 || '-' || n)::text FROM generate_series(0, $2 - 1) AS n RETURNING id",
            tag, count)
        ids = [row["id"] for row in rows]
        return min(ids), max(ids)
    finally:
        await conn.close()


async def pg_effects(url: str, tag: str) -> dict[str, int]:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT label, COUNT(*) AS n FROM floor_effects WHERE label LIKE $1 GROUP BY label",
                                f"{tag}-%")
        return {row["label"]: row["n"] for row in rows}
    finally:
        await conn.close()


# --- the race ------------------------------------------------------------------------------------


def _race(db: str, approvers: int, first: int, last: int, shuffled: bool,
          mode: str) -> list[dict[str, Any]]:
    """`mode`: SQLite's claim flush, or PostgreSQL's statements (`separate`, `joined`)."""
    return run_approvers([[sys.executable, __file__, "--worker", db, f"operator-{i}", str(first), str(last),
                           str(i) if shuffled else "-", mode] for i in range(approvers)])


def run(proposals: int, approvers: int, db_url: str | None, order: str,
        claim_flush: str = "after-lock", pg_statements: str = "separate") -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        db = db_url or str(Path(folder) / "floor.db")
        postgres = db.startswith("postgres")
        tag = f"floor{time.time_ns()}"
        if postgres:
            stage = lambda n, t: asyncio.run(pg_stage(db, n, t))  # noqa: E731
            effects = lambda t: asyncio.run(pg_effects(db, t))  # noqa: E731
        else:
            stage, effects = (lambda n, t: sqlite_stage(db, n, t)), (lambda t: sqlite_effects(db, t))
        solo_range, race_range = stage(proposals, f"{tag}solo"), stage(proposals, f"{tag}race")
        fsyncs = fsync_rate(folder)
        mode = pg_statements if postgres else claim_flush
        solo = _race(db, 1, *solo_range, shuffled=False, mode=mode)[0]
        reports = _race(db, approvers, *race_range, shuffled=order == "shuffled", mode=mode)
        counted = effects(f"{tag}race")
    won = sum(r["won"] for r in reports)
    race_seconds = max(r["seconds"] for r in reports)
    return {
        "database": "postgresql" if postgres else "sqlite", "proposals": proposals, "approvers": approvers,
        "order": order, "claim_flush": None if postgres else claim_flush,
        "pg_statements": pg_statements if postgres else None, "cpus": os.cpu_count(),
        "fdatasync_per_s": round(fsyncs),
        "baseline_decisions_per_s": round(proposals / solo["seconds"], 1),
        "baseline_cpu_ms_per_decision": round(solo["cpu_seconds"] / proposals * 1000, 3),
        "race_decisions_per_s": round(won / race_seconds, 1),
        "race_cpu_ms_per_decision": round(sum(r["cpu_seconds"] for r in reports) / max(won, 1) * 1000, 3),
        "ratio_race_to_baseline": round((won / race_seconds) / (proposals / solo["seconds"]), 2),
        "double_executions": sum(1 for n in counted.values() if n > 1),
        "missing_executions": proposals - len(counted),
    }


def main() -> None:
    if len(sys.argv) == 8 and sys.argv[1] == "--worker":
        db, name, first, last, seed = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
        shuffle_seed = None if seed == "-" else int(seed)
        if db.startswith("postgres"):
            worker = pg_joined_worker if sys.argv[7] == "joined" else pg_worker
            result = asyncio.run(worker(db, name, first, last, shuffle_seed))
        else:
            result = sqlite_worker(db, name, first, last, shuffle_seed, sys.argv[7])
        print(json.dumps(result))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--proposals", type=int, default=2000)
    parser.add_argument("--approvers", type=int, default=8)
    parser.add_argument("--order", choices=("lockstep", "shuffled"), default="lockstep")
    parser.add_argument("--claim-flush", choices=CLAIM_FLUSHES, default="after-lock",
                        help="SQLite: when the claim's commit reaches the disk (default: after the writers' lock,"
                             " as the store does)")
    parser.add_argument("--pg-statements", choices=PG_STATEMENTS, default="separate",
                        help="PostgreSQL: each statement its own round trip in BEGIN … COMMIT, as the store does"
                             " (separate), or each transaction one statement, 4 round trips a decision (joined)")
    parser.add_argument("--db", help="a PostgreSQL URL (default: a temporary SQLite file)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.proposals, args.approvers, args.db, args.order, args.claim_flush, args.pg_statements)
    if args.json:
        print(json.dumps(result))
        return
    print(f"floor: bare {'asyncpg' if result['database'] == 'postgresql' else 'sqlite3'}, the commits of a decision"
          f" and nothing else  ({result['cpus']} cpus; {result['fdatasync_per_s']} fdatasync/s"
          f"{'' if result['claim_flush'] is None else '; the claim flushed ' + result['claim_flush']}"
          f"{'' if result['pg_statements'] is None else '; statements ' + result['pg_statements']})")
    print(f"1 approver            {result['baseline_decisions_per_s']:>8} decisions/s"
          f"  ({result['baseline_cpu_ms_per_decision']} ms CPU per decision)")
    print(f"{args.approvers} racing, {args.order:<9} {result['race_decisions_per_s']:>8} decisions/s"
          f"  ({result['race_cpu_ms_per_decision']} ms CPU per decision won, all approvers;"
          f" ratio {result['ratio_race_to_baseline']}x)")
    print(f"double executions     {result['double_executions']}    missing {result['missing_executions']}")


if __name__ == "__main__":
    main()

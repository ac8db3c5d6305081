"""SQLite plans each statement by the statistics it last gathered (`PRAGMA optimize` when a store is
closed), and a store keeps growing after that for as long as its server runs. The reads that must stay
fast at scale find their index whatever those statistics say."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from mcp_knecht.core.database import by_keys
from mcp_knecht.store.proposals import _expiry_sweep, _listing, _settled

SCHEMA = Path(__file__).resolve().parent.parent / "mcp_knecht" / "store" / "sql" / "sqlite"
NOW = "2026-12-07T12:00:00.000000Z"


@pytest.fixture
def store(tmp_path: Path) -> sqlite3.Connection:
    """The store's schema, with statistics taken while every proposal was pending."""
    db = sqlite3.connect(tmp_path / "plans.db")
    for migration in sorted(SCHEMA.glob("*.sql")):
        db.executescript(migration.read_text())
    db.executescript(
        "WITH RECURSIVE n(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM n WHERE k < 2000)"
        " INSERT INTO proposals (tool, arguments_json, arguments_hash, proposer_subject, proposer_client,"
        " proposer_scopes, rule, status, created_at, expires_at)"
        " SELECT 'record_effect', '{}', 'h' || k, 'agent-' || (k % 7), 'pytest', '', 'default', 'pending',"
        " '2026-12-07T00:00:00.000000Z', '2030-01-01T00:00:00.000000Z' FROM n;"
        "ANALYZE;")
    return db


def plan(db: sqlite3.Connection, statement: tuple[str, tuple[object, ...]]) -> str:
    sql, params = statement
    return " / ".join(row[3] for row in db.execute(f"EXPLAIN QUERY PLAN {sql}", params))


def test_a_listing_by_status_reads_the_status_index_not_every_proposal(store: sqlite3.Connection) -> None:
    """Nor the index of overdue ones: on a plain `expires_at` the planner took it for the pending listing."""
    for status in ("succeeded", "failed", "pending"):
        steps = plan(store, _listing("sqlite", status, None, 0, None, False, 51, NOW))
        assert "USING INDEX proposals_by_status" in steps and "proposals_overdue" not in steps, steps
        steps = plan(store, _listing("sqlite", status, "agent-3", 0, None, False, 21, NOW))
        assert "USING INDEX proposals_by_subject_status" in steps and "proposals_overdue" not in steps, steps


def test_with_the_statistics_of_a_million_proposals_the_pending_stay_on_the_status_index(
    store: sqlite3.Connection,
) -> None:
    """The statistics `ANALYZE` took over `scripts/bench_scale.py`'s 1,000,000 (a tenth pending), where an index
    of plain `expires_at` drew a statement with `LIMIT 100` onto it (see sql/sqlite/0009_overdue_index.sql)."""
    store.executescript(
        "DELETE FROM sqlite_stat1 WHERE tbl = 'proposals';"
        "INSERT INTO sqlite_stat1 VALUES ('proposals', 'proposals_overdue', '100000 100000'),"
        " ('proposals', 'proposals_by_subject_status', '1000000 21277 4256 1'),"
        " ('proposals', 'proposals_unseen', '1000000 21277 21277 1'),"
        " ('proposals', 'proposals_by_call', '1000000 21277 1 1'),"
        " ('proposals', 'proposals_by_subject', '1000000 21277 1'),"
        " ('proposals', 'proposals_by_status', '1000000 200000 1');"
        "ANALYZE sqlite_schema;")  # reads sqlite_stat1 again
    steps = plan(store, _listing("sqlite", "pending", None, 0, None, False, 101, NOW))
    assert steps == "SEARCH proposals USING INDEX proposals_by_status (status=?)", steps
    steps = plan(store, _listing("sqlite", "expired", None, 0, None, False, 101, NOW))
    assert "proposals_overdue (<expr><?)" in steps and "proposals_by_status (status=?)" in steps, steps


@pytest.mark.parametrize("subject", [None, "agent-3"])
@pytest.mark.parametrize(("after_id", "before_id", "oldest_first"), [(0, None, False), (0, 1500, False),
                                                                      (700, None, True)])
def test_a_listing_of_expired_reads_the_overdue_by_their_expiry_and_the_rest_by_status(
    store: sqlite3.Connection, subject: str | None, after_id: int, before_id: int | None, oldest_first: bool,
) -> None:
    """With `status IN ('expired', 'pending')` every pending row was read and sorted for a page. (A later
    page's written ones, with these statistics, walk the id range instead: as for any status, see above.)"""
    steps = plan(store, _listing("sqlite", "expired", subject, after_id, before_id, oldest_first, 51, NOW))
    assert "SEARCH proposals USING INDEX proposals_overdue (<expr><?)" in steps and "SCAN proposals" not in steps
    if not after_id and before_id is None:
        written = "by_status (status=?)" if subject is None else "by_subject_status (proposer_subject=? AND status=?)"
        assert f"SEARCH proposals USING INDEX proposals_{written}" in steps, steps


def test_the_expiry_sweep_reads_the_overdue_by_their_expiry(store: sqlite3.Connection) -> None:
    steps = plan(store, (_expiry_sweep("sqlite"), (NOW,)))
    assert steps == "SEARCH proposals USING INDEX proposals_overdue (<expr><?)", steps


def test_a_look_at_many_waiting_proposals_reads_each_by_key(store: sqlite3.Connection) -> None:
    """Statistics from a hundred proposals, the table grown to thousands: `id IN (…)` scanned all of it,
    for each chunk of ids the watcher asked about."""
    store.executescript("DELETE FROM sqlite_stat1; DELETE FROM proposals WHERE id > 100; ANALYZE;"
                        "WITH RECURSIVE n(k) AS (SELECT 101 UNION ALL SELECT k + 1 FROM n WHERE k < 20000)"
                        " INSERT INTO proposals (tool, arguments_json, arguments_hash, proposer_subject,"
                        " proposer_client, proposer_scopes, rule, status, created_at, expires_at)"
                        " SELECT 'record_effect', '{}', 'h' || k, 'agent', 'pytest', '', 'default', 'pending',"
                        " '2026-12-07T00:00:00.000000Z', '2030-01-01T00:00:00.000000Z' FROM n;")
    steps = plan(store, _settled("sqlite", list(range(1, 501)), NOW))
    assert "SEARCH p USING INTEGER PRIMARY KEY" in steps and "SCAN p" not in steps and "BLOOM" not in steps, steps


def test_a_page_of_proposals_reads_its_approvals_by_key(store: sqlite3.Connection) -> None:
    """Every listing page reads its proposals' approvals: with statistics from a small table, `IN` walked all."""
    store.executescript("INSERT INTO proposal_approvals (proposal_id, operator, person, approved_at, seal)"
                        " SELECT id, 'bob', 'bob', '2026', 'seal' FROM proposals WHERE id <= 100; ANALYZE;"
                        "INSERT INTO proposal_approvals (proposal_id, operator, person, approved_at, seal)"
                        " SELECT id, 'bob', 'bob', '2026', 'seal' FROM proposals WHERE id > 100;")
    source, match, params = by_keys("sqlite", "proposal_approvals a", "a.proposal_id", list(range(1900, 2000)))
    steps = plan(store, (f"SELECT a.* FROM {source} WHERE {match} ORDER BY a.id", params))
    assert "SEARCH a USING INDEX" in steps and "SCAN a" not in steps, steps


@pytest.mark.anyio
async def test_a_store_that_grows_while_open_refreshes_the_statistics_it_plans_by(tmp_path: Path) -> None:
    from mcp_knecht.store.sqlite import CHECKPOINT_ROWS, SQLiteDatabase

    url = f"sqlite:///{tmp_path / 'growing.db'}"
    db = await SQLiteDatabase.open(url)
    try:
        async with db.transaction() as tx:
            await tx.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, kind TEXT NOT NULL)")
            await tx.execute("CREATE INDEX events_by_kind ON events (kind, id)")
            await tx.execute_many("INSERT INTO events (kind) VALUES (?)", [("a",)] * 100)
            await tx.execute("ANALYZE")
        assert await db.lookup("SELECT id FROM events WHERE kind = ? ORDER BY id DESC LIMIT 1", ("b",)) == []
        async with db.transaction() as tx:  # 25-fold and more: enough rows for the next checkpoint, too
            await tx.execute_many("INSERT INTO events (kind) VALUES (?)", [("b",)] * max(2_600, CHECKPOINT_ROWS))
        rows = await db.fetch_all("SELECT stat FROM sqlite_stat1 WHERE idx = 'events_by_kind'")
    finally:
        await db.close()
    assert int(rows[0]["stat"].split()[0]) > 2_000  # taken again while open, not at 100

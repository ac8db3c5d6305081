"""A database made by the previous release (0.1.0) opens with this one and migrates in place:
nothing lost, proposals decidable as before, the audit chain intact (`mcp-knecht audit verify`)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import asyncpg
import pytest

from mcp_knecht.app import open_app
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.settings import load_settings
from mcp_knecht.store.audit_log import verify_chain
from tests.staging import acli

pytestmark = pytest.mark.anyio

RELEASE = Path(__file__).parent / "data" / "release_0_1_0"
"""Made with release 0.1.0's own code: demo data (40 runs), three proposals (one approved and
executed, one rejected, one pending with a secret value) and nine audit rows."""


# The dump's pending proposal expired on 2026-12-02 (24 h after it was made); the upgrade is not about
# expiry, so it is restored as pending whatever today's date.
STILL_PENDING = "UPDATE proposals SET expires_at = '9999-12-31T00:00:00.000000Z' WHERE status = 'pending'"


async def _restore(url: str) -> None:
    if url.startswith("sqlite:///"):
        connection = sqlite3.connect(url.removeprefix("sqlite:///"))
        connection.executescript((RELEASE / "sqlite.sql").read_text(encoding="utf-8"))
        connection.execute(STILL_PENDING)
        connection.commit()
        connection.close()
        return
    parts = urlsplit(url)
    schema = parse_qs(parts.query)["search_path"][0]
    dump = (RELEASE / "postgresql.sql").read_text(encoding="utf-8")
    dump = dump.replace("CREATE SCHEMA __SCHEMA__;", "").replace("__SCHEMA__", schema)
    connection = await asyncpg.connect(parts._replace(query="").geturl())
    try:
        await connection.execute(dump)
        await connection.execute(STILL_PENDING.replace("proposals", f"{schema}.proposals"))
    finally:
        await connection.close()


async def test_a_release_0_1_0_database_migrates_in_place(database_url: str, env: dict[str, str]) -> None:
    await _restore(database_url)
    env = {**env, "KNECHT_DATABASE_URL": database_url}
    async with open_app(load_settings(env=env), watch_policy=False) as app:
        db = app.db
        assert await db.fetch_one("SELECT COUNT(*) AS n FROM runs") == {"n": 41}  # 40 and the approved rerun
        statuses = [(p.id, p.status, p.decided_by) for p in await app.proposals.list(oldest_first=True)]
        assert statuses == [(1, "succeeded", "bob"), (2, "rejected", "bob"), (3, "pending", None)]
        recorded = {(r["namespace"], r["version"]) for r in await db.fetch_all(
            "SELECT namespace, version FROM applied_migrations")}
        assert recorded >= {("store", 1), ("store", 2), ("store", 3), ("knecht", 1), ("knecht", 2), ("knecht", 3)}
        assert await verify_chain(db, app.audit.chain) == []

        # The new release works on the old rows: a call is audited onto the same chain, and the
        # pending proposal of the old release is still the exact call it was.
        actor = Actor("carol", "pytest", frozenset({"projects:read", "proposals:read"}))
        assert not (await app.gate.call_tool(actor, "list_projects", {})).is_error
        pending = await app.proposals.get(3)
        assert pending is not None and pending.arguments["name"] == "NEW_TOKEN"
        await app.audit.flush()
        assert await verify_chain(db, app.audit.chain) == []
        rows = await db.fetch_one("SELECT COUNT(*) AS n FROM audit_log")
        assert rows == {"n": 10}

    done = await acli("mcp-knecht", env, "audit", "verify")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "intact: 10 rows" in done.stdout

"""Versioned, named schema migrations per namespace, applied in order at start.

The store's own tables are namespace `store` (`sql/<dialect>/NNNN_name.sql` beside this module);
each toolset declares its own (`core.schema.Migrations`). Each file runs in its own transaction
together with its row in `applied_migrations`, so a failed migration leaves the schema as it was,
and processes starting at once apply each file exactly once.

Databases of release 0.1.0 recorded one global sequence in `schema_migrations`; it is adopted in
place (its versions mapped to their namespaces) the first time a newer release opens them.
"""

from __future__ import annotations

import re

from mcp_knecht.core import clock
from mcp_knecht.core.database import Database, Transaction
from mcp_knecht.core.schema import Migration, Migrations
from mcp_knecht.errors import StoreError

STORE_MIGRATIONS = Migrations("store", "mcp_knecht.store")

_TABLE = (
    "CREATE TABLE IF NOT EXISTS applied_migrations ("
    " namespace TEXT NOT NULL, version INTEGER NOT NULL, name TEXT NOT NULL, applied_at TEXT NOT NULL,"
    " PRIMARY KEY (namespace, version))"
)
LEGACY: dict[int, tuple[str, int, str]] = {
    1: ("knecht", 1, "knecht"),
    2: ("store", 1, "audit"),
    3: ("store", 2, "proposals"),
    4: ("knecht", 2, "run_filters"),
    5: ("store", 3, "proposal_display"),
    6: ("knecht", 3, "run_filter_pairs"),
}
"""Release 0.1.0's global migration versions and where each one lives now."""

_TABLE_EXISTS = {
    "sqlite": "SELECT 1 AS present FROM sqlite_master WHERE type = 'table' AND name = ?",
    "postgresql": "SELECT 1 AS present WHERE to_regclass(?) IS NOT NULL",
}


def _statements(sql: str) -> list[str]:
    # Migrations hold plain DDL; a statement ends at a semicolon at the end of a line.
    return [s.strip() for s in re.split(r";\s*$", sql, flags=re.MULTILINE) if s.strip()]


async def _recorded(db: Database) -> set[tuple[str, int]]:
    try:
        rows = await db.fetch_all("SELECT namespace, version FROM applied_migrations")
    except StoreError:  # a fresh database (or one of release 0.1.0) has no such table yet
        return set()
    return {(row["namespace"], row["version"]) for row in rows}


async def _adopt_legacy(tx: Transaction, dialect: str) -> None:
    """Record release 0.1.0's applied migrations under their namespaces, then drop its table."""
    if not await tx.fetch_one(_TABLE_EXISTS[dialect], ("schema_migrations",)):
        return
    for row in await tx.fetch_all("SELECT version, applied_at FROM schema_migrations"):
        if (target := LEGACY.get(row["version"])) is None:
            raise StoreError(
                f"This database has schema version {row['version']}, which this release does not know; "
                "it was made by a newer mcp-knecht."
            )
        namespace, version, name = target
        await tx.execute(
            "INSERT INTO applied_migrations (namespace, version, name, applied_at) VALUES (?, ?, ?, ?)",
            (namespace, version, name, str(row["applied_at"])),
        )
    await tx.execute("DROP TABLE schema_migrations")


async def apply_migrations(db: Database, *declared: Migrations) -> list[Migration]:
    """Apply the store's migrations and those `declared`, each not yet recorded; return those applied."""
    wanted = [m for migrations in (STORE_MIGRATIONS, *declared) for m in migrations.available(db.dialect)]
    if await _recorded(db) >= {(m.namespace, m.version) for m in wanted}:
        return []  # the common case at start: no write transaction, no lock
    async with db.transaction() as tx:
        await tx.lock("applied_migrations")
        await tx.execute(_TABLE)
        await _adopt_legacy(tx, db.dialect)
    done = []
    for migration in wanted:
        async with db.transaction() as tx:
            await tx.lock("applied_migrations")
            # Checked inside the lock: another process may have migrated meanwhile.
            if await tx.fetch_one("SELECT 1 AS present FROM applied_migrations WHERE namespace = ? AND version = ?",
                                  (migration.namespace, migration.version)):
                continue
            try:
                for statement in _statements(migration.sql):
                    await tx.execute(statement)
            except Exception as exc:
                raise StoreError(f"Migration {migration.label} failed: {exc}") from exc
            await tx.execute(
                "INSERT INTO applied_migrations (namespace, version, name, applied_at) VALUES (?, ?, ?, ?)",
                (migration.namespace, migration.version, migration.name, clock.timestamp()),
            )
        done.append(migration)
    return done

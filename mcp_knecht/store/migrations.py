"""Versioned, named schema migrations, applied in order at start.

Files live in `sql/<dialect>/NNNN_name.sql`. Each runs in its own transaction together with
its row in `schema_migrations`, so a failed migration leaves the schema as it was.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources

from mcp_knecht.errors import StoreError
from mcp_knecht.store.database import Database

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def available_migrations(dialect: str) -> list[Migration]:
    folder = resources.files("mcp_knecht.store") / "sql" / dialect
    found = []
    for entry in folder.iterdir():
        if match := _NAME.match(entry.name):
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    return sorted(found, key=lambda m: m.version)


def _statements(sql: str) -> list[str]:
    # Migrations hold plain DDL; a statement ends at a semicolon at the end of a line.
    return [s.strip() for s in re.split(r";\s*$", sql, flags=re.MULTILINE) if s.strip()]


async def _recorded_versions(db: Database) -> set[int]:
    try:
        return {row["version"] for row in await db.fetch_all("SELECT version FROM schema_migrations")}
    except StoreError:  # a fresh database has no schema_migrations table yet
        return set()


async def apply_migrations(db: Database) -> list[Migration]:
    """Apply the migrations not yet recorded; return those applied."""
    wanted = available_migrations(db.dialect)
    if await _recorded_versions(db) >= {m.version for m in wanted}:
        return []  # the common case at start: no write transaction, no lock
    async with db.transaction() as tx:
        await tx.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
        )
    applied = {row["version"] for row in await db.fetch_all("SELECT version FROM schema_migrations")}
    done = []
    for migration in wanted:
        if migration.version in applied:
            continue
        async with db.transaction() as tx:
            # Re-check inside the lock: another process may have migrated meanwhile.
            if await tx.fetch_one("SELECT 1 FROM schema_migrations WHERE version = ?", (migration.version,)):
                continue
            try:
                for statement in _statements(migration.sql):
                    await tx.execute(statement)
            except Exception as exc:
                raise StoreError(f"Migration {migration.version:04d}_{migration.name} failed: {exc}") from exc
            await tx.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                (migration.version, migration.name, datetime.now(UTC).isoformat(timespec="seconds")),
            )
        done.append(migration)
    return done

"""Persistence: the database interface, its backends, migrations and the audit log."""

from __future__ import annotations

from mcp_knecht.core.database import Database, Row, Transaction
from mcp_knecht.core.database_url import dialect_of


async def open_database(url: str, *, migrate: bool = True, blocking: bool = False) -> Database:
    """Open the store at `url` and bring its schema up to date. `blocking`: only for a process that does
    one thing at a time (a CLI deciding a proposal) — SQLite then waits for another process's write
    lock and for the disk in the caller's thread, not in a worker thread; PostgreSQL's waits are in
    the server either way."""
    dialect = dialect_of(url)
    if dialect == "sqlite":
        from mcp_knecht.store.sqlite import SQLiteDatabase

        db: Database = await SQLiteDatabase.open(url, blocking=blocking)
    else:
        from mcp_knecht.store.postgresql import PostgresDatabase

        db = await PostgresDatabase.open(url)
    if migrate:
        from mcp_knecht.store.migrations import apply_migrations

        await apply_migrations(db)
    return db


__all__ = ["Database", "Row", "Transaction", "open_database"]

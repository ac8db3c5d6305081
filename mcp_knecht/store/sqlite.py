"""SQLite backend (the embedded default): WAL, one reader and one writer connection.

Writes take the lock up front with `BEGIN IMMEDIATE`, so two processes (say, two operators'
CLIs) never deadlock on a read-to-write upgrade; they wait up to the busy timeout instead.

A database file this backend creates is private to its user (mode 0600, in a folder it creates
with mode 0700): it holds secret values, proposals and the audit log. SQLite gives its `-wal`
and `-shm` files the mode of the database file.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiosqlite
import anyio

from mcp_knecht.core.database import Params, Row
from mcp_knecht.core.database_url import normalise, sqlite_path
from mcp_knecht.errors import StoreBusyError
from mcp_knecht.store.health import store_error

BUSY_TIMEOUT_MS = 15_000
"""How long a write waits for another process's write lock before the caller hears "store busy"."""
_LOCK_POLL_FIRST, _LOCK_POLL_MAX = 0.0002, 0.004


def _create_private(path: Path) -> None:
    """Create an empty database file only its owner may read (SQLite fills an empty file)."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(FileExistsError):  # another process made it first
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _dict_row(cursor: sqlite3.Cursor, row: tuple[Any, ...]) -> Row:
    return {column[0]: value for column, value in zip(cursor.description, row, strict=True)}


async def _connect(path: str, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> aiosqlite.Connection:
    try:
        conn = await aiosqlite.connect(path, isolation_level=None)
    except sqlite3.Error as exc:
        raise store_error("sqlite", f"Cannot open SQLite database {path}: {exc}") from exc
    conn.row_factory = _dict_row  # type: ignore[assignment]  # aiosqlite types it as a class
    await conn.execute_fetchall(f"PRAGMA busy_timeout = {busy_timeout_ms}")
    await conn.execute_fetchall("PRAGMA foreign_keys = ON")
    # NORMAL under WAL: a commit survives a crash of the process; a power loss may lose the last
    # commits but never corrupts. A `durable` transaction (proposals, decisions) switches to FULL
    # for its own commit, which syncs the WAL before COMMIT returns.
    await conn.execute_fetchall("PRAGMA synchronous = NORMAL")
    return conn


class _SQLiteTransaction:
    """Driver errors become `StoreError` here, where they enter, as on every backend."""

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self._conn = conn

    async def fetch_all(self, sql: str, params: Params = ()) -> list[Row]:
        try:
            return list(await self._conn.execute_fetchall(sql, params))  # type: ignore[arg-type]
        except sqlite3.Error as exc:
            raise store_error("sqlite", f"Database statement failed: {exc}") from exc

    async def fetch_one(self, sql: str, params: Params = ()) -> Row | None:
        return next(iter(await self.fetch_all(sql, params)), None)

    async def execute(self, sql: str, params: Params = ()) -> int:
        try:
            cursor = await self._conn.execute(sql, params)
        except sqlite3.Error as exc:
            raise store_error("sqlite", f"Database statement failed: {exc}") from exc
        return cursor.rowcount

    async def execute_many(self, sql: str, rows: Sequence[Params]) -> None:
        try:
            await self._conn.executemany(sql, rows)
        except sqlite3.Error as exc:
            raise store_error("sqlite", f"Database statement failed: {exc}") from exc

    async def lock(self, name: str) -> None:
        """`BEGIN IMMEDIATE` already holds the database's single write lock."""


class SQLiteDatabase:
    dialect = "sqlite"

    def __init__(self, url: str, reader: aiosqlite.Connection, writer: aiosqlite.Connection) -> None:
        self.url = url
        self._reader = _SQLiteTransaction(reader)
        self._reader_conn = reader
        self._writer = writer
        self._write_lock = anyio.Lock()

    @classmethod
    async def open(cls, url: str) -> SQLiteDatabase:
        url = normalise(url)
        path = sqlite_path(url)
        try:
            _create_private(path)
        except OSError as exc:
            raise store_error("sqlite", f"Cannot create the database {path}: {exc.strerror}") from exc
        writer = await _connect(str(path))
        try:
            await writer.execute_fetchall("PRAGMA journal_mode = WAL")
            await writer.execute_fetchall("PRAGMA busy_timeout = 0")  # `_begin` waits for the write lock itself
        except sqlite3.Error as exc:
            await writer.close()
            raise store_error("sqlite", f"{path} is not a usable SQLite database: {exc}") from exc
        reader = await _connect(str(path))
        return cls(url, reader, writer)

    async def fetch_all(self, sql: str, params: Params = ()) -> list[Row]:
        return await self._reader.fetch_all(sql, params)

    async def fetch_one(self, sql: str, params: Params = ()) -> Row | None:
        return await self._reader.fetch_one(sql, params)

    async def stream(self, sql: str, params: Params = (), batch: int = 500) -> AsyncIterator[Row]:
        """Rows one batch at a time on a private connection, so a huge result never sits in memory."""
        conn = await _connect(sqlite_path(self.url).as_posix())
        try:
            cursor = await conn.execute(sql, params)
            while rows := await cursor.fetchmany(batch):
                for row in rows:
                    yield row  # type: ignore[misc]
        finally:
            await conn.close()

    @asynccontextmanager
    async def transaction(self, *, durable: bool = False) -> AsyncIterator[_SQLiteTransaction]:
        async with self._write_lock:
            if durable:
                await self._writer.execute("PRAGMA synchronous = FULL")
            try:
                async with self._in_transaction():
                    yield _SQLiteTransaction(self._writer)
            finally:
                if durable:
                    with anyio.CancelScope(shield=True):
                        await self._writer.execute("PRAGMA synchronous = NORMAL")

    async def _begin(self) -> None:
        """`BEGIN IMMEDIATE`, waiting for another process's write lock by polling every fraction of
        a millisecond (growing to 4 ms), up to `BUSY_TIMEOUT_MS`. SQLite's own busy handler sleeps
        in steps up to 100 ms, which leaves the lock idle while racing writers sleep."""
        deadline = anyio.current_time() + BUSY_TIMEOUT_MS / 1000
        pause = _LOCK_POLL_FIRST
        while True:
            try:
                await self._writer.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                    raise
                if anyio.current_time() >= deadline:
                    raise StoreBusyError(
                        f"The store is busy: another process has held its write lock for {BUSY_TIMEOUT_MS / 1000:g} s."
                        " Nothing was changed; retry in a moment.") from exc
            await anyio.sleep(pause * (0.5 + random.random()))
            pause = min(pause * 1.5, _LOCK_POLL_MAX)

    @asynccontextmanager
    async def _in_transaction(self) -> AsyncIterator[None]:
        try:
            await self._begin()
        except StoreBusyError:
            raise
        except sqlite3.Error as exc:
            raise store_error("sqlite", f"Cannot start a write transaction: {exc}") from exc
        except BaseException:
            # Cancelled while waiting (a client went away while another process held the lock): the
            # driver's thread still runs the BEGIN. Queue a ROLLBACK behind it, or the connection stays
            # inside that transaction and every later write fails.
            with anyio.CancelScope(shield=True), contextlib.suppress(sqlite3.Error):
                await self._writer.execute("ROLLBACK")
            raise
        try:
            yield
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._writer.execute("ROLLBACK")
            raise
        try:
            with anyio.CancelScope(shield=True):
                await self._writer.execute("COMMIT")
        except sqlite3.Error as exc:
            raise store_error("sqlite", f"Commit failed: {exc}") from exc

    async def close(self) -> None:
        with anyio.CancelScope(shield=True):
            try:  # SQLite's advice: refresh planner statistics where they went stale, cheaply
                await self._writer.execute_fetchall("PRAGMA analysis_limit = 1000")
                await self._writer.execute_fetchall("PRAGMA optimize")
            except sqlite3.Error:
                pass  # statistics are an optimisation; never fail a shutdown over them
            await self._reader_conn.close()
            await self._writer.close()

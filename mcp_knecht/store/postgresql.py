"""PostgreSQL backend (for teams: several replicas, several operators) on asyncpg.

Every difference from SQLite lives in this module and in `sql/postgresql/`:

- placeholders: callers write `?`; `translate_placeholders` turns them into `$1, $2, …`
  (skipping string literals, quoted identifiers, dollar quotes and comments), once per SQL text;
- row counts: asyncpg reports a command tag ("UPDATE 1"); `execute` returns its number;
- `tx.lock(name)`: `pg_advisory_xact_lock` on a stable 64-bit hash of the name, held until the
  transaction ends, so writers on every replica serialise (SQLite's single write lock does this
  by itself);
- explicit ids: an `INSERT INTO t (id, …)` does not advance `t`'s identity sequence, so the
  transaction remembers such tables and moves their sequences past the largest id before the
  next insert that relies on the sequence, and before it commits (demo data and the audit chain
  insert explicit ids). Only this literal shape (`INSERT INTO t (id, …`) is recognised;
  `sync_sequences()` catches up after anything else;
- transactions run at READ COMMITTED: a conditional `UPDATE … WHERE status = 'pending'` that
  loses a race re-reads the row after the winner commits and matches nothing, so exactly one
  caller sees a row change; each statement after `lock()` sees what the previous holder committed;
- BEGIN goes out with a transaction's first statement, not when it opens: before a `lock()` in
  the same message (`BEGIN; SELECT pg_advisory_xact_lock(…)`, one round trip where there were
  two: a decision's claim, a staged proposal, every audit flush), and a transaction that runs no
  statement sends neither BEGIN nor COMMIT. At READ COMMITTED each statement takes its own
  snapshot, so when BEGIN arrives changes nothing a statement sees;
- `fetch_all_with(writes, sql)`: `WITH _w0 AS (write), … sql`, one round trip (an approval with its
  claim, an audit row with the chain's head). The statements of such a WITH share one snapshot and
  run in no set order, which is why callers may only join writes that do not depend on each other;
- `lock_and_fetch_one(name, sql)`: the lock taken in the WHERE clause of the read that follows it,
  which locks its row FOR UPDATE, so it reads the row as the lock's previous holder committed it
  (the audit chain's anchor): one round trip where there were two, in every decision's claim and
  finish;
- `execute_with_next(write)`: held back, then sent as such a WITH of the next `lock()`,
  `lock_and_fetch_one` or `fetch_all_with` (a status change's outbox event goes with the audit
  chain's lock: one round trip fewer in every decision's claim and finish), or on its own before
  any other statement or COMMIT;
- waits are bounded, as SQLite's busy timeout bounds them: every session sets `lock_timeout`
  (`LOCK_TIMEOUT`), so a statement that waits that long for a lock (an advisory lock, a row, a
  table) fails with `StoreBusyError` and its transaction is rolled back, instead of every writer
  queueing for ever behind a process that was stopped (SIGSTOP, a debugger) or cut off while it held
  one. And `idle_in_transaction_session_timeout` (`IDLE_IN_TRANSACTION_TIMEOUT`) lets the server end
  such a holder's session, rolling its transaction back, so the locks come free without anyone
  killing it: none of our transactions waits between statements for anything but the database.
  The URL may set either (`?lock_timeout=30s`); a setting it names is left as it says.

Driver errors (asyncpg's, and OS errors of the connection) become `StoreError` here.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import lru_cache
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import anyio
import asyncpg

from mcp_knecht.core.database import Params, Row
from mcp_knecht.errors import ConfigError, StoreBusyError, StoreError, StoreInterruptedError
from mcp_knecht.store.health import store_error
from mcp_knecht.store.turns import Turns

logger = logging.getLogger(__name__)

DEFAULT_POOL_MIN = 1
DEFAULT_POOL_MAX = 10
CONNECT_TIMEOUT = 10.0
_POOL_OPTIONS = {"pool_min_size": "min_size", "pool_max_size": "max_size"}
_DRIVER_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError, OSError)
"""What the driver raises; `InternalClientError` too: it is what a statement meets when the server has ended
the session and the driver has not yet seen the connection close (a process stopped, then let go on)."""
LOCK_TIMEOUT = "15s"
"""How long a statement waits for a lock before it fails with "store busy" (SQLite's busy timeout)."""
IDLE_IN_TRANSACTION_TIMEOUT = "60s"
"""How long the server lets a session sit inside a transaction, sending nothing, before it ends the
session and rolls the transaction back (its process was stopped or cut off)."""
_SESSION_DEFAULTS = {"lock_timeout": LOCK_TIMEOUT, "idle_in_transaction_session_timeout": IDLE_IN_TRANSACTION_TIMEOUT}
_LOCK_NOT_AVAILABLE = "55P03"
_MAX_TAKEN_ALONG = 16


# --- Placeholders --------------------------------------------------------------------------------

_TOKENS = re.compile(
    r"""
      (?P<single>'(?:[^']|'')*')              # 'string literal' with '' escapes
    | (?P<double>"(?:[^"]|"")*")              # "quoted identifier"
    | (?P<dollar>\$(?P<tag>[A-Za-z_]\w*|)\$.*?\$(?P=tag)\$)   # $$ body $$ or $tag$ body $tag$
    | (?P<line>--[^\n]*)                      # -- comment
    | (?P<block>/\*.*?\*/)                    # /* comment */
    | (?P<mark>\?)                            # a placeholder
    """,
    re.VERBOSE | re.DOTALL,
)


@lru_cache(maxsize=1024)
def translate_placeholders(sql: str) -> str:
    """`?` → `$1, $2, …` outside literals, quoted identifiers, dollar quotes and comments.

    A `?` inside any of those is left alone, so `'who?'` stays a literal. PostgreSQL's own
    `?`-operators (jsonb `?`, `?|`, `?&`) cannot be written in our SQL; use the functions
    (`jsonb_exists`, …) instead.
    """
    count = 0

    def replace(match: re.Match[str]) -> str:
        nonlocal count
        if match["mark"] is None:
            return match[0]
        count += 1
        return f"${count}"

    return _TOKENS.sub(replace, sql)


_COMMENTS = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)


@lru_cache(maxsize=256)
def _is_blank(sql: str) -> bool:
    """Only comments and whitespace (SQLite accepts such a statement; asyncpg chokes on it)."""
    return not _COMMENTS.sub("", sql).strip(" \t\r\n;")


_INSERT_INTO = re.compile(r"^\s*INSERT\s+INTO\s+([A-Za-z_]\w*)\s*(\(\s*id\s*[,)])?", re.IGNORECASE)
_IDS_WITHOUT_SEQUENCE = frozenset({"audit_log"})
"""Tables whose ids are always given (the audit chain's positions): no sequence to move past them,
and no round trip spent on one at every commit."""


def lock_key(name: str) -> int:
    """A stable signed 64-bit key for `pg_advisory_xact_lock` (the same on every replica)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def _rowcount(status: str) -> int:
    """The number in a command tag: "UPDATE 3" → 3, "INSERT 0 1" → 1, "CREATE TABLE" → 0."""
    last = status.rsplit(" ", 1)[-1]
    return int(last) if last.isdigit() else 0


def _store_error(what: str, exc: BaseException) -> StoreError:
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate == _LOCK_NOT_AVAILABLE:
        return StoreBusyError(
            "The store is busy: a lock it needs has been held elsewhere for longer than PostgreSQL's lock_timeout "
            f"({LOCK_TIMEOUT} unless the database URL sets it). Nothing was changed; retry in a moment.",
            details={"sqlstate": sqlstate})
    detail = str(exc) or type(exc).__name__
    return store_error("postgresql", f"{what}: {detail}", {"sqlstate": sqlstate} if sqlstate else {})


# --- URL ----------------------------------------------------------------------------------------


def split_url(url: str) -> tuple[str, dict[str, int]]:
    """The DSN for asyncpg and our own pool options (`?pool_min_size=&pool_max_size=`).

    Other query parameters go to asyncpg as usual (e.g. `sslmode`, or a setting such as
    `search_path=team_a`, which asyncpg sends as a server setting). The session settings we need
    (`_SESSION_DEFAULTS`) are added to the DSN unless it names them."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ConfigError(f"Not a PostgreSQL URL: {url!r}")
    query = parse_qsl(parts.query, keep_blank_values=True)
    pool = {"min_size": DEFAULT_POOL_MIN, "max_size": DEFAULT_POOL_MAX}
    rest = []
    for key, value in query:
        if key in _POOL_OPTIONS:
            if not value.isdigit() or int(value) < 1:
                raise ConfigError(f"Database URL option {key} must be a positive integer, not {value!r}.")
            pool[_POOL_OPTIONS[key]] = int(value)
        else:
            rest.append((key, value))
    named = {key for key, _ in rest}
    rest += [(key, value) for key, value in _SESSION_DEFAULTS.items() if key not in named]
    pool["min_size"] = min(pool["min_size"], pool["max_size"])
    return urlunsplit(parts._replace(query=urlencode(rest))), pool


def redact(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


# --- Transactions --------------------------------------------------------------------------------


class _PgTransaction:
    """The statements of a write transaction on one pooled connection (`PostgresDatabase.transaction`
    begins and ends it)."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn
        self._explicit_ids: set[str] = set()
        self._begun = False
        """BEGIN has been sent (with the first statement: see the module)."""
        self._with_next: list[tuple[str, Params]] = []
        """Writes held back for the next statement that can take them along (`execute_with_next`)."""

    async def _begin(self) -> None:
        if self._begun:
            return
        self._begun = True  # from the moment it is sent (see `lock`)
        try:
            await self._conn.execute("BEGIN")
        except _DRIVER_ERRORS as exc:
            raise _store_error("Cannot start a write transaction", exc) from exc

    def _closed(self) -> bool:
        try:
            return bool(self._conn.is_closed())
        except asyncpg.InterfaceError:  # the pool has already let go of a connection the server ended
            return True

    def _failed(self, exc: BaseException, what: str = "Database statement failed") -> StoreError:
        if self._closed() or isinstance(exc, asyncpg.InternalClientError):
            with contextlib.suppress(asyncpg.InterfaceError):  # the connection is of no more use: the pool drops it
                self._conn.terminate()
            # Shown to callers (a tool's answer, a failed proposal): the driver's own words go to the log only.
            logger.warning("A PostgreSQL write transaction was rolled back under us: %s: %s", type(exc).__name__, exc)
            return store_error(
                "postgresql",
                "The connection to PostgreSQL closed or broke inside a write transaction, so the transaction was "
                "rolled back and nothing of it was written. Retry. (A restart of the server or a cut in the network "
                "does that, and so does the server when a session sits idle in its transaction for "
                f"{IDLE_IN_TRANSACTION_TIMEOUT}, unless the database URL says otherwise: was this process stopped? "
                f"The driver raised {type(exc).__name__}.)", kind=StoreInterruptedError)
        return _store_error(what, exc)

    async def _before(self, sql: str) -> None:
        """BEGIN, if this is the first statement, and the writes held back (they came first)."""
        await self._begin()
        await self.send_held_back()
        await self._track_ids(sql)

    async def send_held_back(self) -> None:
        """The writes `execute_with_next` held back, each on its own (before a statement that cannot take
        them along, and before COMMIT)."""
        if not self._with_next:
            return
        await self._begin()
        while self._with_next:
            sql, params = self._with_next.pop(0)
            try:
                await self._conn.execute(translate_placeholders(sql), *params)
            except _DRIVER_ERRORS as exc:
                raise self._failed(exc) from exc

    def _take_along(self) -> list[tuple[str, Params]]:
        """The held-back writes the next statement takes along, if they are few (each is a WITH of it, and
        a statement has at most 32,767 parameters); more go on their own first (`send_held_back`)."""
        taken, self._with_next = self._with_next, []
        if len(taken) > _MAX_TAKEN_ALONG:
            self._with_next = taken
            return []
        return taken

    async def _track_ids(self, sql: str) -> None:
        """Remember tables given explicit ids; before the first insert that leaves the id to the sequence,
        move that sequence past them (as SQLite would number it: max + 1)."""
        if (match := _INSERT_INTO.match(sql)) is None:
            return
        table = match[1].lower()
        if table in _IDS_WITHOUT_SEQUENCE:
            return
        if match[2]:
            self._explicit_ids.add(table)
        elif table in self._explicit_ids:
            await self.sync_sequences([table])

    async def fetch_all(self, sql: str, params: Params = ()) -> list[Row]:
        await self._before(sql)
        try:
            return [dict(r) for r in await self._conn.fetch(translate_placeholders(sql), *params)]
        except _DRIVER_ERRORS as exc:
            raise self._failed(exc) from exc

    async def fetch_one(self, sql: str, params: Params = ()) -> Row | None:
        await self._before(sql)
        try:
            row = await self._conn.fetchrow(translate_placeholders(sql), *params)
        except _DRIVER_ERRORS as exc:
            raise self._failed(exc) from exc
        return dict(row) if row is not None else None

    async def execute(self, sql: str, params: Params = ()) -> int:
        if _is_blank(sql):
            return 0
        await self._before(sql)
        try:
            return _rowcount(await self._conn.execute(translate_placeholders(sql), *params))
        except _DRIVER_ERRORS as exc:
            raise self._failed(exc) from exc

    async def execute_many(self, sql: str, rows: Sequence[Params]) -> None:
        if not rows:
            return
        await self._before(sql)
        try:
            await self._conn.executemany(translate_placeholders(sql), rows)
        except _DRIVER_ERRORS as exc:
            raise self._failed(exc) from exc

    async def fetch_all_with(self, writes: Sequence[tuple[str, Params]], sql: str, params: Params = ()) -> list[Row]:
        """`WITH _w0 AS (write), … sql`: the writes run in the statement's snapshot, all or none."""
        writes = [*self._take_along(), *writes]
        if not writes:
            return await self.fetch_all(sql, params)
        for write, _ in writes:
            await self._before(write)
        await self._before(sql)
        return await self.fetch_all(f"{_with(writes)} {sql}", [*_params_of(writes), *params])

    async def execute_with_next(self, sql: str, params: Params = ()) -> None:
        if _is_blank(sql):
            return
        await self._track_ids(sql)
        self._with_next.append((sql, params))

    async def lock(self, name: str) -> None:
        if along := self._take_along():
            await self._begin()
            try:
                await self._conn.execute(translate_placeholders(f"{_with(along)} SELECT pg_advisory_xact_lock(?)"),
                                         *_params_of(along), lock_key(name))
            except _DRIVER_ERRORS as exc:
                raise self._failed(exc, f"Cannot take the lock {name!r} (or a write sent with it failed)") from exc
            return
        await self.send_held_back()
        try:
            if self._begun:
                await self._conn.execute("SELECT pg_advisory_xact_lock($1)", lock_key(name))
            else:
                # One simple-query message, two statements; the key is an int we computed, never text. Begun
                # from the moment it is sent: a wait for the lock cancelled before the server answered must
                # still be rolled back (the driver cannot know yet that BEGIN ran).
                self._begun = True
                await self._conn.execute(f"BEGIN; SELECT pg_advisory_xact_lock({lock_key(name):d})")
        except _DRIVER_ERRORS as exc:
            raise self._failed(exc, f"Cannot take the lock {name!r}") from exc

    async def lock_and_fetch_one(self, name: str, sql: str, params: Params = ()) -> Row | None:
        """`sql … AND pg_advisory_xact_lock(key) IS NOT NULL FOR UPDATE`, with the held-back writes as its
        WITH: one round trip where `lock` and the read took two. The lock is a filter of the scan, below
        the row lock, so it is granted before the row is locked; the row, locked after the wait, is read as
        committed then (READ COMMITTED rechecks a row it locks), while the statement's snapshot, and with it
        every other table it reads, dates from before the wait."""
        along = self._take_along()
        await self._before(sql)
        statement = f"{_with(along)} {sql} AND pg_advisory_xact_lock(?) IS NOT NULL FOR UPDATE".lstrip()
        try:
            row = await self._conn.fetchrow(translate_placeholders(statement), *_params_of(along), *params,
                                            lock_key(name))
        except _DRIVER_ERRORS as exc:
            raise self._failed(exc, f"Cannot take the lock {name!r} (or a write sent with it failed)") from exc
        return dict(row) if row is not None else None

    async def sync_sequences(self, tables: Sequence[str] | None = None) -> None:
        """Move identity sequences past the largest id (only ever forward)."""
        for table in sorted(self._explicit_ids if tables is None else tables):
            await self.execute(_SYNC_SEQUENCE.format(table=table), (table,))
            self._explicit_ids.discard(table)


def _with(writes: Sequence[tuple[str, Params]]) -> str:
    """The WITH clause that sends `writes` along with a statement (empty without writes)."""
    if not writes:
        return ""
    return "WITH " + ", ".join(f"_w{n} AS ({write})" for n, (write, _) in enumerate(writes))


def _params_of(writes: Sequence[tuple[str, Params]]) -> list[object]:
    return [value for _, write_params in writes for value in write_params]


# `setval(…, max, true)`: the next default id is max + 1. Never moves a sequence backwards.
_SYNC_SEQUENCE = (
    "SELECT setval(s.seq, m.max_id) FROM"
    " (SELECT pg_get_serial_sequence(?, 'id') AS seq) s,"
    " (SELECT MAX(id) AS max_id FROM {table}) m"
    " WHERE s.seq IS NOT NULL AND m.max_id IS NOT NULL"
    " AND m.max_id > COALESCE(pg_sequence_last_value(s.seq::regclass), 0)"
)


async def _reset_on_release(conn: asyncpg.Connection) -> None:
    """What a released connection needs here: no open transaction. asyncpg's default reset
    (UNLISTEN, RESET ALL, unlock all, CLOSE ALL) costs a round trip per release and guards
    against session state this backend never leaves: locks are transaction-scoped, LISTEN runs on
    its own connection outside the pool, settings come from the URL at connect."""
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


class PostgresDatabase:
    dialect = "postgresql"
    turn_spans_processes = False

    def __init__(self, url: str, pool: asyncpg.Pool) -> None:
        self.url = url
        self._pool = pool
        self._turns = Turns()

    @classmethod
    async def open(cls, url: str) -> PostgresDatabase:
        dsn, pool_options = split_url(url)
        try:
            pool = await asyncpg.create_pool(dsn, timeout=CONNECT_TIMEOUT, reset=_reset_on_release, **pool_options)
        except _DRIVER_ERRORS as exc:
            raise _store_error(f"Cannot connect to PostgreSQL at {redact(url)}", exc) from exc
        except TimeoutError as exc:
            raise store_error("postgresql", f"Cannot connect to PostgreSQL at {redact(url)}: timed out") from exc
        assert pool is not None
        return cls(url, pool)

    @property
    def dsn(self) -> str:
        return split_url(self.url)[0]

    async def fetch_all(self, sql: str, params: Params = ()) -> list[Row]:
        try:
            return [dict(r) for r in await self._pool.fetch(translate_placeholders(sql), *params)]
        except _DRIVER_ERRORS as exc:
            raise _store_error("Database read failed", exc) from exc

    async def fetch_one(self, sql: str, params: Params = ()) -> Row | None:
        try:
            row = await self._pool.fetchrow(translate_placeholders(sql), *params)
        except _DRIVER_ERRORS as exc:
            raise _store_error("Database read failed", exc) from exc
        return dict(row) if row is not None else None

    async def lookup(self, sql: str, params: Params = ()) -> list[Row]:
        return await self.fetch_all(sql, params)

    async def stream(self, sql: str, params: Params = (), batch: int = 500) -> AsyncIterator[Row]:
        """Rows one batch at a time through a server-side cursor (a read-only transaction). A reader may
        take its time between batches (a paused pager): the idle timeout, there to free locks writers
        wait for, is lifted for this transaction, which holds none they need."""
        try:
            async with self._pool.acquire() as conn, conn.transaction(readonly=True):
                await conn.execute("SET LOCAL idle_in_transaction_session_timeout = 0")
                cursor = await conn.cursor(translate_placeholders(sql), *params)
                while rows := await cursor.fetch(batch):
                    for row in rows:
                        yield dict(row)
        except _DRIVER_ERRORS as exc:
            raise _store_error("Database read failed", exc) from exc

    @asynccontextmanager
    async def transaction(self, *, durable: bool = False) -> AsyncIterator[_PgTransaction]:
        """`durable` changes nothing here: with the server's default `synchronous_commit = on`
        every commit is flushed to disk before it returns. BEGIN (with the first statement, see the
        module) and COMMIT are sent as plain statements, so that a COMMIT the server answers with a
        rollback (a statement failed in the transaction) is not taken for success, as asyncpg's
        `Transaction.commit` takes it."""
        try:
            conn = await self._pool.acquire()
        except _DRIVER_ERRORS as exc:
            raise _store_error("Cannot start a write transaction", exc) from exc
        try:
            tx = _PgTransaction(conn)
            try:
                yield tx
                await tx.send_held_back()
                if tx._explicit_ids:
                    await tx.sync_sequences()
            except BaseException:
                # If the connection is gone, the server rolls back on its own.
                with anyio.CancelScope(shield=True), contextlib.suppress(*_DRIVER_ERRORS):
                    if tx._begun or conn.is_in_transaction():
                        await conn.execute("ROLLBACK")
                raise
            if not tx._begun:  # no statement ran: nothing to commit
                return
            try:
                with anyio.CancelScope(shield=True):
                    status = await conn.execute("COMMIT")
            except _DRIVER_ERRORS as exc:
                raise _store_error("Commit failed", exc) from exc
            if status != "COMMIT":  # the server rolled back a transaction a statement had failed in
                raise store_error("postgresql", "Commit failed: the transaction had been aborted; nothing was "
                                                "written. Retry in a moment.")
        finally:
            with anyio.CancelScope(shield=True):
                await self._pool.release(conn)

    def turn(self, name: str, *, moved: Callable[[], Awaitable[bool]]) -> AbstractAsyncContextManager[bool]:
        """In this process only: other replicas and processes queue in the server, on the advisory lock
        their transaction takes (`tx.lock`), which costs them no CPU while they wait."""
        return self._turns.turn(name, moved=moved)

    async def sync_sequences(self) -> None:
        """Move every `id` identity sequence past its table's largest id (after bulk loads
        with explicit ids made by other means than this backend's transactions)."""
        rows = await self.fetch_all(
            "SELECT c.relname AS name FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
            " WHERE a.attname = 'id' AND a.attidentity <> '' AND c.relkind = 'r'"
            " AND pg_table_is_visible(c.oid)"
        )
        async with self.transaction() as tx:
            await tx.sync_sequences([r["name"] for r in rows])

    async def listen(self) -> asyncpg.Connection:
        """A dedicated connection outside the pool, for LISTEN (`add_listener`). The caller closes it."""
        try:
            return await asyncpg.connect(self.dsn, timeout=CONNECT_TIMEOUT)
        except _DRIVER_ERRORS as exc:
            raise _store_error("Cannot open a connection to listen on", exc) from exc
        except TimeoutError as exc:
            raise store_error("postgresql", "Cannot open a connection to listen on: timed out") from exc

    async def close(self) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await self._pool.close()
            except _DRIVER_ERRORS:
                self._pool.terminate()

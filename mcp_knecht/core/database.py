"""The database interface: what the core and the toolsets may ask of a store.

Two backends implement it (`mcp_knecht.store`: SQLite, PostgreSQL). SQL is written once with `?`
placeholders; a backend translates them to its own paramstyle. Rows come back as plain dicts.
Dialect differences live in the backend module and in `sql/<dialect>/` migrations, never in
callers.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

Row = dict[str, Any]
Params = Sequence[Any]


def exact_matches(columns: Mapping[str, object]) -> tuple[list[str], list[object]]:
    """`column = ?` conditions and their parameters for the values that are not None.

    Column names come from our code, never from callers; values are only parameters."""
    given = [(column, value) for column, value in columns.items() if value is not None]
    return [f"{column} = ?" for column, _ in given], [value for _, value in given]


def by_keys(dialect: str, table: str, column: str, keys: Sequence[int]) -> tuple[str, str, tuple[object, ...]]:
    """(FROM source, WHERE condition, its parameters, which come first) for the rows of `table` (with its
    alias) whose `column` (alias-qualified) is one of `keys`, read as one lookup per key:

        source, match, params = by_keys(db.dialect, "proposals p", "p.id", ids)
        rows = await db.fetch_all(f"SELECT p.id, p.status FROM {source} WHERE {match}", params)

    SQLite plans by the statistics it last took, and a store keeps growing after that. For `key IN (…)`
    over a table its statistics call small its planner walks the whole table (statistics from a hundred
    proposals, 200,000 waiting: 31 ms for 500 ids, against 0.2 ms). So on SQLite the keys go as one JSON
    array, kept the outer loop by `CROSS JOIN`. (A `VALUES` list was tried first: SQLite 3.40 built a
    Bloom filter over the table for it, by a scan.) PostgreSQL, whose autovacuum keeps its statistics
    fresh, gets `IN`."""
    if dialect == "sqlite":
        return f"json_each(?) AS wanted CROSS JOIN {table}", f"{column} = wanted.value", (json.dumps(list(keys)),)
    return table, f"{column} IN ({', '.join('?' * len(keys))})", tuple(keys)


class Transaction(Protocol):
    """Statements inside one atomic unit; committed when the context exits cleanly."""

    async def fetch_all(self, sql: str, params: Params = ()) -> list[Row]: ...
    async def fetch_one(self, sql: str, params: Params = ()) -> Row | None: ...
    async def execute(self, sql: str, params: Params = ()) -> int: ...
    async def execute_many(self, sql: str, rows: Sequence[Params]) -> None: ...
    async def fetch_all_with(self, writes: Sequence[tuple[str, Params]], sql: str, params: Params = ()) -> list[Row]:
        """`fetch_all(sql, params)` together with `writes` (INSERT, UPDATE or DELETE statements, with
        their parameters), in one statement where the backend can (PostgreSQL: a WITH of data-modifying
        statements, one round trip). Their order is not defined and none of them sees what another one
        writes: only for statements that do not depend on each other."""
        ...
    async def execute_with_next(self, sql: str, params: Params = ()) -> None:
        """An INSERT, UPDATE or DELETE whose row count nobody needs, sent with this transaction's next
        `lock` or `fetch_all_with` where the backend can (PostgreSQL: as a data-modifying WITH of that
        statement, one round trip fewer; SQLite runs it at once), else on its own before the next other
        statement or the commit. Only for a write that depends on nothing that statement writes and that
        nothing reads before the commit (an outbox event); a failure of it fails that statement."""
        ...
    async def lock(self, name: str) -> None:
        """Serialise this transaction with every other one that locks `name`, across processes
        and replicas, until it ends (SQLite's write lock already does; PostgreSQL needs more)."""
        ...
    async def lock_and_fetch_one(self, name: str, sql: str, params: Params = ()) -> Row | None:
        """`lock(name)`, then `fetch_one(sql, params)`, in one statement where the backend can. `sql`
        selects from one table and ends in its WHERE clause (the backend appends to it). The row it
        reads must change only under `name`: that row is read as the lock's previous holder left it
        (PostgreSQL locks it FOR UPDATE, which reads it afresh after the wait), but anything else the
        statement reads, such as a subquery of another table, may be seen as it was before the wait.
        When no row matches, the lock may not have been taken (PostgreSQL takes it per row it finds):
        the caller then writes nothing under it."""
        ...


class Database(Protocol):
    dialect: str
    url: str

    async def fetch_all(self, sql: str, params: Params = ()) -> list[Row]: ...
    async def fetch_one(self, sql: str, params: Params = ()) -> Row | None: ...
    async def lookup(self, sql: str, params: Params = ()) -> list[Row]:
        """`fetch_all` for a read by key of a few rows (an index lookup, never a scan), run where it
        costs least: SQLite answers it on the caller's thread, in microseconds, where a hop to its
        reader thread and back costs about 80 µs of CPU."""
        ...
    def stream(self, sql: str, params: Params = (), batch: int = 500) -> AsyncIterator[Row]:
        """Rows one batch at a time, in bounded memory. `sql` orders its rows fully (by a unique key):
        a backend may read them again and go on after the ones given."""
        ...
    def transaction(self, *, durable: bool = False) -> AbstractAsyncContextManager[Transaction]:
        """A write transaction that takes the write lock at once (no upgrade deadlocks).

        `durable`: the commit survives a power loss, not only a crash of the process, once the block has
        returned (proposals and decisions ask for it; SQLite then flushes its WAL after this commit, with
        the write lock let go; PostgreSQL flushes every commit)."""
        ...

    @property
    def turn_spans_processes(self) -> bool:
        """Whether `turn` queues this store's other processes too (SQLite's record locks), not only the
        tasks of this process (PostgreSQL's processes queue in the server, in the transaction after it)."""
        ...

    def turn(self, name: str, *, moved: Callable[[], Awaitable[bool]]) -> AbstractAsyncContextManager[bool]:
        """Hold `name` (True) — one holder at a time, across processes where the backend can — or give
        up waiting once `moved()` is true (False). No transaction and no write lock: racing operators
        queue on their proposal, and the late ones learn from a short read that it was decided
        (`mcp_knecht.store.turns`). Never needed for correctness, which transactions keep."""
        ...

    async def close(self) -> None: ...

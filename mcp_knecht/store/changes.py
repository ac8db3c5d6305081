"""The store's change feeds (`core.changes.ChangeFeed`): LISTEN/NOTIFY on PostgreSQL, polling elsewhere.

- `OutboxFeed` (SQLite): polling every `POLL_INTERVAL` seconds; for topic `proposals` it names the
  proposals that changed meanwhile. Every change of a proposal's status writes its event to
  `notify_outbox` in the change's own transaction, from whichever process made it
  (`notify.outbox.OutboxWriter`), and SQLite's single writer numbers those rows in the order they
  commit: the rows beyond the last one read are what changed since. So a watcher of every open
  proposal reads the few that moved, not all of them. (A row written around the store names nothing:
  such a watcher still reads everything every so often.)
- `PgChangeFeed` (PostgreSQL): one LISTEN connection per server process, listening on channel
  `knecht_<topic>` for each topic someone watches. The NOTIFY comes from a trigger (e.g. on
  `proposals`, sql/postgresql/0002) in whichever process or replica commits the change. If that
  connection is lost it falls back to polling (naming nothing) and reconnects on the next wait.
  Even while listening it wakes after `recheck` seconds, as a safety net.

`open_change_feed(db)` picks the one that fits the store; its owner closes it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio

from mcp_knecht.core.changes import ChangeFeed, Wakeups
from mcp_knecht.core.database import Database
from mcp_knecht.errors import StoreError

logger = logging.getLogger(__name__)

POLL_INTERVAL = 0.25
RECHECK_SECONDS = 5.0
MAX_KEYS = 1_000
"""More keys announced between two waits than this, and the wait says "unknown" (`keys` None): the
waiter reads everything, which is cheaper by then than a read per key."""


def channel(topic: str) -> str:
    return f"knecht_{topic}"


class _Polling:
    keys = None  # a poll knows nothing of what changed

    def __init__(self, interval: float) -> None:
        self._interval = interval

    async def wait(self, timeout: float) -> bool:
        await anyio.sleep(max(0.0, min(self._interval, timeout)))
        return True


class _OutboxWakeups:
    """Polling, and `keys`: the proposals of the outbox rows written since the last wait."""

    def __init__(self, db: Database, interval: float, after: int | None) -> None:
        self._db = db
        self._interval = interval
        self._after = after
        """The newest outbox row already named (None: not known, so the next wait names nothing)."""
        self.keys: frozenset[int] | None = None

    async def wait(self, timeout: float) -> bool:
        await anyio.sleep(max(0.0, min(self._interval, timeout)))
        self.keys = await self._named()
        return True

    async def _named(self) -> frozenset[int] | None:
        try:
            newest = await _newest_event(self._db)
            if self._after is None or newest < self._after:  # unknown, or the rows were purged and ids reused
                self._after = newest
                return None
            if newest == self._after:
                return frozenset()
            rows = await self._db.lookup(
                "SELECT id, proposal_id FROM notify_outbox WHERE id > ? ORDER BY id LIMIT ?",
                (self._after, MAX_KEYS + 1))
        except StoreError as exc:  # the next wait tries again; meanwhile the caller reads everything
            logger.debug("Reading the outbox for changes failed: %s", exc.message)
            return None
        if len(rows) > MAX_KEYS:
            self._after = newest
            return None
        if rows:
            self._after = rows[-1]["id"]
        keys = frozenset(row["proposal_id"] for row in rows)
        # A row written around the store can hold anything (SQLite keeps text in an INTEGER column): read it all.
        return keys if all(type(key) is int for key in keys) else None


async def _newest_event(db: Database) -> int:
    rows = await db.lookup("SELECT COALESCE(MAX(id), 0) AS newest FROM notify_outbox")
    return int(rows[0]["newest"])


class OutboxFeed:
    """SQLite's feed: polling, naming the proposals that changed (topic `proposals`; see the module)."""

    def __init__(self, db: Database, interval: float = POLL_INTERVAL) -> None:
        self._db = db
        self._interval = interval

    @asynccontextmanager
    async def watching(self, topic: str, key: int | None = None) -> AsyncIterator[Wakeups]:
        if topic != "proposals" or key is not None:  # only a watcher of every proposal reads what is named
            yield _Polling(self._interval)
            return
        try:
            after: int | None = await _newest_event(self._db)  # before the caller's first read: nothing slips by
        except StoreError:
            after = None
        yield _OutboxWakeups(self._db, self._interval, after)

    async def aclose(self) -> None:
        pass


class _Subscription:
    def __init__(self, feed: PgChangeFeed) -> None:
        self._feed = feed
        self.event = anyio.Event()
        self._announced: set[int] | None = set()
        """The keys announced since the last wait; None once one came without a key (or too many came)."""
        self.keys: frozenset[int] | None = None

    def fire(self, key: int | None = None) -> None:
        if key is None or self._announced is None or len(self._announced) >= MAX_KEYS:
            self._announced = None
        else:
            self._announced.add(key)
        self.event.set()

    async def wait(self, timeout: float) -> bool:
        if not self._feed.listening:
            self.event, self._announced, self.keys = anyio.Event(), set(), None
            return await _Polling(self._feed.poll_interval).wait(timeout)
        with anyio.move_on_after(max(0.0, min(timeout, self._feed.recheck))):
            await self.event.wait()
        fired = self.event.is_set()
        self.keys = frozenset(self._announced) if fired and self._announced is not None else None
        self.event, self._announced = anyio.Event(), set()
        return fired


class PgChangeFeed:
    """LISTEN on one dedicated connection; wake the subscribers of a topic and key."""

    def __init__(self, db: Any, *, recheck: float = RECHECK_SECONDS, poll_interval: float = POLL_INTERVAL) -> None:
        """`db`: a `PostgresDatabase` (its `listen(channel, callback)` opens the connection)."""
        self._db = db
        self.recheck = recheck
        self.poll_interval = poll_interval
        self._conn: Any = None
        self._channels: set[str] = set()
        self._start_lock = anyio.Lock()
        self._subscribers: dict[tuple[str, int | None], set[_Subscription]] = {}  # key None: any
        self.notifications = 0

    @property
    def listening(self) -> bool:
        return self._conn is not None and not self._conn.is_closed()

    async def _ensure_listening(self, topic: str) -> None:
        async with self._start_lock:
            if not self.listening:
                self._channels.clear()
                try:
                    self._conn = await self._db.listen()
                except StoreError as exc:
                    self._conn = None
                    logger.warning("Cannot LISTEN for changes (%s); polling every %ss", exc.message,
                                   self.poll_interval)
                    return
                self._conn.add_termination_listener(self._on_lost)
            if channel(topic) not in self._channels:
                try:
                    await self._conn.add_listener(channel(topic), self._on_notify)
                except Exception as exc:  # the connection broke while adding: poll until it is back
                    logger.warning("Cannot LISTEN on %s (%s); polling", channel(topic), exc)
                    return
                self._channels.add(channel(topic))

    def _on_notify(self, _conn: Any, _pid: int, name: str, payload: str) -> None:
        self.notifications += 1
        topic = name.removeprefix("knecht_")
        try:
            key: int | None = int(payload)
        except ValueError:
            key = None
        for each in {(topic, key), (topic, None)}:
            for subscription in self._subscribers.get(each, ()):
                subscription.fire(key)

    def _on_lost(self, _conn: Any) -> None:
        logger.warning("The LISTEN connection was lost; polling until it is back")
        for subscriptions in self._subscribers.values():
            for subscription in subscriptions:
                subscription.fire()  # read again now: a change may have been missed

    @asynccontextmanager
    async def watching(self, topic: str, key: int | None = None) -> AsyncIterator[Wakeups]:
        await self._ensure_listening(topic)
        subscription = _Subscription(self)
        self._subscribers.setdefault((topic, key), set()).add(subscription)
        try:
            yield subscription
        finally:
            subscribers = self._subscribers.get((topic, key))
            if subscribers is not None:
                subscribers.discard(subscription)
                if not subscribers:
                    del self._subscribers[(topic, key)]

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.remove_termination_listener(self._on_lost)  # closed by us: nothing was lost
            with anyio.CancelScope(shield=True):
                try:
                    await conn.close(timeout=5)
                except Exception:  # closing a broken connection: nothing left to save
                    conn.terminate()


def open_change_feed(db: Database) -> ChangeFeed:
    """LISTEN/NOTIFY on PostgreSQL, polling that reads the outbox on SQLite. The caller closes it."""
    if db.dialect == "postgresql":
        return PgChangeFeed(db)
    return OutboxFeed(db)

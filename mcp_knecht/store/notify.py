"""Decisions reaching waiting agents: "proposal #N may have changed", as soon as the store can say so.

    async with notifier.watching(proposal_id) as changes:   # interest registered first,
        proposal = await read()                              # so no change slips in between
        while proposal.status in OPEN:
            await changes.wait(timeout)                      # woken by a change, or after timeout
            proposal = await read()

A wake-up means "read again", never "it changed": callers always re-read the row, so a spurious
or lost notification costs latency, never correctness.

- `PollingNotifier` (SQLite, or any store): wakes every `interval` seconds.
- `PgDecisionNotifier` (PostgreSQL): one LISTEN connection per server process on channel
  `knecht_proposals`, fed by a trigger on `proposals` (sql/postgresql/0003) in whichever process or
  replica commits the change. If that connection is lost it falls back to polling and reconnects on
  the next wait. Even while listening it wakes after `recheck` seconds, as a safety net.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from mcp_knecht.errors import StoreError
from mcp_knecht.store.database import Database

if TYPE_CHECKING:
    from mcp_knecht.store.postgresql import PostgresDatabase

logger = logging.getLogger(__name__)

CHANNEL = "knecht_proposals"
POLL_INTERVAL = 0.25
RECHECK_SECONDS = 5.0


class Changes(Protocol):
    async def wait(self, timeout: float) -> bool:
        """Return True when the proposal may have changed since the last wait (or since
        `watching` began), False when `timeout` seconds passed quietly."""
        ...


class DecisionNotifier(Protocol):
    def watching(self, proposal_id: int | None) -> Any:
        """`async with notifier.watching(id) as changes:` → `Changes`; `None` watches every proposal."""
        ...

    async def aclose(self) -> None: ...


class _Polling:
    def __init__(self, interval: float) -> None:
        self._interval = interval

    async def wait(self, timeout: float) -> bool:
        await anyio.sleep(max(0.0, min(self._interval, timeout)))
        return True


class PollingNotifier:
    """No push channel: wake every `interval` seconds and let the caller read again."""

    def __init__(self, interval: float = POLL_INTERVAL) -> None:
        self._interval = interval

    @asynccontextmanager
    async def watching(self, proposal_id: int | None) -> AsyncIterator[Changes]:
        yield _Polling(self._interval)

    async def aclose(self) -> None:
        pass


class _Subscription:
    def __init__(self, notifier: PgDecisionNotifier) -> None:
        self._notifier = notifier
        self.event = anyio.Event()

    def fire(self) -> None:
        self.event.set()

    async def wait(self, timeout: float) -> bool:
        if not self._notifier.listening:
            self.event = anyio.Event()
            return await _Polling(self._notifier.poll_interval).wait(timeout)
        with anyio.move_on_after(max(0.0, min(timeout, self._notifier.recheck))):
            await self.event.wait()
        fired = self.event.is_set()
        self.event = anyio.Event()
        return fired


class PgDecisionNotifier:
    """LISTEN knecht_proposals on one dedicated connection; wake the subscribers of an id."""

    def __init__(self, db: PostgresDatabase, *, recheck: float = RECHECK_SECONDS,
                 poll_interval: float = POLL_INTERVAL) -> None:
        self._db = db
        self.recheck = recheck
        self.poll_interval = poll_interval
        self._conn: Any = None
        self._start_lock = anyio.Lock()
        self._subscribers: dict[int | None, set[_Subscription]] = {}  # None: every proposal
        self.notifications = 0

    @property
    def listening(self) -> bool:
        return self._conn is not None and not self._conn.is_closed()

    async def _ensure_listening(self) -> None:
        async with self._start_lock:
            if self.listening:
                return
            try:
                self._conn = await self._db.listen(CHANNEL, self._on_notify)
            except StoreError as exc:
                self._conn = None
                logger.warning("Cannot LISTEN for decisions (%s); polling every %ss", exc.message,
                               self.poll_interval)
                return
            self._conn.add_termination_listener(self._on_lost)

    def _on_notify(self, payload: str) -> None:
        self.notifications += 1
        try:
            proposal_id = int(payload)
        except ValueError:
            return
        for key in (proposal_id, None):
            for subscription in self._subscribers.get(key, ()):
                subscription.fire()

    def _on_lost(self, _conn: Any) -> None:
        logger.warning("The LISTEN connection for decisions was lost; polling until it is back")
        for subscriptions in self._subscribers.values():
            for subscription in subscriptions:
                subscription.fire()  # read again now: a change may have been missed

    @asynccontextmanager
    async def watching(self, proposal_id: int | None) -> AsyncIterator[Changes]:
        await self._ensure_listening()
        subscription = _Subscription(self)
        self._subscribers.setdefault(proposal_id, set()).add(subscription)
        try:
            yield subscription
        finally:
            subscribers = self._subscribers.get(proposal_id)
            if subscribers is not None:
                subscribers.discard(subscription)
                if not subscribers:
                    del self._subscribers[proposal_id]

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            with anyio.CancelScope(shield=True):
                try:
                    await conn.close(timeout=5)
                except Exception:  # closing a broken connection: nothing left to save
                    conn.terminate()


def decision_notifier(db: Database) -> DecisionNotifier:
    """LISTEN/NOTIFY on PostgreSQL, polling elsewhere."""
    if db.dialect == "postgresql":
        from mcp_knecht.store.postgresql import PostgresDatabase

        assert isinstance(db, PostgresDatabase)
        return db.decision_notifier()
    return PollingNotifier()

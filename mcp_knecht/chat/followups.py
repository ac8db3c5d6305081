"""The follow-up worker (seed 004, 3a/3b): when a proposal a conversation staged is decided, the
conversation gets the outcome and the assistant's turn on it — once, whatever runs and crashes.

    wake     the store's change feed on `proposals` (LISTEN/NOTIFY on PostgreSQL: a decision on any
             replica or CLI wakes every worker at once; polling elsewhere), a finished delivery, or
             every `interval` seconds (expiries are announced by nobody)
    scan     waiting follow-ups whose proposal is decided and that nobody holds a live claim on
    claim    one conditional UPDATE sets owner and lease: of any number of workers exactly one wins
    deliver  the turn runs (bounded well inside the lease); its messages commit in one transaction
             with the `done` mark, conditional on the owner still holding the claim
    fail     a failed turn gives the claim up with a back-off (retried, at most 3 tries in all);
             a shutdown hands it back at once; a crash leaves it to lapse with its lease

Every server process runs one when a chat model is configured; the work survives restarts because
all of it is rows in the store.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from datetime import timedelta
from typing import Protocol

import anyio
import anyio.abc

from mcp_knecht.chat.store import ChatStore
from mcp_knecht.chat.texts import MAX_ROUNDS
from mcp_knecht.core import clock
from mcp_knecht.core.changes import ChangeFeed, Wakeups


class Chat(Protocol):
    """What the worker uses of `ChatService` (declared here, so the two modules need not import each other)."""

    store: ChatStore
    timeout: float

    @property
    def configured(self) -> bool: ...

    async def follow_up(self, proposal_id: int, owner: str) -> bool: ...


logger = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = 2
DEFAULT_INTERVAL = 5.0
MIN_LEASE = timedelta(minutes=10)


class FollowUpWorker:
    def __init__(self, chat: Chat, changes: ChangeFeed, *, concurrency: int = DEFAULT_CONCURRENCY,
                 interval: float = DEFAULT_INTERVAL, lease: timedelta | None = None) -> None:
        self._chat = chat
        self._changes = changes
        self._slots = max(1, concurrency)
        self._interval = interval
        # A turn is bounded by the model timeout per request it may make: the lease outlasts it by far,
        # so a live worker never loses its claim mid-turn.
        self.lease = lease or max(MIN_LEASE, timedelta(seconds=chat.timeout * (MAX_ROUNDS + 1) * 2))
        self._instance = f"{socket.gethostname()}:{os.getpid()}"
        self._busy: set[int] = set()
        self._wake = anyio.Event()
        self.delivered = 0
        """Follow-ups this worker delivered."""

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        """Until cancelled; run it in the server's task group. Without a chat model it has nothing to do."""
        if not self._chat.configured:
            return
        await self._chat.store.ready()
        async with anyio.create_task_group() as tasks, self._changes.watching("proposals") as wakeups:
            while True:
                try:
                    await self.scan(tasks)
                except Exception:  # a store hiccup must not end the worker
                    logger.exception("The follow-up worker's scan failed; trying again")
                await self._sleep(wakeups)

    async def _sleep(self, wakeups: Wakeups) -> None:
        """Until a change of any proposal, a freed slot, or the interval."""
        async with anyio.create_task_group() as race:
            async def freed() -> None:
                await self._wake.wait()
                race.cancel_scope.cancel()

            race.start_soon(freed)
            await wakeups.wait(self._interval)
            race.cancel_scope.cancel()
        self._wake = anyio.Event()

    async def scan(self, tasks: anyio.abc.TaskGroup) -> int:
        """Claim and start what free slots allow; return how many were started."""
        free = self._slots - len(self._busy)
        if free <= 0:
            return 0
        now = clock.now()
        due = await self._chat.store.due(clock.timestamp(now), limit=free + len(self._busy) + 8)
        started = 0
        for proposal_id in due:
            if started >= free:
                break
            if proposal_id in self._busy:
                continue
            owner = f"{self._instance}:{uuid.uuid4().hex[:8]}"
            if await self._chat.store.claim(proposal_id, owner, now=clock.timestamp(now),
                                            lease_until=clock.timestamp(now + self.lease)):
                self._busy.add(proposal_id)
                tasks.start_soon(self._deliver, proposal_id, owner)
                started += 1
        return started

    async def _deliver(self, proposal_id: int, owner: str) -> None:
        try:
            if await self._chat.follow_up(proposal_id, owner):
                self.delivered += 1
        except anyio.get_cancelled_exc_class():
            # Shutdown: hand the claim back, so the next worker (a restart, a replica) takes it at once.
            with anyio.CancelScope(shield=True):
                try:
                    await self._chat.store.release(proposal_id, owner)
                except Exception:  # the lease runs out by itself
                    logger.exception("Could not release the follow-up claim of proposal #%s", proposal_id)
            raise
        except Exception:
            logger.exception("The follow-up of proposal #%s failed; its lease will let it be tried again",
                             proposal_id)
        finally:
            self._busy.discard(proposal_id)
            self.wake()  # a slot is free

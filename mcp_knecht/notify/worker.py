"""The delivery worker: a background task of every server (in `open_app`'s task group).

    loop:  route new events → claim what is due (up to the free slots) → deliver each in its own
           task (timeout per attempt) → record delivered, or retry after a bounded exponential
           backoff, or failed after `max_attempts`
    wake:  after `interval` seconds, at once on a push from the store (LISTEN/NOTIFY on
           PostgreSQL), or when a delivery finishes and frees a slot
    also:  every `sweep_every` seconds forget settled events past the retention (the server's own
           expiry sweep writes `expired`, and with it `proposal.expired`, without anyone reading)

Nothing here runs on a gate call's or a decision's path: those only write the outbox row. A dead
channel costs this worker a slot for at most the timeout, and never anybody else any time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import uuid
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio
from anyio.abc import TaskGroup

from mcp_knecht.core import clock
from mcp_knecht.core.changes import Wakeups
from mcp_knecht.core.database import Database
from mcp_knecht.errors import DeliveryError, StoreError
from mcp_knecht.notify import outbox
from mcp_knecht.notify.channels import Destination
from mcp_knecht.notify.config import NotifyConfig
from mcp_knecht.notify.messages import render

logger = logging.getLogger(__name__)

POLL_INTERVAL = 0.5
SWEEP_EVERY = 30.0
MIN_PAUSE = 0.02
"""Rows another replica is claiming right now look due until it commits: do not spin on them."""
BATCH_WINDOW = 0.1
"""After a push from the store, wait this long so that a burst of changes makes one round."""
RECORD_WINDOW = 0.05
"""Outcomes finishing within this long of each other are recorded in one transaction."""
MAX_ERROR = 500


WakeupSource = Callable[[], AbstractAsyncContextManager[Wakeups]]
"""Pushes from the store's change feed (`changes.watching("proposals")` on PostgreSQL)."""


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class NotifyWorker:
    def __init__(
        self,
        db: Database,
        config: NotifyConfig,
        destinations: Mapping[str, Destination],
        *,
        scrub: Callable[[str], str],
        wakeups: WakeupSource | None = None,
        interval: float = POLL_INTERVAL,
        sweep_every: float = SWEEP_EVERY,
        name: str | None = None,
    ) -> None:
        self._db = db
        self._config = config
        self._destinations = destinations
        self._scrub = scrub
        self._wakeups = wakeups
        self._interval = interval
        self._sweep_every = sweep_every
        self.name = name or worker_name()
        # Longer than any attempt can take (the send is cut off at timeout + 5 s): a lease that runs
        # out means its holder died, and the delivery is claimed again.
        self._lease = 2 * config.delivery.timeout + 5
        self._in_flight = 0
        self._wake = anyio.Event()
        self._outcomes: list[outbox.Outcome] = []
        self._outcomes_waiting = anyio.Event()
        self._next_sweep = 0.0
        self.delivered = 0
        self.failed_attempts = 0

    # --- one attempt ----------------------------------------------------------------------------

    def _router(self, event: str, facts: dict[str, Any]) -> tuple[str, ...]:
        return self._config.route(event, facts)

    async def _sweep(self) -> None:
        now = anyio.current_time()
        if now < self._next_sweep:
            return
        self._next_sweep = now + self._sweep_every
        await outbox.purge(self._db, older_than=self._config.delivery.retention)

    async def _take(self, limit: int) -> list[outbox.Claimed]:
        return await outbox.take(self._db, self._router, self.name, lease=self._lease, limit=limit)

    async def attempt(self, claimed: outbox.Claimed) -> outbox.Outcome:
        """Send once; never raises: the outcome says delivered, retry later, or give up."""
        try:
            destination = self._destinations.get(claimed.destination)
            if destination is None:
                raise DeliveryError(f"{claimed.destination}: no such channel is configured any more", permanent=True)
            message = render(claimed.uid, claimed.event, claimed.facts, claimed.created_at,
                             public_url=self._config.public_url, scrub=self._scrub)
            with anyio.fail_after(self._config.delivery.timeout + 5):
                await destination.send(message)
        except DeliveryError as exc:
            return self._failure(claimed, exc.message, permanent=exc.permanent)
        except TimeoutError:
            return self._failure(claimed, f"{claimed.destination}: no answer within the timeout", permanent=False)
        except Exception as exc:  # a bug or a library surprise: recorded and retried like any failure
            logger.exception("Delivering %s to %s failed unexpectedly", claimed.uid, claimed.destination)
            return self._failure(claimed, f"{claimed.destination}: {type(exc).__name__}", permanent=False)
        self.delivered += 1
        return outbox.Outcome(claimed.id)

    def _failure(self, claimed: outbox.Claimed, error: str, *, permanent: bool) -> outbox.Outcome:
        self.failed_attempts += 1
        error = self._scrub(error)[:MAX_ERROR]
        delivery = self._config.delivery
        if permanent or claimed.attempts >= delivery.max_attempts:
            logger.warning("Notification %s to %s failed for good after %d attempt(s): %s", claimed.event,
                           claimed.destination, claimed.attempts, error)
            return outbox.Outcome(claimed.id, error=error, retry_in=None)
        return outbox.Outcome(claimed.id, error=error,
                              retry_in=delivery.retry_delay(claimed.attempts) * random.uniform(0.8, 1.0))

    async def _record(self, outcomes: list[outbox.Outcome]) -> None:
        if not outcomes:
            return
        try:
            with anyio.CancelScope(shield=True):
                await outbox.record(self._db, self.name, outcomes)
        except StoreError as exc:  # the leases run out and the deliveries are claimed again
            logger.warning("Cannot record %d delivery outcome(s) (%s); they will be retried", len(outcomes),
                           exc.message)

    async def run_once(self) -> int:
        """Route and deliver everything due now, waiting for each attempt; returns the attempts.
        For `notify` commands, tests and benchmarks; the server runs `run`."""
        attempts = 0
        while claimed := await self._take(self._config.delivery.concurrency):
            outcomes: list[outbox.Outcome] = []
            async with anyio.create_task_group() as tasks:
                for each in claimed:
                    tasks.start_soon(self._attempt_into, each, outcomes)
            await self._record(outcomes)
            attempts += len(claimed)
        return attempts

    async def _attempt_into(self, claimed: outbox.Claimed, outcomes: list[outbox.Outcome]) -> None:
        outcomes.append(await self.attempt(claimed))

    # --- the loop --------------------------------------------------------------------------------

    async def _start_deliveries(self, tasks: TaskGroup) -> float:
        """Start what is due in the free slots; return how long to pause at most."""
        free = self._config.delivery.concurrency - self._in_flight
        if free <= 0:
            return self._interval  # a finishing delivery wakes the loop
        due = await outbox.due(self._db)
        if due.now:
            for claimed in await self._take(free):
                self._in_flight += 1
                tasks.start_soon(self._deliver_and_wake, claimed)
            due = await outbox.due(self._db)
        wait = clock.seconds_until(due.next_at)  # None also for a moment written around the store as no moment
        if wait is None:
            return self._interval
        return min(self._interval, max(MIN_PAUSE, wait))

    async def _deliver_and_wake(self, claimed: outbox.Claimed) -> None:
        try:
            outcome = await self.attempt(claimed)  # first: the recorder swaps the list meanwhile
            self._outcomes.append(outcome)
            self._outcomes_waiting.set()
        finally:
            self._in_flight -= 1
            self._wake.set()

    async def _recorder(self) -> None:
        """Outcomes are written in groups (one transaction per `RECORD_WINDOW`), not one each."""
        try:
            while True:
                await self._outcomes_waiting.wait()
                await anyio.sleep(RECORD_WINDOW)
                self._outcomes_waiting = anyio.Event()
                batch, self._outcomes = self._outcomes, []
                await self._record(batch)
        finally:
            batch, self._outcomes = self._outcomes, []
            await self._record(batch)

    async def _round(self, tasks: TaskGroup) -> float:
        try:
            await self._sweep()
            return await self._start_deliveries(tasks)
        except StoreError as exc:
            logger.warning("Notification delivery paused (%s); trying again", exc.message)
        except Exception:
            logger.exception("Notification delivery round failed; trying again")
        return self._interval

    async def _pause(self, push: Wakeups | None, seconds: float) -> None:
        with anyio.move_on_after(seconds):
            async with anyio.create_task_group() as waiting:
                async def on_wake() -> None:
                    await self._wake.wait()
                    waiting.cancel_scope.cancel()

                async def on_push() -> None:
                    assert push is not None
                    if await push.wait(seconds):
                        await anyio.sleep(BATCH_WINDOW)  # a burst of changes: one round, not one each
                    waiting.cancel_scope.cancel()

                waiting.start_soon(on_wake)
                if push is not None:
                    waiting.start_soon(on_push)
        self._wake = anyio.Event()

    async def _run_without_destinations(self) -> None:
        """Nothing to deliver to: mark events routed (to no one) and purge, now and then."""
        while True:
            try:
                await self._sweep()
                while await outbox.route(self._db, self._router):
                    pass
            except StoreError as exc:
                logger.warning("Notification bookkeeping paused (%s); trying again", exc.message)
            await anyio.sleep(self._sweep_every)

    async def run(self) -> None:
        """Deliver until cancelled; on the way out hand back what is still held."""
        if not self._destinations:
            await self._run_without_destinations()
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._recorder)
                if self._wakeups is None:
                    while True:
                        await self._pause(None, await self._round(tasks))
                async with self._wakeups() as push:
                    while True:
                        await self._pause(push, await self._round(tasks))
        finally:
            # Shielded and bounded; if the store is gone, the leases run out instead.
            with anyio.CancelScope(shield=True), anyio.move_on_after(5), contextlib.suppress(StoreError):
                await outbox.release(self._db, self.name)

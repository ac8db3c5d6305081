"""The background diagnosis of failed runs: each one once, with bounded concurrency.

Every `interval` seconds (or at once when woken) the worker looks for failed runs that finished
within `max_age` and have no diagnosis (or only `unavailable`, or a claim whose lease ran out),
newest first; it claims as many as it has free slots and diagnoses them. Claims are rows in the
store, so the work survives restarts and is shared by replicas: whoever claims a run diagnoses it,
the others skip it.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta

import anyio

from mcp_knecht.ai import diagnoses
from mcp_knecht.ai.diagnosis import WORKER_ACTOR, DiagnosisService
from mcp_knecht.core.clock import timestamp
from mcp_knecht.core.database import Database

logger = logging.getLogger(__name__)

GIVE_UP_EVERY = 30.0
"""Seconds between looks for claims that lapsed too often (they become `failed`)."""
DEFAULT_CONCURRENCY = 2
DEFAULT_INTERVAL = 2.0
DEFAULT_MAX_AGE = timedelta(days=7)
"""Older failures are diagnosed on demand only: a first start on a long history should not call the
model for every failure of the past years."""


def _run_time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")  # the format runs' timestamps are stored in


class DiagnosisWorker:
    def __init__(self, service: DiagnosisService, db: Database, *, concurrency: int = DEFAULT_CONCURRENCY,
                 interval: float = DEFAULT_INTERVAL, max_age: timedelta | None = DEFAULT_MAX_AGE) -> None:
        self._service = service
        self._db = db
        self._slots = max(1, concurrency)
        self._interval = interval
        self._max_age = max_age
        self._busy: set[int] = set()
        self._wake = anyio.Event()
        self._next_give_up = 0.0
        self._below: int | None = None
        """Where the last scan stopped: a wake-up (a slot freed) goes on below it, through a backlog,
        without re-reading the runs above it that are done or under way."""
        self.done = 0
        """Diagnoses this worker finished (whatever their outcome)."""

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        """Until cancelled; run it in the server's task group."""
        async with anyio.create_task_group() as tasks:
            while True:
                try:
                    await self.scan(tasks)
                except Exception:  # a store hiccup must not end the worker
                    logger.exception("The diagnosis worker's scan failed; trying again")
                with anyio.move_on_after(self._interval) as timer:
                    await self._wake.wait()
                if timer.cancelled_caught:
                    self._below = None  # the periodic look starts from the newest failures again
                self._wake = anyio.Event()

    async def scan(self, tasks: anyio.abc.TaskGroup) -> int:
        """Claim and start what free slots allow; return how many were started."""
        free = self._slots - len(self._busy)
        if free <= 0:
            return 0
        now = datetime.now(UTC)
        if time.monotonic() >= self._next_give_up:  # a write: not on every wake-up
            self._next_give_up = time.monotonic() + GIVE_UP_EVERY
            await diagnoses.give_up_stale(self._db, now=timestamp(now))
        since = _run_time(now - self._max_age) if self._max_age is not None else None
        found = await diagnoses.candidates(self._db, now=timestamp(now), finished_since=since,
                                           limit=free + len(self._busy) + 8, below=self._below)
        if not found and self._below is not None:
            self._below = None
            found = await diagnoses.candidates(self._db, now=timestamp(now), finished_since=since,
                                               limit=free + len(self._busy) + 8)
        started = 0
        for run_id in found:
            if started >= free:
                break
            self._below = run_id
            if run_id in self._busy:
                continue
            owner = self._service.new_owner()
            if await self._service.claim(run_id, owner):
                self._busy.add(run_id)
                tasks.start_soon(self._diagnose, run_id, owner)
                started += 1
        return started

    async def _diagnose(self, run_id: int, owner: str) -> None:
        try:
            outcome = await self._service.run_claimed(run_id, WORKER_ACTOR, owner)
            if outcome["status"] != "done":
                logger.warning("Diagnosis of run %s: %s (%s)", run_id, outcome["status"], outcome.get("error"))
        except Exception:
            logger.exception("Diagnosis of run %s failed", run_id)
        finally:
            self._busy.discard(run_id)
            self.done += 1
            self.wake()  # a slot is free

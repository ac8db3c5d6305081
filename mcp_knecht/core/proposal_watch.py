"""Noticing decisions made elsewhere — by an operator's CLI, on another replica — so that
connected agents can be told without asking."""

from __future__ import annotations

import heapq
import logging
from collections.abc import Awaitable, Callable

import anyio
import msgspec

from mcp_knecht.core import clock
from mcp_knecht.core.changes import ChangeFeed
from mcp_knecht.core.proposals import OPEN, Proposal, ProposalRepository

logger = logging.getLogger(__name__)

LOOK_AT_ALL_SECONDS = 15.0
"""How often the watcher reads every open proposal however many changes the store names: for the
changes nobody announces (a row written around the store, a lost notification)."""
EXPIRY_LOOK_SECONDS = 1.0
"""A look at the proposals whose time has run out comes at least this often, whatever else wakes it."""
PRIME_PAGE = 1_000


class StatusChange(msgspec.Struct, frozen=True):
    """A proposal whose status changed, as told to its proposer's subscriptions."""
    proposal_id: int
    status: str
    subject: str
    """The proposer: only they may learn about it."""


Listener = Callable[[StatusChange], Awaitable[None]]


class ProposalWatcher:
    def __init__(self, proposals: ProposalRepository, changes: ChangeFeed, *,
                 interval: float = LOOK_AT_ALL_SECONDS) -> None:
        """Looks whenever `changes` wakes it, at just the proposals it names where it names them
        (`Wakeups.keys`) and at those whose time has run out since (an expiry nobody announces), and at
        everything at least every `interval` seconds. A look at everything costs a row per open proposal:
        with an agent's hundred thousand waiting, a look twice a second kept a core busy."""
        self._proposals = proposals
        self._interval = interval
        self._changes = changes
        self._listeners: list[Listener] = []
        self._open: dict[int, str] = {}
        self._expiring: list[tuple[str, int]] = []
        """(expires_at, id) of every pending proposal seen: a heap, soonest first."""
        self._newest = 0
        self._primed = False

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    async def _prime(self) -> None:
        """Start from what exists: the newest id and the open proposals, not the whole history."""
        newest = await self._proposals.list(limit=1)
        self._newest = newest[0].id if newest else 0
        for status in OPEN:
            after = 0
            while page := await self._proposals.list(status=status, after_id=after, limit=PRIME_PAGE,
                                                     oldest_first=True):
                for proposal in page:
                    self._track(proposal)
                after = page[-1].id
        self._primed = True

    def _track(self, proposal: Proposal) -> None:
        self._open[proposal.id] = proposal.status
        if proposal.status == "pending":
            heapq.heappush(self._expiring, (proposal.expires_at, proposal.id))

    def _overdue(self) -> list[int]:
        """The pending proposals whose time has run out since the last look (popped from the heap)."""
        now, due = clock.timestamp(), []
        while self._expiring and self._expiring[0][0] <= now:
            _, proposal_id = heapq.heappop(self._expiring)
            if self._open.get(proposal_id) == "pending":
                due.append(proposal_id)
        if len(self._expiring) > 2 * len(self._open) + PRIME_PAGE:  # mostly decided ones: keep the heap small
            self._expiring = [entry for entry in self._expiring if self._open.get(entry[1]) == "pending"]
            heapq.heapify(self._expiring)
        return due

    async def poll(self, moved: frozenset[int] | None = None) -> list[StatusChange]:
        """One look at the store; returns (and announces) what changed since the last. `moved`: the only
        proposals that changed since (as the store announced them); None: look at every open one."""
        if not self._primed:
            await self._prime()
            moved = None
        changes = []
        looks_new = moved is None or any(proposal_id > self._newest for proposal_id in moved)
        while looks_new and (fresh := await self._proposals.list(after_id=self._newest, limit=1000,
                                                                    oldest_first=True)):
            for proposal in fresh:
                self._newest = proposal.id
                if proposal.status in OPEN:
                    self._track(proposal)
                else:  # staged and decided between two looks
                    changes.append(StatusChange(proposal.id, proposal.status, proposal.proposer_subject))
        if moved is None:
            looked_at = list(self._open)
        else:
            looked_at = list(dict.fromkeys([*(i for i in moved if i in self._open), *self._overdue()]))
        if looked_at:  # proposals are never deleted: one that is not `settled` is still pending
            settled = await self._proposals.settled(looked_at)
            for proposal_id, (status, subject) in settled.items():
                before = self._open[proposal_id]
                if status != before:
                    changes.append(StatusChange(proposal_id, status, subject))
                    if status in OPEN:
                        self._open[proposal_id] = status
                    else:
                        del self._open[proposal_id]
        for change in changes:
            for listener in self._listeners:
                try:
                    await listener(change)
                except Exception:  # one broken listener must not silence the others
                    logger.exception("A proposal listener failed")
        return changes

    async def run(self) -> None:
        """Poll until cancelled; the first look records what already exists, so only later
        changes are announced."""
        async with self._changes.watching("proposals") as wakeups:
            moved: frozenset[int] | None = None
            looked_at_all = anyio.current_time()
            while True:
                if moved is None or anyio.current_time() - looked_at_all >= self._interval:
                    moved, looked_at_all = None, anyio.current_time()
                looked = await self._poll_logged(moved)
                until_all = max(0.0, self._interval - (anyio.current_time() - looked_at_all))
                woke = await wakeups.wait(min(until_all, EXPIRY_LOOK_SECONDS))
                # A quiet wait named nothing (the next look is at what ran out of time); after a look that
                # failed, the next one is at everything: what it missed is among it.
                moved = (wakeups.keys if woke else frozenset()) if looked else None

    async def _poll_logged(self, moved: frozenset[int] | None) -> bool:
        try:
            await self.poll(moved)
        except Exception:
            logger.exception("Watching proposals failed; retrying")
            return False
        return True

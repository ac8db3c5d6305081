"""Noticing decisions made elsewhere — by an operator's CLI, on another replica — so that
connected agents can be told without asking."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio
import msgspec

from mcp_knecht.core.changes import ChangeFeed
from mcp_knecht.core.proposals import OPEN, ProposalRepository

logger = logging.getLogger(__name__)


class StatusChange(msgspec.Struct, frozen=True):
    """A proposal whose status changed, as told to its proposer's subscriptions."""
    proposal_id: int
    status: str
    subject: str
    """The proposer: only they may learn about it."""


Listener = Callable[[StatusChange], Awaitable[None]]


class ProposalWatcher:
    def __init__(self, proposals: ProposalRepository, changes: ChangeFeed, *, interval: float = 0.5) -> None:
        """Looks whenever `changes` wakes it (at once on a store that pushes), at just the proposals it
        names where it names them (`Wakeups.keys`), and at everything at least every `interval` seconds
        (expiry is a change nobody announces)."""
        self._proposals = proposals
        self._interval = interval
        self._changes = changes
        self._listeners: list[Listener] = []
        self._open: dict[int, str] = {}
        self._newest = 0
        self._primed = False

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    async def _prime(self) -> None:
        """Start from what exists: the newest id and the open proposals, not the whole history."""
        newest = await self._proposals.list(limit=1)
        self._newest = newest[0].id if newest else 0
        for status in OPEN:
            for proposal in await self._proposals.list(status=status, limit=100_000):
                self._open[proposal.id] = proposal.status
        self._primed = True

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
                    self._open[proposal.id] = proposal.status
                else:  # staged and decided between two looks
                    changes.append(StatusChange(proposal.id, proposal.status, proposal.proposer_subject))
        looked_at = list(self._open) if moved is None else [i for i in moved if i in self._open]
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
                woke = await wakeups.wait(until_all)
                # After a look that failed, the next one is at everything: what it missed is among it.
                moved = wakeups.keys if woke and looked else None

    async def _poll_logged(self, moved: frozenset[int] | None) -> bool:
        try:
            await self.poll(moved)
        except Exception:
            logger.exception("Watching proposals failed; retrying")
            return False
        return True

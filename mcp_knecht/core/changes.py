"""Change notifications: "something under this topic may have changed", as soon as the store can say.

    async with changes.watching("proposals", proposal_id) as wakeups:   # interest registered first,
        proposal = await read()                                          # so nothing slips in between
        while proposal.status in OPEN:
            await wakeups.wait(timeout)        # woken by a change (any process, any replica), or timeout
            proposal = await read()

A wake-up means "read again", never "it changed": callers always re-read, so a spurious or lost
notification costs latency, never correctness. The store implements it: PostgreSQL with
LISTEN/NOTIFY on channel `knecht_<topic>` (payload: the key), every other store by polling.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Protocol


class Wakeups(Protocol):
    async def wait(self, timeout: float) -> bool:
        """True when something watched may have changed since the last wait (or since `watching`
        began); False when `timeout` seconds passed quietly."""
        ...


class ChangeFeed(Protocol):
    def watching(self, topic: str, key: int | None = None) -> AbstractAsyncContextManager[Wakeups]:
        """Wake-ups for changes of `key` under `topic` (`None`: any key)."""
        ...

    async def aclose(self) -> None: ...

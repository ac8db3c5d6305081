"""Change notifications: "something under this topic may have changed", as soon as the store can say.

    async with changes.watching("proposals", proposal_id) as wakeups:   # interest registered first,
        proposal = await read()                                          # so nothing slips in between
        while proposal.status in OPEN:
            await wakeups.wait(timeout)        # woken by a change (any process, any replica), or timeout
            proposal = await read()

A wake-up means "read again", never "it changed": callers always re-read, so a spurious or lost
notification costs latency, never correctness. The store implements it: PostgreSQL with
LISTEN/NOTIFY on channel `knecht_<topic>` (payload: the key), SQLite by polling (naming the keys its
notification outbox holds).

Where the store announced every change with its key, `wakeups.keys` names the keys that woke the
last wait, so a watcher of a whole topic can read just those; None means "anything may have
changed" (polling, a lost connection, more keys than it is worth naming), and it reads it all.
A change nobody announces (a row written around the store, a lost notification) is only found by
reading it all, which such a watcher therefore still does every so often however many keys arrive.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Protocol


class Wakeups(Protocol):
    async def wait(self, timeout: float) -> bool:
        """True when something watched may have changed since the last wait (or since `watching`
        began); False when `timeout` seconds passed quietly."""
        ...

    @property
    def keys(self) -> frozenset[int] | None:
        """After a wait that returned True: the keys announced as changed (see the module); None: unknown."""
        ...


class ChangeFeed(Protocol):
    def watching(self, topic: str, key: int | None = None) -> AbstractAsyncContextManager[Wakeups]:
        """Wake-ups for changes of `key` under `topic` (`None`: any key)."""
        ...

    async def aclose(self) -> None: ...

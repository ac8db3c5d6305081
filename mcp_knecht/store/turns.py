"""Turns: one holder per name at a time, and waiters that can stop waiting once it is pointless.

    async with db.turn("proposal:12", moved=decided_meanwhile) as mine:
        if not mine:      # we had to wait, and `moved()` says the turn before ours settled it
            ...
        ...               # ours: nobody else holds "proposal:12" until this block ends

A turn is not a transaction and takes no write lock: racing operators queue on the proposal they
race for, not on the store, and the many who come too late learn it from one short read when their
turn comes (`moved`) instead of each taking the store's write lock only to find the proposal decided.
Correctness never rests on a turn — the transaction after it still checks everything under the
write lock — so a turn that cannot be had across processes (no `fcntl`, a read-only folder) is
only in-process, and nothing is wrong, only slower.

Within a process a turn is an `anyio.Event` per held name: waiters wake the moment the holder
leaves. Across processes (`Turns(path)`, SQLite) it is also a POSIX record lock on one byte of
`<db>-turns` (the byte's offset a hash of the name), tried again at every look (after 4 ms, then
doubling up to 32 ms). A `blocking` waiter (a CLI deciding one proposal, with nothing else to run)
instead sleeps in the kernel, which hands it the lock the moment the holder lets go (looking only
after each slice of a long wait), and the racing approvers take their turns one right after another
(`mcp_knecht.store.kernel_wait`; measured: 22 % more decisions a second with eight racing
approvers, 8 % less CPU each). The kernel drops a dead process's locks, even after `kill -9`; one
held longer than `WAIT_AT_MOST` (a stopped process) is gone on without. POSIX record locks belong
to the process, not to a file descriptor, so each process keeps one `Turns` per database file,
shared by every connection to it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.lowlevel

from mcp_knecht.store.kernel_wait import SLICE, wait_in_kernel

try:
    import fcntl
except ImportError:  # not on Windows: turns are only in-process there
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

Moved = Callable[[], Awaitable[bool]]
"""Asked while waiting: True when waiting is pointless now (the caller gets `False` for its turn)."""

POLL_FIRST, POLL_MAX = 0.004, 0.032
"""Seconds between two looks at a turn held in another process: doubling from the first to the most.
A claim holds its turn a millisecond or a few; every look wakes a process whose caches went cold
meanwhile (eight racing approvers share two cores), so fewer, later looks cost the late ones less."""
WAIT_AT_MOST = 15.0
"""A turn held longer than this by another process (a stopped one) is gone on without."""


def _offset(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=7).digest(), "big")


class Turns:
    """The turns of one store in this process; `path`: the file whose record locks reach other processes."""

    def __init__(self, path: Path | None = None) -> None:
        self._held: dict[str, anyio.Event] = {}
        self._fd: int | None = None
        if path is not None and fcntl is not None:
            with contextlib.suppress(OSError):
                self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    @property
    def spans_processes(self) -> bool:
        """Whether other processes queue here too (the record locks could be had)."""
        return self._fd is not None

    def _try_across(self, name: str) -> bool:
        if self._fd is None:
            return True
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _offset(name))
        except (BlockingIOError, PermissionError):  # EAGAIN or EACCES: another process holds it
            return False
        except OSError:  # no record locks here (ENOLCK, …): the turn is only in-process
            return True
        return True

    def _wait_across(self, name: str, seconds: float) -> bool | None:
        """Sleep in the kernel until `name` is ours across processes (True) or `seconds` have passed
        (False); None where that cannot be done here, and the caller looks instead."""
        if (fd := self._fd) is None:
            return None
        return wait_in_kernel(lambda: fcntl.lockf(fd, fcntl.LOCK_EX, 1, _offset(name)),
                              lambda: self._try_across(name), seconds)

    def _release_across(self, name: str) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, _offset(name))

    @asynccontextmanager
    async def turn(self, name: str, *, moved: Moved, blocking: bool = False) -> AsyncIterator[bool]:
        """Hold `name`'s turn (True). Once the caller has had to wait, `moved()` is asked at every look
        (held or not): when it is true the caller gets False at once — whoever held the turn settled
        what it came for — and the late ones do not queue for the turn one after another. `blocking`:
        a turn held in another process is waited for in the kernel, blocking this thread (see the
        module), in slices of `kernel_wait.SLICE`: `moved()` is asked when the turn is ours, and after
        each slice of a long wait."""
        pause, deadline = POLL_FIRST, anyio.current_time() + WAIT_AT_MOST
        waited = False
        while (holder := self._held.get(name)) is not None or not self._try_across(name):
            if waited and await moved():
                yield False
                return
            waited = True
            sliced = False
            if holder is None and blocking:
                got = self._wait_across(name, min(deadline - anyio.current_time(), SLICE))
                blocking = got is not None  # where the kernel cannot be waited in, look instead
                if got:
                    break
                sliced = got is False
            if holder is None and anyio.current_time() > deadline:
                # A process stopped while holding it (SIGSTOP, a debugger) must not stop every decision of
                # it: go on without the turn; the transaction after it still decides.
                logger.warning("%s has been held by another process for %g s; going on without its turn",
                               name, WAIT_AT_MOST)
                break
            if sliced:
                await anyio.lowlevel.checkpoint()  # a cancellation (Ctrl-C) gets through, then the next look
            elif holder is not None:
                # This process's holder, set when it leaves, with no deadline: it cannot be stopped while this
                # task runs, and a deadline past due would only make every waiter look again and again.
                await holder.wait()
            else:
                await anyio.sleep(pause)  # another process's: a look every few milliseconds
                pause = min(pause * 2, POLL_MAX)
        left = self._held[name] = anyio.Event()
        try:
            yield not (waited and await moved())
        finally:
            del self._held[name]
            self._release_across(name)
            left.set()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


_SHARED: dict[str, tuple[Turns, int]] = {}
_SHARED_GUARD = threading.Lock()


def shared_turns(path: Path) -> Turns:
    """This process's `Turns` of the database at `path` (see the module: one per file and process)."""
    key = os.path.realpath(path)
    with _SHARED_GUARD:
        turns, users = _SHARED.get(key, (None, 0))
        if turns is None:
            turns = Turns(Path(f"{key}-turns"))
        _SHARED[key] = (turns, users + 1)
        return turns


def release_turns(path: Path) -> None:
    """One user of `shared_turns(path)` is done; the last one closes the file (which drops its locks)."""
    key = os.path.realpath(path)
    with _SHARED_GUARD:
        turns, users = _SHARED[key]
        if users > 1:
            _SHARED[key] = (turns, users - 1)
        else:
            del _SHARED[key]
            turns.close()

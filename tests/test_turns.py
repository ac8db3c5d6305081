"""Turns: racing deciders of one proposal queue outside any transaction, and the late ones give up
after one look (mcp_knecht.store.turns)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

from mcp_knecht.store import kernel_wait
from mcp_knecht.store import turns as turns_module
from mcp_knecht.store.turns import Turns, release_turns, shared_turns

pytestmark = pytest.mark.anyio

HOLDER = textwrap.dedent("""
    import sys, time, anyio
    from pathlib import Path
    from mcp_knecht.store.turns import Turns

    async def main() -> None:
        async def never_moved() -> bool:
            return False
        async with Turns(Path(sys.argv[1])).turn(sys.argv[2], moved=never_moved) as ours:
            assert ours
            print("holding", flush=True)
            await anyio.sleep(float(sys.argv[3]))

    anyio.run(main)
""")


def _hold_in_another_process(path: Path, name: str, seconds: float) -> subprocess.Popen[str]:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), name, str(seconds)],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
    return holder


def _stop(holder: subprocess.Popen[str]) -> None:
    holder.kill()
    holder.communicate()


@contextmanager
def _stopped_holder(path: Path, name: str) -> Iterator[None]:
    """Another process holds `name`'s turn and is stopped (SIGSTOP, a debugger): it never lets go."""
    holder = _hold_in_another_process(path, name, 30)
    os.kill(holder.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(holder.pid, signal.SIGCONT)
        _stop(holder)


async def _still_open() -> bool:
    return False


class _Looks:
    """A `moved` that counts how often it is asked, and says the business is still open."""

    def __init__(self) -> None:
        self.count = 0

    async def __call__(self) -> bool:
        self.count += 1
        return False


def _no_alarm_left() -> bool:
    return signal.getsignal(signal.SIGALRM) is signal.SIG_DFL and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


async def test_an_uncontended_turn_is_held_at_once_and_asks_nothing(tmp_path: Path) -> None:
    asked = 0

    async def moved() -> bool:
        nonlocal asked
        asked += 1
        return True

    turns = Turns(tmp_path / "db-turns")
    async with turns.turn("proposal:1", moved=moved) as ours:
        assert ours
    assert asked == 0


async def test_in_process_waiters_wake_when_the_holder_leaves_and_give_up_once_it_settled_their_business(
    tmp_path: Path,
) -> None:
    turns = Turns(tmp_path / "db-turns")
    decided = False
    answers: list[bool] = []

    async def moved() -> bool:
        return decided

    async def late() -> None:
        async with turns.turn("proposal:1", moved=moved) as ours:
            answers.append(ours)

    async with anyio.create_task_group() as tasks, turns.turn("proposal:1", moved=moved) as ours:
        assert ours
        for _ in range(5):
            tasks.start_soon(late)
        await anyio.sleep(0.05)
        assert answers == []  # all still waiting
        decided = True
    assert answers == [False] * 5
    async with turns.turn("proposal:2", moved=moved) as ours:  # another name was never held
        assert ours


async def test_a_waiter_behind_this_process_s_holder_looks_once_when_it_leaves_however_long_it_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past the deadline for a stopped holder in another process, a waiter behind a holder of its own
    process still only waits: it does not look again and again while the holder works."""
    monkeypatch.setattr(turns_module, "WAIT_AT_MOST", 0.02)
    turns, looks = Turns(tmp_path / "db-turns"), _Looks()

    async def behind() -> None:
        async with turns.turn("proposal:1", moved=looks) as ours:
            assert ours

    async with anyio.create_task_group() as tasks, turns.turn("proposal:1", moved=_still_open):
        tasks.start_soon(behind)
        await anyio.sleep(0.3)  # fifteen times the deadline
        assert looks.count == 0
    assert looks.count == 1  # once, when the turn was its own


async def test_a_waiter_whose_business_is_still_open_gets_the_turn_after_the_holder(tmp_path: Path) -> None:
    turns = Turns(tmp_path / "db-turns")
    order: list[str] = []

    async def still_open() -> bool:
        return False

    async def second() -> None:
        async with turns.turn("proposal:1", moved=still_open) as ours:
            assert ours
            order.append("second")

    async with anyio.create_task_group() as tasks, turns.turn("proposal:1", moved=still_open):
        tasks.start_soon(second)
        await anyio.sleep(0.02)
        order.append("first")
    assert order == ["first", "second"]


async def test_a_turn_held_by_another_process_is_waited_for_and_freed_by_its_death(tmp_path: Path) -> None:
    path = tmp_path / "db-turns"
    holder = _hold_in_another_process(path, "proposal:7", 60)
    moved = _Looks()

    got: list[bool] = []

    async def wait_for_it() -> None:
        async with Turns(path).turn("proposal:7", moved=moved) as ours:
            got.append(ours)

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(wait_for_it)
            await anyio.sleep(0.3)
            assert got == []  # held elsewhere: this process waits
            async with Turns(path).turn("proposal:8", moved=moved) as ours:  # another proposal is free
                assert ours
            os.kill(holder.pid, signal.SIGKILL)  # the kernel drops a dead process's record locks
    finally:
        _stop(holder)
    assert got == [True] and moved.count >= 1  # asked while it waited; the business was still open, so it waited on


@pytest.mark.parametrize("blocking", [False, True], ids=["looking", "in-the-kernel"])
async def test_a_turn_held_too_long_by_a_stopped_process_is_gone_on_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, blocking: bool,
) -> None:
    """A turn only spares work; a process stopped while holding one (SIGSTOP, a debugger) must not
    stop every decision of that proposal. The transaction after the turn still decides."""
    monkeypatch.setattr(turns_module, "WAIT_AT_MOST", 0.3)
    with _stopped_holder(tmp_path / "db-turns", "proposal:9"):
        started = anyio.current_time()
        with anyio.fail_after(5):
            async with Turns(tmp_path / "db-turns").turn("proposal:9", moved=_still_open, blocking=blocking) as ours:
                assert ours
        assert anyio.current_time() - started >= 0.25
    assert _no_alarm_left()


def test_one_process_shares_one_turns_file_per_database_and_the_last_user_closes_it(tmp_path: Path) -> None:
    db = tmp_path / "knecht.db"
    first, second = shared_turns(db), shared_turns(tmp_path / "." / "knecht.db")
    assert first is second  # POSIX record locks belong to the process: one file descriptor for all
    assert oct((tmp_path / "knecht.db-turns").stat().st_mode & 0o777) == "0o600"
    release_turns(db)
    assert shared_turns(db) is first
    release_turns(db)
    release_turns(db)
    assert shared_turns(db) is not first
    release_turns(db)


async def test_a_blocking_waiter_sleeps_in_the_kernel_and_gets_the_turn_the_moment_the_holder_lets_go(
    tmp_path: Path,
) -> None:
    """What `knecht-approve` does (a blocking store): a look when the turn is its own and after each
    slice of the wait (a poller looks every few milliseconds); the alarm that bounds the wait is gone
    afterwards."""
    path = tmp_path / "db-turns"
    holder = _hold_in_another_process(path, "proposal:11", 0.6)
    moved = _Looks()

    try:
        started = anyio.current_time()
        async with Turns(path).turn("proposal:11", moved=moved, blocking=True) as ours:
            waited = anyio.current_time() - started
            assert ours
    finally:
        _stop(holder)
    assert 0.3 <= waited < 5 and 1 <= moved.count <= waited / kernel_wait.SLICE + 2
    assert _no_alarm_left()


async def test_a_blocking_waiter_leaves_an_alarm_the_process_uses_itself_alone_and_looks_instead(
    tmp_path: Path,
) -> None:
    path = tmp_path / "db-turns"
    holder = _hold_in_another_process(path, "proposal:13", 0.5)
    rang: list[int] = []
    moved = _Looks()

    previous = signal.signal(signal.SIGALRM, lambda signum, frame: rang.append(signum))
    try:
        async with Turns(path).turn("proposal:13", moved=moved, blocking=True) as ours:
            assert ours
        signal.setitimer(signal.ITIMER_REAL, 0.01)  # the process's own handler is still in place
        await anyio.sleep(0.1)
    finally:
        signal.signal(signal.SIGALRM, previous)
        _stop(holder)
    assert rang == [signal.SIGALRM] and moved.count > 1  # it looked every few milliseconds, as a server does


async def test_a_cancelled_blocking_waiter_stops_within_a_slice_of_its_wait(tmp_path: Path) -> None:
    """An operator's Ctrl-C (the CLI's task cancelled) gets through a long wait for a stopped holder:
    the event loop runs between two slices, and no alarm is left behind."""
    with _stopped_holder(tmp_path / "db-turns", "proposal:14"):
        started = anyio.current_time()
        with anyio.move_on_after(0.3) as cancelled:
            async with Turns(tmp_path / "db-turns").turn("proposal:14", moved=_still_open, blocking=True):
                pytest.fail("the turn is held by another process")
        assert cancelled.cancelled_caught
        assert anyio.current_time() - started < 0.3 + kernel_wait.SLICE + 0.5  # not WAIT_AT_MOST (15 s)
    assert _no_alarm_left()

"""Waiting for a file lock in the kernel, bounded by an alarm.

A process waiting for another's `flock` or record lock is woken by the kernel the moment the lock
is free — where a waiter that looks again every so often leaves the lock idle until its next look
(and, eight racing approvers on two cores, wakes for nothing in between). The kernel gives such a
wait no timeout, so an alarm (`SIGALRM`) interrupts it: that needs the main thread of a process
that uses no alarm of its own, and anything else is told to look instead. Callers wait in slices
(`SLICE`), so that their event loop, blocked meanwhile, still hears of a cancellation.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

SLICE = 0.2
"""Seconds a caller waits in the kernel at a time: between two slices its event loop runs, so that a
cancellation (Ctrl-C, a deadline) gets through while another process holds the lock for long."""


class _Expired(Exception):
    """Raised by the alarm that bounds the wait."""


def alarm_is_free() -> bool:
    """Only the main thread receives signals, and an alarm this process set for itself is not ours."""
    return (hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGALRM) is signal.SIG_DFL
            and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0))


def wait_in_kernel(lock: Callable[[], None], try_lock: Callable[[], bool], seconds: float) -> bool | None:
    """`lock()` (a blocking `flock`/`lockf`), for at most `seconds`: True once it returned, False when
    the time ran out first, None where no alarm may be used (`alarm_is_free`) or the kernel refused
    the wait (EDEADLK, ENOLCK, …) — then the caller looks for itself. `try_lock()` is the same lock
    without waiting: after the alarm it tells whether the lock was granted just before it rang (a
    lock this process holds never stands in its own way)."""
    if not alarm_is_free():
        return None
    armed = [True]

    def expire(signum: int, frame: object) -> None:
        if armed[0]:
            raise _Expired

    signal.signal(signal.SIGALRM, expire)
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
            lock()
        finally:
            armed[0] = False
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Expired:
        return try_lock()
    except OSError:
        return None
    finally:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)  # a late alarm, disarmed, is dropped here
    return True

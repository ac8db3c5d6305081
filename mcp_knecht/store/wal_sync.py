"""A durable SQLite commit whose flush to disk waits outside the write lock.

`PRAGMA synchronous = FULL` makes SQLite fsync the WAL inside COMMIT, while it and our writer queue
(`<db>-writers`) still hold the write lock: with eight racing approvers that flush was half of the
time the lock was held (0.5 to 0.7 ms of 0.8 to 1.2 ms per claim, measured), and every other writer
waited through it. Instead a durable transaction commits at NORMAL (the WAL is written, not
flushed), lets the lock go, and then flushes the WAL itself, before the transaction counts as
done. After that the commit is on disk as FULL would have left it: fsync writes back every dirty
page of the file, whoever wrote it.

Unless the WAL was restarted meanwhile. A writer may start it from the beginning again once a
checkpoint has copied every frame into the database file, so our frames can be overwritten
before we flush. They are in the database file by then. A checkpoint at NORMAL or FULL syncs the
database file after it, but one made by a tool set to `synchronous = OFF` does not. So the WAL
header's salt (new at every restart) is read before COMMIT, while SQLite's write lock is ours and
nobody else can restart it, and read again after the flush. If it differs, the database file is
flushed too. Our own commit restarting the WAL is also caught this way: the second flush is
harmless then, and rare (one commit in a few hundred follows a checkpoint).

One thing differs from FULL: other connections see the commit from COMMIT on, a fraction of a
millisecond before it is on disk (at FULL, SQLite publishes it after its flush). A decision takes
no risk from that: only the approver whose claim it is executes, and only after the flush, so a
power loss in that moment leaves a proposal pending that nobody ran. What others saw then (a
"not pending" answer, an outbox event) is undone with it; the WAL keeps commits in order, so no
later commit survives one that was lost.

A flush that fails leaves the transaction committed but not known to be on disk: `sync` raises, and
the caller hears the commit failed. A claim told so never executes, so the proposal stays
`executing` ("outcome unknown") until a person settles it; it never runs twice.
"""

from __future__ import annotations

import os

_SALT_OFFSET, _SALT_SIZE = 16, 8
"""The WAL header's salt-1 and salt-2 (https://sqlite.org/fileformat2.html#walformat)."""


class WalFlush:
    """One durable commit: `WalFlush.open(path)` before BEGIN, `note()` under SQLite's write lock just
    before COMMIT (at NORMAL), `sync()` after the lock is released."""

    def __init__(self, database: str, fd: int) -> None:
        self._database = database
        self._fd = fd
        self._salt = b""

    @classmethod
    def open(cls, database: str) -> WalFlush | None:
        """None when the WAL file cannot be opened: the caller commits at FULL instead."""
        try:
            return cls(database, os.open(f"{database}-wal", os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            return None

    def note(self) -> None:
        """Where the WAL stands: call it holding SQLite's write lock, before COMMIT."""
        self._salt = os.pread(self._fd, _SALT_SIZE, _SALT_OFFSET)

    def sync(self) -> None:
        """Flush the WAL (and the database file, if the WAL was restarted since `note`).
        Blocks for the disk: call it off the event loop, or where nothing else waits."""
        try:
            os.fdatasync(self._fd)
            if os.pread(self._fd, _SALT_SIZE, _SALT_OFFSET) != self._salt:
                database = os.open(self._database, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    os.fdatasync(database)
                finally:
                    os.close(database)
        finally:
            self.close()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

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

The database file is flushed through one descriptor per file and process, opened with the first
store on it and closed after the last (`share_database_file`), never one opened for the flush and
closed after it. Closing any descriptor of a file drops every POSIX lock the process holds on it,
SQLite's own among them (https://sqlite.org/howtocorrupt.html, "POSIX advisory locks canceled by a
separate thread doing close()"). Without its shared lock on the database file, this process's
connections look gone to the others. The next one to close its last connection then checkpoints
and deletes the WAL they still write to. Seen on 2026-12-07 with two servers and a third process
on one file: "database disk image is malformed", and proposals the servers could no longer find.
"""

from __future__ import annotations

import os
import threading

_SALT_OFFSET, _SALT_SIZE = 16, 8
"""The WAL header's salt-1 and salt-2 (https://sqlite.org/fileformat2.html#walformat)."""


_SHARED: dict[str, tuple[int, int]] = {}
_SHARED_GUARD = threading.Lock()


def share_database_file(database: str) -> int | None:
    """This process's read-only descriptor of the database file at `database` (see the module), for
    `WalFlush.open`; None when it cannot be opened. Every call is paired with
    `release_database_file(database)` once the caller's SQLite connections to it are closed."""
    key = os.path.realpath(database)
    with _SHARED_GUARD:
        fd, users = _SHARED.get(key, (-1, 0))
        if users == 0:
            try:
                fd = os.open(key, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
        _SHARED[key] = (fd, users + 1)
        return fd


def release_database_file(database: str) -> None:
    """One user of `share_database_file(database)` is done; the last one closes the descriptor."""
    key = os.path.realpath(database)
    with _SHARED_GUARD:
        fd, users = _SHARED.pop(key)
        if users > 1:
            _SHARED[key] = (fd, users - 1)
        else:
            os.close(fd)


class WalFlush:
    """One durable commit: `WalFlush.open(path, database_fd)` before BEGIN, `note()` under SQLite's write
    lock just before COMMIT (at NORMAL), `sync()` after the lock is released."""

    def __init__(self, database_fd: int, fd: int) -> None:
        self._database_fd = database_fd
        self._fd = fd
        self._salt = b""

    @classmethod
    def open(cls, database: str, database_fd: int) -> WalFlush | None:
        """`database_fd`: from `share_database_file`, never closed here. None when the WAL file cannot be
        opened: the caller commits at FULL instead."""
        try:
            return cls(database_fd, os.open(f"{database}-wal", os.O_RDONLY | os.O_CLOEXEC))
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
                os.fdatasync(self._database_fd)
        finally:
            self.close()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

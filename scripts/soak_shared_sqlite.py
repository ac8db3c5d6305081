#!/usr/bin/env python3
"""Several processes' stores on one SQLite file, with short-lived readers beside them: nothing may be lost.

    python scripts/soak_shared_sqlite.py [--writers 3] [--seconds 20] [--db PATH] [--json]

Starts `--writers` processes. Each opens the store (`mcp_knecht.store.open_database`) on one file
and makes durable commits, one row each, for `--seconds`. The WAL restarts after every checkpoint,
which happens every `CHECKPOINT_EVERY` commits. A further process opens a plain `sqlite3`
connection over and over, reads, and closes it, as a CLI or a backup would. Once all have stopped,
the file must pass `PRAGMA integrity_check`, and it must hold exactly the rows the writers were
told were committed.

This is what broke until 2026-12-07 (`mcp_knecht/store/wal_sync.py`). The flush after a WAL
restart opened and closed the database file, and that dropped the writers' SQLite locks. A
reader's close then checkpointed the WAL and deleted it under them. The result was "database disk
image is malformed" and lost commits. Exit status 1 if any row is missing or extra, any writer
failed, or the check does not pass.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mcp_knecht.store import open_database  # noqa: E402

TABLE = "CREATE TABLE IF NOT EXISTS soak_commits (id INTEGER PRIMARY KEY, writer TEXT NOT NULL, n INTEGER NOT NULL)"


async def _write(path: str, name: str, until: float) -> dict[str, Any]:
    db = await open_database(f"sqlite:///{path}", migrate=False)
    committed, errors = 0, []
    try:
        while time.time() < until:
            try:
                async with db.transaction(durable=True) as tx:
                    await tx.execute("INSERT INTO soak_commits (writer, n) VALUES (?, ?)", (name, committed))
            except Exception as exc:  # a soak counts every failure, of whatever kind
                errors.append(f"{type(exc).__name__}: {exc}")
                if len(errors) >= 20:
                    break
            else:
                committed += 1
    finally:
        await db.close()
    return {"writer": name, "committed": committed, "errors": errors}


def _read_and_close(path: str, until: float) -> dict[str, Any]:
    opened = 0
    errors: list[str] = []
    while time.time() < until:
        try:
            conn = sqlite3.connect(path, timeout=15)
            conn.execute("SELECT COUNT(*) FROM soak_commits").fetchone()
            conn.close()
            opened += 1
        except sqlite3.Error as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            if len(errors) >= 20:
                break
        time.sleep(0.005)
    return {"reader_opened": opened, "reader_errors": errors}


def _child(role: str, path: str, name: str, until: float) -> None:
    import anyio

    result = anyio.run(_write, path, name, until) if role == "writer" else _read_and_close(path, until)
    print(json.dumps(result))


def _check(path: str, writers: list[dict[str, Any]]) -> dict[str, Any]:
    conn = sqlite3.connect(path)
    try:
        integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
        found = dict(conn.execute("SELECT writer, COUNT(*) FROM soak_commits GROUP BY writer").fetchall())
    except sqlite3.Error as exc:
        return {"integrity": f"{type(exc).__name__}: {exc}", "missing": None, "extra": None}
    finally:
        conn.close()
    missing = sum(max(0, w["committed"] - found.get(w["writer"], 0)) for w in writers)
    extra = sum(max(0, found.get(w["writer"], 0) - w["committed"]) for w in writers)
    return {"integrity": integrity, "missing": missing, "extra": extra}


def soak(path: str, writers: int, seconds: float) -> dict[str, Any]:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(TABLE)
    conn.commit()
    conn.close()
    until = time.time() + seconds
    me = str(Path(__file__).resolve())
    # Names unique to this run, so that a `--db` kept from an earlier run counts only this run's rows.
    children = [subprocess.Popen([sys.executable, me, "--role", "writer", "--name", f"w{n}-{os.getpid()}", "--db", path,
                                  "--until", str(until)], stdout=subprocess.PIPE, text=True)
                for n in range(writers)]
    children.append(subprocess.Popen([sys.executable, me, "--role", "reader", "--db", path, "--until", str(until)],
                                     stdout=subprocess.PIPE, text=True))
    results = []
    for child in children:
        out, _ = child.communicate(timeout=seconds + 120)
        lines = out.strip().splitlines()
        results.append(json.loads(lines[-1]) if child.returncode == 0 and lines
                       else {"writer": "?", "committed": 0, "errors": [f"exit status {child.returncode}"]})
    written = [r for r in results if "writer" in r]
    reader = next((r for r in results if "reader_opened" in r), {"reader_opened": 0, "reader_errors": []})
    committed = sum(w["committed"] for w in written)
    report = {
        "writers": writers, "seconds": seconds,
        "committed": committed, "commits_per_s": round(committed / seconds, 1),
        "writer_errors": sum(len(w["errors"]) for w in written),
        "first_errors": [e for w in written for e in w["errors"]][:3] + reader["reader_errors"][:3],
        "reader_opened": reader["reader_opened"], "reader_errors": len(reader["reader_errors"]),
        **_check(path, written),
    }
    report["ok"] = (report["integrity"] == "ok" and report["missing"] == 0 and report["extra"] == 0
                    and report["writer_errors"] == 0 and report["reader_errors"] == 0)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writers", type=int, default=3, help="processes making durable commits (default 3)")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long they write (default 20)")
    parser.add_argument("--db", help="the SQLite file (default: a new one in a temporary folder)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    parser.add_argument("--role", choices=("writer", "reader"), help=argparse.SUPPRESS)
    parser.add_argument("--name", default="", help=argparse.SUPPRESS)
    parser.add_argument("--until", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        _child(args.role, args.db, args.name, args.until)
        return 0
    if args.writers < 1 or args.seconds <= 0:
        parser.error("--writers must be at least 1 and --seconds above 0")
    with tempfile.TemporaryDirectory(prefix="knecht-soak-") as folder:
        path = args.db or os.path.join(folder, "shared.db")
        if not args.json:
            print(f"{args.writers} writers and 1 reader on {path} for {args.seconds:g} s ...", file=sys.stderr)
        report = soak(path, args.writers, args.seconds)
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:>16}: {value}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

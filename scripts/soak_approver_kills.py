#!/usr/bin/env python3
"""Racing approvers killed with `kill -9` at random moments: every proposal runs at most once, audited first.

    python scripts/soak_approver_kills.py [--proposals 400] [--approvers 6] [--kills 20]
                                          [--stops 0] [--stop-seconds 20]
                                          [--order lockstep|shuffled] [--db URL] [--json]

Stages `--proposals` proposals of the test write tool `record_effect` (its effect inserts one row
into `test_effects`), then starts `--approvers` approver processes that race to approve all of them,
as `knecht-approve` does (its event loop, a blocking store). Every few tens of milliseconds one of
them that has opened the store is killed with SIGKILL and another takes its place, until `--kills`
have died: inside a turn, holding the store's write lock, between a claim's commit and its flush,
mid-execution, wherever the signal lands. With `--stops`, as many times one is stopped (SIGSTOP)
for `--stop-seconds` instead, holding whatever it held, and then let go on: the others wait for
its turn and its write lock (on PostgreSQL, any lock: `lock_timeout`) at most 15 s each, then go
on without the turn or hear "store busy" and ask again, as an operator would. On PostgreSQL, one
stopped past the server's `idle_in_transaction_session_timeout` (60 s) inside a transaction has its
session ended and that transaction rolled back; going on, it is told so and asks again. There a stop
waits (up to 2 s) until the victim's session is seen inside a transaction, and the report counts
how many were (`stopped_inside_a_transaction`; it may have ended before the signal landed). Then one
last approver, never killed, goes over them all.

Afterwards (the answers a crash may leave are those of `knecht-approve`: an approver killed while
executing leaves `executing`, "outcome unknown", and nothing ever runs it again):
- no proposal ran twice, none is still pending, none failed;
- a `succeeded` one ran exactly once, an `executing` one at most once, and there are no more of
  those than approvers killed;
- every proposal has exactly one claim in the audit log (`approved`), and every one that ran
  (its effect is in the database) has it; every `succeeded` one has exactly one `executed` row;
- `mcp-knecht audit verify` passes, and a SQLite file passes `PRAGMA integrity_check`.

A kill is not a power cut: the page cache survives it, so this says nothing about `fdatasync`
(`tests/test_durable_commit.py` and the README's durability paragraph do). Exit status 1 when any
check fails or an approver failed on its own.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_approvals import _effects, _env, _stage  # noqa: E402

KILL_PAUSE = (0.02, 0.12)
"""Seconds between two kills, drawn at random: a decision takes a few milliseconds, so kills land
anywhere in it."""
STOP_SECONDS = 20.0
"""How long a stopped approver stays stopped: past the turn's and the write lock's 15 s."""
READY = "ready"
STORE_BUSY = "The store is busy"
"""How `StoreBusyError`'s message begins."""


# --- one approver (run as a child: --worker) -------------------------------------------------------


async def _approve_all(name: str, first: int, last: int, seed: int | None) -> dict[str, Any]:
    from mcp_knecht.app import open_app
    from mcp_knecht.core.approval import Operator
    from mcp_knecht.core.settings import load_settings
    from mcp_knecht.errors import NotPendingError, StoreBusyError, StoreInterruptedError

    ids = list(range(first, last + 1))
    if seed is not None:
        random.Random(seed).shuffle(ids)
    won = lost = busy = ended = 0
    async with open_app(load_settings(), watch_policy=False, blocking_store=True) as app:
        print(READY, flush=True)
        for proposal_id in ids:
            while True:
                try:
                    await app.approvals.approve(proposal_id, Operator(name))
                except NotPendingError:  # decided by another, or left executing by one killed
                    lost += 1
                except StoreBusyError:  # a stopped approver holds the write lock: retry, as an operator would
                    busy += 1
                    await anyio.sleep(0.1)
                    continue
                except StoreInterruptedError:
                    ended += 1  # this one was stopped past PostgreSQL's idle timeout: its claim was undone
                    continue
                else:
                    won += 1
                break
    return {"operator": name, "won": won, "lost": lost, "busy": busy, "sessions_ended": ended}


def _worker(name: str, first: int, last: int, seed: int | None) -> None:
    from mcp_knecht.cli.event_loop import FAST_LOOP

    print(json.dumps(anyio.run(_approve_all, name, first, last, seed, backend_options=FAST_LOOP)), flush=True)


# --- the soak --------------------------------------------------------------------------------------


class Approver:
    """One approver process, and whether it has opened the store (only those are worth killing). On
    PostgreSQL its sessions carry its name (`application_name`), so that a stop can wait for one of them
    to be inside a transaction (`_in_transaction`)."""

    def __init__(self, name: str, first: int, last: int, seed: int | None, env: dict[str, str]) -> None:
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", name, str(first), str(last),
                   "" if seed is None else str(seed)]
        self.name = name
        url = env["KNECHT_DATABASE_URL"]
        if not url.startswith("sqlite"):
            env = {**env, "KNECHT_DATABASE_URL": f"{url}{'&' if '?' in url else '?'}application_name={name}"}
        self.process = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
        self.ready = threading.Event()
        self.lines: list[str] = []
        self.errors: list[str] = []
        self._readers = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._read_errors, daemon=True)]
        for reader in self._readers:
            reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.strip() == READY:
                self.ready.set()
            else:
                self.lines.append(line)

    def _read_errors(self) -> None:
        assert self.process.stderr is not None
        self.errors += self.process.stderr

    def finish(self, timeout: float) -> tuple[int, dict[str, Any] | None, str]:
        """(exit status, its report, its stderr)."""
        self.process.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout=30)
        report = json.loads(self.lines[-1]) if self.process.returncode == 0 and self.lines else None
        return self.process.returncode, report, "".join(self.errors)


def _decided(url: str, first: int, last: int) -> int:
    """How many of the proposals are no longer pending, read beside the racers (no store opened)."""
    sql = f"SELECT COUNT(*) FROM proposals WHERE id BETWEEN {int(first)} AND {int(last)} AND status <> 'pending'"
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30)
        try:
            return int(conn.execute(sql).fetchone()[0])
        finally:
            conn.close()

    async def count() -> int:
        import asyncpg

        conn = await asyncpg.connect(url)
        try:
            return int(await conn.fetchval(sql))
        finally:
            await conn.close()

    return anyio.run(count)


def _in_transaction(url: str, name: str, seconds: float = 2.0) -> bool:
    """Wait until a PostgreSQL session of approver `name` is inside a transaction (True), for at most
    `seconds`: a stop that lands there holds what that transaction holds (its locks, a claim not yet
    committed), which is what the bounds on lock waits and idle transactions are for."""
    async def look() -> bool:
        import asyncpg

        conn = await asyncpg.connect(url)
        try:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                if await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1"
                                       " AND xact_start IS NOT NULL", name):
                    return True
            return False
        finally:
            await conn.close()

    return anyio.run(look)


def _race_with_kills(env: dict[str, str], approvers: int, kills: int, stops: int, stop_seconds: float, first: int,
                     last: int, shuffled: bool, rng: random.Random, progress: bool) -> dict[str, Any]:
    def start(n: int) -> Approver:
        return Approver(f"operator-{n}", first, last, rng.randrange(1 << 30) if shuffled else None, env)

    url = env["KNECHT_DATABASE_URL"]
    actions = ["kill"] * kills + ["stop"] * stops
    rng.shuffle(actions)
    running = [start(n) for n in range(approvers)]
    started, done, killed, deadline = approvers, [], 0, time.monotonic() + 600
    decided_while_stopped: list[int] = []
    inside: int | None = None if url.startswith("sqlite") else 0  # stops that waited to land inside one
    while actions and time.monotonic() < deadline:
        time.sleep(rng.uniform(*KILL_PAUSE))
        done += [a for a in running if a.process.poll() is not None]
        running = [a for a in running if a.process.poll() is None]
        victims = [a for a in running if a.ready.is_set()]
        if not victims:
            if not running:  # all finished before the kills were done: start a fresh round
                running = [start(started + n) for n in range(approvers)]
                started += approvers
            continue
        victim, action = rng.choice(victims), actions.pop()
        if action == "stop":  # SIGSTOP: it holds whatever it holds (a turn, the write lock) until SIGCONT
            before = _decided(url, first, last)
            if inside is not None:
                inside += _in_transaction(url, victim.name)
            victim.process.send_signal(signal.SIGSTOP)
            time.sleep(stop_seconds)
            decided_while_stopped.append(_decided(url, first, last) - before)
            victim.process.send_signal(signal.SIGCONT)
        else:
            victim.process.send_signal(signal.SIGKILL)
            victim.finish(timeout=60)
            killed += 1
            running.remove(victim)
            running.append(start(started))
            started += 1
        if progress:
            print(f"\r  {killed} of {kills} approvers killed, {len(decided_while_stopped)} of {stops} stopped",
                  end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    failures, won, busy, ended = [], 0, 0, 0
    for approver in done + running:
        status, report, err = approver.finish(timeout=600)
        if status != 0:
            failures.append(f"{approver.name} exited {status}: {err.strip().splitlines()[-1:]}")
        elif report:
            won, busy, ended = won + report["won"], busy + report["busy"], ended + report["sessions_ended"]
    return {"killed": killed, "stopped": len(decided_while_stopped), "stopped_inside_a_transaction": inside,
            "decided_while_stopped": decided_while_stopped,
            "store_busy_retried": busy, "sessions_ended_retried": ended, "approvers_started": started,
            "approver_failures": failures,
            "won_by_racers": won}


def _audit_verify(env: dict[str, str]) -> dict[str, Any]:
    run = subprocess.run([str(Path(sys.executable).parent / "mcp-knecht"), "audit", "verify", "--json"], env=env,
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    try:
        verified: dict[str, Any] = json.loads(run.stdout)
    except ValueError:
        return {"ok": False, "problems": [run.stderr.strip()[-500:]]}
    return verified


async def _facts(env: dict[str, str], first: int, last: int) -> dict[int, dict[str, Any]]:
    """Per proposal: its label, status and audit outcomes."""
    from mcp_knecht.app import open_app
    from mcp_knecht.core.settings import load_settings

    async with open_app(load_settings(env=env), watch_policy=False) as app:
        proposals = await app.db.fetch_all(
            "SELECT id, status, arguments_json, error FROM proposals WHERE id BETWEEN ? AND ?", (first, last))
        audited = await app.db.fetch_all(
            "SELECT proposal_id, outcome FROM audit_log WHERE source = 'approval' AND proposal_id BETWEEN ? AND ?",
            (first, last))
    facts = {int(p["id"]): {"label": json.loads(p["arguments_json"])["label"], "status": p["status"],
                            "error": p["error"], "audit": Counter()} for p in proposals}
    for row in audited:
        facts[int(row["proposal_id"])]["audit"][row["outcome"]] += 1
    return facts


def _integrity(url: str) -> str:
    if not url.startswith("sqlite:///"):
        return "not checked (PostgreSQL)"
    conn = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


def judge(facts: dict[int, dict[str, Any]], effects: dict[str, int], may_leave_executing: int) -> dict[str, Any]:
    """`may_leave_executing`: how many executions the kills could have cut short (one per killed approver)."""
    statuses = Counter(f["status"] for f in facts.values())
    ran = {pid for pid, f in facts.items() if effects.get(f["label"], 0) > 0}
    return {
        "statuses": dict(statuses),
        "double_executions": sum(1 for n in effects.values() if n > 1),
        "succeeded_without_effect": sum(1 for pid, f in facts.items() if f["status"] == "succeeded" and pid not in ran),
        "executing_left": statuses.get("executing", 0),
        "executing_that_ran": sum(1 for pid in ran if facts[pid]["status"] == "executing"),
        "executing_beyond_kills": max(0, statuses.get("executing", 0) - may_leave_executing),
        "claims_not_one": sum(1 for f in facts.values() if f["audit"]["approved"] != 1),
        "ran_without_claim_audited": sum(1 for pid in ran if facts[pid]["audit"]["approved"] == 0),
        "succeeded_not_audited_once": sum(1 for f in facts.values()
                                          if f["status"] == "succeeded" and f["audit"]["executed"] != 1),
        "failed_with": sorted({str(f["error"])[:200] for f in facts.values() if f["status"] == "failed"})[:3],
        # An execution whose own write met the write lock held past the busy timeout (a stopped approver
        # holding it) fails, and nothing of it ran; any other failure is one.
        "failed_otherwise": sum(1 for pid, f in facts.items() if f["status"] == "failed"
                                and (pid in ran or not str(f["error"]).startswith(STORE_BUSY))),
    }


def soak(proposals: int, approvers: int, kills: int, order: str, db_url: str | None, seed: int,
         progress: bool = True, stops: int = 0, stop_seconds: float = STOP_SECONDS) -> dict[str, Any]:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="knecht-kills-") as folder:
        url = db_url or f"sqlite:///{folder}/soak.db"
        env = _env(url, folder)
        tag = f"kills{os.getpid()}x{int(time.time())}"
        if progress:
            print(f"staging {proposals} proposals in {url.split('@')[-1]} …", file=sys.stderr)
        first, last = anyio.run(_stage, env, proposals, tag)
        started = time.perf_counter()
        race = _race_with_kills(env, approvers, kills, stops, stop_seconds, first, last, order == "shuffled", rng,
                                progress)
        seconds = time.perf_counter() - started
        if progress:
            print("last approver, never killed …", file=sys.stderr)
        status, final, err = Approver("operator-last", first, last, None, env).finish(timeout=600)
        if status != 0:
            race["approver_failures"].append(f"operator-last exited {status}: {err.strip().splitlines()[-1:]}")
        effects = anyio.run(_effects, env, tag)
        facts = anyio.run(_facts, env, first, last)
        verified = _audit_verify(env)
        report = {
            "database": url.split("://")[0], "proposals": proposals, "approvers": approvers, "order": order,
            "seed": seed, "race_seconds": round(seconds, 2), **race,
            "won_by_last": final["won"] if final else None,
            **judge(facts, effects, race["killed"]),
            "audit_verified": bool(verified.get("ok")), "audit_rows": verified.get("rows"),
            "audit_problems": verified.get("problems", [])[:3],
            "integrity": _integrity(url),
        }
    report["ok"] = not report["approver_failures"] and checks_hold(report)
    return report


def checks_hold(report: dict[str, Any]) -> bool:
    """The checks of `judge`, the audit chain and the file, all as they must be."""
    return (report["double_executions"] == 0 and report["succeeded_without_effect"] == 0
            and report["executing_beyond_kills"] == 0 and report["claims_not_one"] == 0
            and report["ran_without_claim_audited"] == 0 and report["succeeded_not_audited_once"] == 0
            and report["failed_otherwise"] == 0 and set(report["statuses"]) <= {"succeeded", "executing", "failed"}
            and report["audit_verified"] and report["integrity"] in ("ok", "not checked (PostgreSQL)"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--proposals", type=int, default=400, help="proposals to decide (default 400)")
    parser.add_argument("--approvers", type=int, default=6, help="approvers racing at a time (default 6)")
    parser.add_argument("--kills", type=int, default=20, help="approvers to kill with SIGKILL (default 20)")
    parser.add_argument("--stops", type=int, default=0,
                        help="approvers to stop (SIGSTOP) for --stop-seconds, then let go on (default 0)")
    parser.add_argument("--stop-seconds", type=float, default=STOP_SECONDS,
                        help=f"how long each stays stopped (default {STOP_SECONDS:g})")
    parser.add_argument("--order", choices=("lockstep", "shuffled"), default="lockstep",
                        help="all approvers in id order (default), or each in its own order")
    parser.add_argument("--db", help="database URL (default: a SQLite file in a temporary folder)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the kills' timing and victims")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    parser.add_argument("--worker", nargs=4, metavar=("NAME", "FIRST", "LAST", "SEED"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        name, first, last, worker_seed = args.worker
        _worker(name, int(first), int(last), int(worker_seed) if worker_seed else None)
        return 0
    if args.proposals < 1 or args.approvers < 1 or args.kills < 0 or args.stops < 0 or args.stop_seconds < 0:
        parser.error("--proposals and --approvers must be at least 1, --kills, --stops and --stop-seconds at least 0")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    report = soak(args.proposals, args.approvers, args.kills, args.order, args.db, seed, progress=not args.json,
                  stops=args.stops, stop_seconds=args.stop_seconds)
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:>26}: {value}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

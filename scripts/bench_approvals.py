"""Decisions per second with racing approver processes, and double executions (must be 0).

    python scripts/bench_approvals.py [--proposals 400] [--approvers 8] [--order lockstep|shuffled]
                                      [--db URL] [--json]

Stages N proposals of a write tool whose effect inserts one row, then starts K approver
processes that each try to approve every one of them — all in the same order (`lockstep`: they
collide on every proposal, the worst case) or each in its own random order (`shuffled`). Reports
wall time, decisions/s (won approvals including their execution), attempts/s, CPU per decision,
and the number of effects per proposal counted in the database. Baseline in the same run: one
approver alone over the same number of fresh proposals, so the ratio shows what contention costs.

What bounds a decision physically is printed beside it: the disk's rate of `fdatasync` in the
data folder (a SQLite decision makes one durable commit), and the cores' CPU seconds per decision.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mcp_knecht.app import open_app  # noqa: E402
from mcp_knecht.core.actor import Actor  # noqa: E402
from mcp_knecht.core.settings import load_settings  # noqa: E402
from tests.toolsets import EFFECTS_TABLE  # noqa: E402

TOOLSETS = "mcp_knecht.knecht:toolset,tests.toolsets:toolset"
AGENT = frozenset({"runs:write", "proposals:read"})


def _env(db_url: str, data_dir: str) -> dict[str, str]:
    return {**os.environ, "KNECHT_DATABASE_URL": db_url, "KNECHT_DATA_DIR": data_dir,
            "KNECHT_CONFIG_DIR": str(REPO), "KNECHT_TOOLSETS": TOOLSETS, "PYTHONPATH": str(REPO)}


async def _stage(env: dict[str, str], count: int, tag: str) -> tuple[int, int]:
    async with open_app(load_settings(env=env), watch_policy=False) as app:
        async with app.db.transaction() as tx:
            await tx.execute(EFFECTS_TABLE)
        alice = Actor("bench-agent", "bench", AGENT)
        ids = []
        for n in range(count):
            result = await app.gate.call_tool(alice, "record_effect", {"label": f"{tag}-{n}"})
            ids.append(result.data["id"])  # type: ignore[index]
    return min(ids), max(ids)


async def _effects(env: dict[str, str], tag: str) -> dict[str, int]:
    async with open_app(load_settings(env=env), watch_policy=False) as app:
        rows = await app.db.fetch_all(
            "SELECT label, COUNT(*) AS n FROM test_effects WHERE label LIKE ? GROUP BY label", (f"{tag}-%",))
    return {row["label"]: row["n"] for row in rows}


def fsync_rate(folder: str, seconds: float = 1.0) -> float:
    """`write(4 KB) + fdatasync` per second in `folder`: the ceiling of durable commits one at a time."""
    fd, path = tempfile.mkstemp(dir=folder)
    try:
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            os.write(fd, b"x" * 4096)
            os.fdatasync(fd)
            done += 1
        return done / (time.perf_counter() - started)
    finally:
        os.close(fd)
        os.unlink(path)


def _race(env: dict[str, str], approvers: int, first: int, last: int,
          shuffled: bool = False) -> tuple[float, list[dict[str, Any]]]:
    started = time.perf_counter()
    reports = run_approvers(
        [[sys.executable, "-m", "tests.approver_worker", f"operator-{i}", str(first), str(last),
          *([str(i)] if shuffled else [])] for i in range(approvers)], env)
    return time.perf_counter() - started, reports


def run_approvers(commands: list[list[str]], env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Start one approver process per command at once; each prints its report as one JSON line."""
    workers = [subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True) for command in commands]
    reports = []
    for worker in workers:
        out, err = worker.communicate(timeout=900)
        if worker.returncode != 0:
            raise SystemExit(f"an approver failed:\n{err}")
        reports.append(json.loads(out))
    return reports


def run(proposals: int, approvers: int, db_url: str | None, order: str = "lockstep") -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        fsyncs = fsync_rate(folder)
        url = db_url or f"sqlite:///{folder}/bench.db"
        env = _env(url, folder)
        tag = f"bench{int(time.time())}"
        print(f"staging {2 * proposals} proposals in {url.split('@')[-1]}…", file=sys.stderr)
        solo_range = anyio.run(_stage, env, proposals, f"{tag}solo")
        race_range = anyio.run(_stage, env, proposals, f"{tag}race")
        print("baseline: 1 approver…", file=sys.stderr)
        _, solo = _race(env, 1, *solo_range)
        solo_seconds = solo[0]["seconds"]
        print(f"race: {approvers} approvers…", file=sys.stderr)
        race_wall, reports = _race(env, approvers, *race_range, shuffled=order == "shuffled")
        # Rates use the approvers' own clocks (from open store to done), not interpreter start-up.
        race_seconds = max(r["seconds"] for r in reports)
        effects = anyio.run(_effects, env, f"{tag}race")
    won = sum(r["won"] for r in reports)
    return {
        "database": url.split("://")[0],
        "proposals": proposals,
        "approvers": approvers,
        "order": order,
        "cpus": os.cpu_count(),
        "fdatasync_per_s": round(fsyncs),
        "baseline_decisions_per_s": round(proposals / solo_seconds, 1),
        "baseline_cpu_ms_per_decision": round(solo[0]["cpu_seconds"] / proposals * 1000, 2),
        "race_cpu_ms_per_decision": round(sum(r["cpu_seconds"] for r in reports) / max(won, 1) * 1000, 2),
        "baseline_system_ms_per_decision": round(solo[0]["system_seconds"] / proposals * 1000, 2),
        "race_system_ms_per_decision": round(sum(r["system_seconds"] for r in reports) / max(won, 1) * 1000, 2),
        "baseline_context_switches_per_decision": round(solo[0]["context_switches"] / proposals, 1),
        "race_context_switches_per_decision": round(sum(r["context_switches"] for r in reports) / max(won, 1), 1),
        "race_seconds": round(race_seconds, 2),
        "race_wall_seconds_with_startup": round(race_wall, 2),
        "race_decisions_per_s": round(won / race_seconds, 1),
        "race_attempts_per_s": round(proposals * approvers / race_seconds, 1),
        "ratio_race_to_baseline": round((won / race_seconds) / (proposals / solo_seconds), 2),
        "executed": len(effects),
        "double_executions": sum(1 for n in effects.values() if n > 1),
        "missing_executions": proposals - len(effects),
        "wins_per_approver": [r["won"] for r in reports],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--proposals", type=int, default=400)
    parser.add_argument("--approvers", type=int, default=8)
    parser.add_argument("--order", choices=("lockstep", "shuffled"), default="lockstep",
                        help="the order each approver tries the proposals in (default: all the same)")
    parser.add_argument("--db", help="database URL (default: a temporary SQLite file)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.proposals, args.approvers, args.db, args.order)
    if args.json:
        print(json.dumps(result))
        return
    print(f"store                 {result['database']}  ({result['cpus']} cpus; the data folder's disk: "
          f"{result['fdatasync_per_s']} fdatasync/s)")
    print(f"baseline (1 approver) {result['baseline_decisions_per_s']:>8} decisions/s  "
          f"({result['baseline_cpu_ms_per_decision']} ms CPU per decision in the approver, "
          f"{result['baseline_system_ms_per_decision']} ms of it in the kernel, "
          f"{result['baseline_context_switches_per_decision']} context switches)")
    print(f"race ({args.approvers} approvers, {args.order}) {result['race_decisions_per_s']:>8} decisions/s  "
          f"({result['race_attempts_per_s']} attempts/s, ratio {result['ratio_race_to_baseline']}x, "
          f"{result['race_cpu_ms_per_decision']} ms approver CPU per decision won, "
          f"{result['race_system_ms_per_decision']} ms of it in the kernel, "
          f"{result['race_context_switches_per_decision']} context switches of all approvers)")
    print(f"wins per approver     {result['wins_per_approver']}")
    print(f"executed              {result['executed']} of {args.proposals}")
    print(f"double executions     {result['double_executions']}")
    print(f"missing executions    {result['missing_executions']}")


if __name__ == "__main__":
    main()

"""Benchmark: list_runs with filters over a large run table, through the gate (validation, tool,
JSON, scrubbing). Target: median ≤ 5 ms per call over 1,000,000 runs.

    python scripts/bench_list_runs.py                 # 1,000,000 runs (built once, ~2 min; cached)
    python scripts/bench_list_runs.py --runs 100000   # quicker
    python scripts/bench_list_runs.py --rounds 200 --json

The demo database is generated without log lines (they do not matter to list_runs) and cached in
/tmp/mcp-knecht-bench/, keyed by run count and seed, so re-runs start at once.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from mcp_knecht.core.actor import Actor
from mcp_knecht.core.gate import Gate
from mcp_knecht.core.registry import Registry
from mcp_knecht.core.scrub import SecretRegistry
from mcp_knecht.knecht import knecht_tools, open_store
from mcp_knecht.knecht.demo import fill_demo_data

CACHE = Path(os.environ.get("KNECHT_BENCH_CACHE", "/tmp/mcp-knecht-bench"))
TARGET_MS = 5.0
ACTOR = Actor("bench", "bench", frozenset({"runs:read"}))

CASES: list[tuple[str, dict[str, Any]]] = [
    ("newest 20 (no filter)", {}),
    ("newest 50", {"limit": 50}),
    ("project", {"project": "payments-api"}),
    ("status failed", {"status": "failed"}),
    ("project + status", {"project": "storefront-web", "status": "failed"}),
    ("workflow by name (all projects)", {"workflow": "release"}),
    ("project + workflow + status", {"project": "knecht-cli", "workflow": "nightly", "status": "failed"}),
    ("project + branch", {"project": "payments-api", "branch": "main"}),
    ("branch only", {"branch": "main"}),
    ("trigger manual", {"trigger": "manual"}),
    ("status queued (rare)", {"status": "queued"}),
    ("trigger rerun + status failed", {"trigger": "rerun", "status": "failed"}),
    ("deep cursor (before=middle)", {"before": None}),
    ("project + status, deep cursor", {"project": "fastcodec", "status": "cancelled", "before": None}),
    # Adversarial: few or no rows match and no index covers the combination.
    ("worst: schedule on a feature branch", {"trigger": "schedule", "branch": "feature/dark-mode"}),
    ("worst: branch no run has", {"branch": "gone/branch"}),
]


class _NoAudit:
    def record(self, entry: object) -> None:
        pass

    def accepting(self) -> bool:
        return True


async def _database(runs: int, seed: int) -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"list-runs-{runs}-seed{seed}-v2.db"
    if path.exists():
        return path
    partial = path.with_suffix(".partial")
    for leftover in (partial, Path(f"{partial}-wal"), Path(f"{partial}-shm")):
        leftover.unlink(missing_ok=True)
    print(f"building {runs:,} runs into {path} (once) …", file=sys.stderr, flush=True)
    started = time.perf_counter()
    db = await open_store(f"sqlite:///{partial}")
    try:
        last = [0.0]

        def progress(message: str) -> None:
            if time.perf_counter() - last[0] > 10:
                last[0] = time.perf_counter()
                print(f"  {message}", file=sys.stderr, flush=True)

        await fill_demo_data(db, seed=seed, runs=runs, run_logs=False, progress=progress)
        await db.fetch_all("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        await db.close()
    partial.rename(path)
    print(f"built in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return path


async def bench(runs: int, seed: int, rounds: int) -> dict[str, Any]:
    path = await _database(runs, seed)
    db = await open_store(f"sqlite:///{path}")
    try:
        scrub = SecretRegistry()
        gate = Gate(Registry(knecht_tools(db, scrub)), _NoAudit(), scrub=scrub)
        results = []
        for name, arguments in CASES:
            if "before" in arguments:
                arguments = {**arguments, "before": runs // 2}
            timings = []
            for _ in range(rounds + 3):
                started = time.perf_counter()
                result = await gate.call_tool(ACTOR, "list_runs", arguments)
                timings.append((time.perf_counter() - started) * 1000)
                assert not result.is_error, result.text
            timings = timings[3:]  # warm-up
            assert result.data is not None
            median = statistics.median(timings)
            results.append({
                "case": name, "arguments": arguments, "median_ms": round(median, 3),
                "p95_ms": round(sorted(timings)[int(len(timings) * 0.95) - 1], 3),
                "returned": len(result.data["runs"]), "ratio_to_target": round(median / TARGET_MS, 3),
            })
        return {"runs": runs, "rounds": rounds, "target_ms": TARGET_MS, "cases": results,
                "worst_median_ms": max(r["median_ms"] for r in results)}
    finally:
        await db.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = anyio.run(bench, args.runs, args.seed, args.rounds)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"list_runs over {report['runs']:,} runs, {report['rounds']} calls per case, through the gate")
    print(f"{'case':<36} {'median ms':>10} {'p95 ms':>8} {'rows':>5} {'÷ 5 ms':>7}")
    for row in report["cases"]:
        print(f"{row['case']:<36} {row['median_ms']:>10.3f} {row['p95_ms']:>8.3f} {row['returned']:>5} "
              f"{row['ratio_to_target']:>7.2f}")
    worst = report["worst_median_ms"]
    print(f"worst median {worst:.3f} ms — {'within' if worst <= TARGET_MS else 'OVER'} the {TARGET_MS} ms target")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark: get_action_log on one very large action log (tail, paging, grep), through the gate.
Targets: ≤ 50 ms per call and ≤ 50 MB peak memory above the idle server.

    python scripts/bench_action_log.py                # a 200 MB log (built once, ~30 s; cached)
    python scripts/bench_action_log.py --log-mb 20    # quicker
    python scripts/bench_action_log.py --json

Peak memory is the process's peak resident set size (VmHWM, reset through /proc/self/clear_refs
before each case) minus its resident size when idle, with the database open and warm.
"""

from __future__ import annotations

import argparse
import contextlib
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
TARGET_MS = 50.0
TARGET_MB = 50.0
ACTOR = Actor("bench", "bench", frozenset({"logs:read", "runs:read"}))


class _NoAudit:
    def record(self, entry: object) -> None:
        pass

    def accepting(self) -> bool:
        return True


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _reset_peak() -> None:
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


async def _database(log_mb: int, seed: int) -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"action-log-{log_mb}mb-seed{seed}-v1.db"
    if path.exists():
        return path
    partial = path.with_suffix(".partial")
    for leftover in (partial, Path(f"{partial}-wal"), Path(f"{partial}-shm")):
        leftover.unlink(missing_ok=True)
    print(f"building a {log_mb} MB action log into {path} (once) …", file=sys.stderr, flush=True)
    started = time.perf_counter()
    db = await open_store(f"sqlite:///{partial}")
    try:
        await fill_demo_data(db, seed=seed, log_mb=log_mb)
        await db.fetch_all("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        await db.close()
    partial.rename(path)
    print(f"built in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return path


async def bench(log_mb: int, seed: int, rounds: int) -> dict[str, Any]:
    path = await _database(log_mb, seed)
    db = await open_store(f"sqlite:///{path}")
    try:
        big = await db.fetch_one(
            "SELECT run_id, action_id, MAX(line_no) AS n FROM log_lines WHERE action_id > 0"
            " GROUP BY run_id, action_id ORDER BY n DESC LIMIT 1"
        )
        assert big is not None
        run_id, action_id, total = big["run_id"], big["action_id"], big["n"]
        scrub = SecretRegistry()
        gate = Gate(Registry(knecht_tools(db, scrub)), _NoAudit(), scrub=scrub)
        base = {"run_id": run_id, "action": action_id}
        await gate.call_tool(ACTOR, "get_action_log", {**base, "tail": 10})  # warm
        idle_kb = _status_kb("VmRSS")
        cases: list[tuple[str, dict[str, Any]]] = [
            ("tail 200 (default size)", {"tail": 200}),
            ("tail 1000 (max; bounded to 24 KB)", {"tail": 1000}),
            ("page in the middle, limit 1000", {"offset": total // 2, "limit": 1000}),
            ("by name, tail 50", {"action": "test", "tail": 50}),
            ("grep 'assert' backwards (tail 5)", {"grep": "assert", "tail": 5}),
            ("grep 'WARNING' forwards from 0", {"grep": "WARNING"}),
            ("grep absent text (budget stops it)", {"grep": "no such text anywhere"}),
            ("grep pathological '(a+)+$'", {"grep": "(a+)+$"}),
        ]
        results = []
        for name, arguments in cases:
            timings = []
            _reset_peak()
            for _ in range(rounds):
                started = time.perf_counter()
                result = await gate.call_tool(ACTOR, "get_action_log", {**base, **arguments})
                timings.append((time.perf_counter() - started) * 1000)
                assert not result.is_error, result.text
            peak_mb = (_status_kb("VmHWM") - idle_kb) / 1024
            data = result.data or {}
            median = statistics.median(timings)
            results.append({
                "case": name, "arguments": arguments, "median_ms": round(median, 2),
                "max_ms": round(max(timings), 2), "peak_mb_above_idle": round(max(peak_mb, 0.0), 1),
                "lines_returned": len(data.get("lines", [])), "output_kb": round(len(result.text) / 1024, 1),
                "searched": data.get("searched"), "next_offset": data.get("next_offset"),
            })
        size = await db.fetch_one(
            "SELECT SUM(LENGTH(text) + 1) AS bytes FROM log_lines WHERE run_id = ? AND action_id = ?",
            (run_id, action_id),
        )
        return {
            "log_mb": round((size or {}).get("bytes", 0) / 1e6, 1), "lines": total, "run_id": run_id,
            "action_id": action_id, "rounds": rounds, "idle_rss_mb": round(idle_kb / 1024, 1),
            "target_ms": TARGET_MS, "target_mb": TARGET_MB, "cases": results,
        }
    finally:
        await db.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log-mb", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = anyio.run(bench, args.log_mb, args.seed, args.rounds)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"get_action_log on a {report['log_mb']} MB log ({report['lines']:,} lines), "
          f"{report['rounds']} calls per case, through the gate; idle RSS {report['idle_rss_mb']} MB")
    print(f"{'case':<38} {'median ms':>9} {'max ms':>7} {'÷50ms':>6} {'peak MB':>8} {'lines':>6} "
          f"{'KB out':>7}  searched")
    for row in report["cases"]:
        searched = row["searched"] or ""
        if searched:
            searched = f"lines {searched['from_line']:,}-{searched['to_line']:,}"
        print(f"{row['case']:<38} {row['median_ms']:>9.2f} {row['max_ms']:>7.2f} {row['median_ms'] / TARGET_MS:>6.2f} "
              f"{row['peak_mb_above_idle']:>8.1f} {row['lines_returned']:>6} {row['output_kb']:>7.1f}  {searched}")
    worst_ms = max(r["median_ms"] for r in report["cases"])
    worst_mb = max(r["peak_mb_above_idle"] for r in report["cases"])
    print(f"worst median {worst_ms:.2f} ms (target {TARGET_MS:.0f}), worst peak {worst_mb:.1f} MB above idle "
          f"(target {TARGET_MB:.0f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

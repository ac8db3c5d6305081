"""Benchmark: diagnoses per second the background worker sustains, with a scripted model, on 1,000
failed runs.

    python scripts/bench_ai_worker.py [--failures 1000] [--concurrency 1 2 4 8] [--repeats 3] [--db URL] [--json]

Demo data is generated until it holds `--failures` failed runs; exactly that many are made recent
(the worker diagnoses failures of the last week), the rest old. Each round empties the diagnoses,
starts the server's AI runtime with the worker at the given concurrency and `scripted_diagnoser()`
as the model (get_run, the failed action's log, an answer: 3 model requests and 2 gated tool calls
per run, all audited), and stops the clock when every recent failure has a stored diagnosis. Model
time is nil, so this is what the worker, the gate, the store and the audit log cost per diagnosis.
`--db postgresql://…` runs it on an empty PostgreSQL database instead of a temporary SQLite file.

Printed: the median wall time and diagnoses/s per concurrency over `--repeats` rounds, the
speed-up against concurrency 1, and the process's CPU time per diagnosis (all threads; on a shared
machine the steadier figure).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mcp_knecht.ai.models import ModelResolver  # noqa: E402
from mcp_knecht.ai.runtime import AiRuntime  # noqa: E402
from mcp_knecht.ai.settings import AiSettings, ModelSpec  # noqa: E402
from mcp_knecht.ai.testing import scripted_diagnoser  # noqa: E402
from mcp_knecht.app import App, open_app  # noqa: E402
from mcp_knecht.core.settings import load_settings  # noqa: E402
from mcp_knecht.knecht import open_store  # noqa: E402
from mcp_knecht.knecht.demo import fill_demo_data  # noqa: E402

SETTINGS = AiSettings(default=ModelSpec("anthropic", "scripted", "benchmark"))
OLD = "2025-01-01T00:00:00Z"


async def prepare(url: str, failures: int) -> None:
    db = await open_store(url)
    try:
        # The demo data fails about one run in six; ask for enough runs to have the failures.
        print(f"[bench] generating demo data for {failures} failures", file=sys.stderr)
        await fill_demo_data(db, runs=failures * 7, run_logs=False)
        rows = await db.fetch_all("SELECT id FROM runs WHERE status = 'failed' ORDER BY id DESC")
        if len(rows) < failures:
            raise SystemExit(f"only {len(rows)} failed runs were generated")
        recent = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        async with db.transaction() as tx:
            await tx.execute("UPDATE runs SET finished_at = ? WHERE status = 'failed'", (OLD,))
            await tx.execute_many("UPDATE runs SET finished_at = ? WHERE id = ?",
                                  [(recent, row["id"]) for row in rows[:failures]])
    finally:
        await db.close()


async def round_(app: App, failures: int, concurrency: int) -> tuple[float, float]:
    async with app.db.transaction() as tx:
        await tx.execute("DELETE FROM run_diagnoses")
        await tx.execute("DELETE FROM ai_feature_runs")
    runtime = AiRuntime(SETTINGS, gate=app.gate, db=app.db, scrub=app.secrets,
                        models=ModelResolver(SETTINGS, fixed=scripted_diagnoser()),
                        worker_options={"concurrency": concurrency, "interval": 0.05})
    started, started_cpu = time.perf_counter(), time.process_time()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(runtime.run)
        while True:
            await anyio.sleep(0.05)
            row = await app.db.fetch_one("SELECT COUNT(*) AS n FROM run_diagnoses WHERE status = 'done'")
            if row is not None and row["n"] >= failures:
                break
        elapsed, cpu = time.perf_counter() - started, time.process_time() - started_cpu
        tasks.cancel_scope.cancel()
    failed = await app.db.fetch_one("SELECT COUNT(*) AS n FROM run_diagnoses WHERE status <> 'done'")
    assert failed is not None and failed["n"] == 0, "every diagnosis must succeed"
    return elapsed, cpu


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--failures", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--db", help="an empty PostgreSQL database (default: a temporary SQLite file)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        url = args.db or f"sqlite:///{folder}/bench.db"
        await prepare(url, args.failures)
        env = {"KNECHT_DATABASE_URL": url, "KNECHT_DATA_DIR": folder, "KNECHT_CONFIG_DIR": str(REPO),
               "KNECHT_JWT_SECRET": "bench-" + "x" * 40}
        rows: list[dict[str, Any]] = []
        async with open_app(load_settings(env=env), watch_policy=True) as app:
            for concurrency in args.concurrency:
                times, cpus = [], []
                for _ in range(args.repeats):
                    print(f"[bench] concurrency {concurrency}", file=sys.stderr)
                    elapsed, cpu = await round_(app, args.failures, concurrency)
                    times.append(elapsed)
                    cpus.append(cpu)
                median = statistics.median(times)
                rows.append({"concurrency": concurrency, "seconds": round(median, 3),
                             "diagnoses_per_second": round(args.failures / median, 1),
                             "ms_per_diagnosis": round(median / args.failures * 1000, 3),
                             "cpu_ms_per_diagnosis": round(statistics.median(cpus) / args.failures * 1000, 3)})
    for row in rows:
        row["speedup"] = round(rows[0]["seconds"] / row["seconds"], 2)
    if args.json:
        print(json.dumps({"store": url.split(":")[0], "failures": args.failures, "rounds": rows}, indent=2))
        return
    print(f"{args.failures} failed runs, {'PostgreSQL' if args.db else 'SQLite'}, scripted model"
          f" (median of {args.repeats})")
    print(f"{'concurrency':>11} {'seconds':>8} {'diagnoses/s':>12} {'ms/diagnosis':>13} {'speed-up':>9}"
          f" {'CPU ms/diagnosis':>17}")
    for row in rows:
        print(f"{row['concurrency']:>11} {row['seconds']:>8} {row['diagnoses_per_second']:>12} "
              f"{row['ms_per_diagnosis']:>13} {row['speedup']:>9} {row['cpu_ms_per_diagnosis']:>17}")


if __name__ == "__main__":
    anyio.run(main)

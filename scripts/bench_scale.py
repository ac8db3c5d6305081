"""Benchmark: proposals and the audit log at scale. Targets: `list_proposals`, `knecht-approve list`
and the proposals resource list ≤ 5 ms median over 1,000,000 proposals (and what a decision reads);
`audit list` filters ≤ 5 ms and `audit verify` streaming in bounded memory over 10,000,000 audit rows (rows/s reported).

    python scripts/bench_scale.py                                # 1M proposals, 10M audit rows (cached)
    python scripts/bench_scale.py --proposals 100000 --audit-rows 1000000   # quicker
    python scripts/bench_scale.py --json

The database is built once per size into /tmp/mcp-knecht-bench/ (a keyed audit chain, computed with
the benchmark's own server key, so that `verify` has real work to do) and reused. Each query runs
through the same repository and listing code the tools and CLIs use; medians and p90 of `--rounds`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from mcp_knecht.core import clock
from mcp_knecht.core.audit import AuditEntry
from mcp_knecht.core.keys import ServerKeys
from mcp_knecht.store import open_database, quorum
from mcp_knecht.store.audit_log import AuditChain, recent_entries
from mcp_knecht.store.proposals import SqlProposalRepository

CACHE = Path(os.environ.get("KNECHT_BENCH_CACHE", "/tmp/mcp-knecht-bench"))
KEYS = ServerKeys(b"bench-scale-server-key-bench-scale-server-key")
TARGET_MS = 5.0
SUBJECTS = [f"agent-{n}" for n in range(47)]  # a prime: every agent gets every status
STATUSES = ["succeeded"] * 6 + ["failed", "rejected", "expired", "pending"]
OUTCOMES = ["ran"] * 8 + ["staged", "invalid", "forbidden", "denied", "approved", "executed"]
BATCH = 20_000


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


async def _fill_proposals(db: Any, count: int) -> None:
    far = "2999-01-01T00:00:00.000000Z"
    sql = ("INSERT INTO proposals (id, tool, action, arguments_json, arguments_hash, arguments_shown, proposer_subject,"
           " proposer_client, proposer_scopes, rule, status, created_at, expires_at, seal)"
           " VALUES (?, 'rerun_run', NULL, ?, ?, ?, ?, 'bench', 'runs:write', 'built-in', ?, ?, ?, ?)")
    for start in range(1, count + 1, BATCH):
        rows = []
        for n in range(start, min(start + BATCH, count + 1)):
            arguments = f'{{"run_id":{n}}}'
            rows.append((n, arguments, f"{n:064x}", arguments, SUBJECTS[n % len(SUBJECTS)],
                         STATUSES[n % len(STATUSES)], clock.timestamp(), far, ""))
        async with db.transaction() as tx:
            await tx.execute_many(sql, rows)
        progress(f"proposals {min(start + BATCH - 1, count):,}/{count:,}")


async def _fill_audit(db: Any, count: int) -> None:
    chain = AuditChain(KEYS)
    for start in range(0, count, BATCH):
        entries = [AuditEntry(source="mcp", subject=SUBJECTS[n % len(SUBJECTS)], client="bench",
                              tool=("list_runs", "get_run", "rerun_run")[n % 3], outcome=OUTCOMES[n % len(OUTCOMES)],  # type: ignore[arg-type]
                              proposal_id=n // 10 if n % 10 == 0 else None, arguments_hash=f"{n:064x}",
                              duration_ms=1.5)
                   for n in range(start, min(start + BATCH, count))]
        async with db.transaction() as tx:
            await chain.append(tx, entries)
        if (start // BATCH) % 25 == 0:
            progress(f"audit rows {start + len(entries):,}/{count:,}")


async def _database(proposals: int, audit_rows: int) -> str:
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"scale-{proposals}-{audit_rows}-v2.db"
    url = f"sqlite:///{path}"
    if path.exists():
        return url
    partial = path.with_suffix(".partial")
    for leftover in (partial, Path(f"{partial}-wal"), Path(f"{partial}-shm")):
        leftover.unlink(missing_ok=True)
    progress(f"building {proposals:,} proposals and {audit_rows:,} audit rows into {path} (once) …")
    db = await open_database(f"sqlite:///{partial}")
    try:
        await _fill_proposals(db, proposals)
        await _fill_audit(db, audit_rows)
        async with db.transaction() as tx:
            await tx.execute("ANALYZE")
    finally:
        await db.close()
    partial.rename(path)
    return url


def _never_audited(proposal: Any) -> AuditEntry:
    raise AssertionError(f"proposal #{proposal.id} expired in the benchmark's store: its expiry is far off")


async def _timed(rounds: int, query: Any) -> dict[str, float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter_ns()
        await query()
        samples.append((time.perf_counter_ns() - started) / 1e6)
    samples.sort()
    return {"median_ms": round(statistics.median(samples), 3), "p90_ms": round(samples[int(len(samples) * 0.9)], 3)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    url = await _database(args.proposals, args.audit_rows)
    db = await open_database(url)
    report: dict[str, Any] = {"proposals": args.proposals, "audit_rows": args.audit_rows, "cases": {}}
    try:
        repo = SqlProposalRepository(db, AuditChain(KEYS))
        cases = {
            "list_proposals (own, newest 20)": lambda: repo.list(subject="agent-7", limit=20),
            "list_proposals (own, status failed)": lambda: repo.list(subject="agent-7", status="failed", limit=20),
            "list_proposals (own, status pending)": lambda: repo.list(subject="agent-7", status="pending", limit=20),
            "list_proposals (own, status expired)": lambda: repo.list(subject="agent-7", status="expired", limit=20),
            "knecht-approve list (pending, 100)": lambda: repo.list(status="pending", limit=100),
            "knecht-approve list (expired, 100)": lambda: repo.list(status="expired", limit=100),
            "resources/list (own, 50)": lambda: repo.list(subject="agent-3", limit=50),
            "API page (before = middle)": lambda: repo.list(limit=50, before_id=args.proposals // 2),
            "audit list (newest 50)": lambda: recent_entries(db, limit=50),
            "audit list --tool rerun_run": lambda: recent_entries(db, tool="rerun_run", limit=50),
            "audit list --subject agent-9": lambda: recent_entries(db, subject="agent-9", limit=50),
            "audit list --outcome denied": lambda: recent_entries(db, outcome="denied", limit=50),
            "audit list --proposal 4242": lambda: recent_entries(db, proposal_id=4242, limit=50),
            "audit list --source approval (none)": lambda: recent_entries(db, source="approval", limit=50),
            # What a decision reads: the proposal with its approvals, and the claim's read (with whether the
            # audit log holds an `approved` row for it) — neither may grow with the store.
            "decision: the proposal (get 4242)": lambda: repo.get(4242),
            "decision: the claim's read (4242)": lambda: db.lookup(quorum.CLAIM_READ, (4242,)),
            # What every server runs every 30 s, holding the writers' lock: the expiry sweep (none is due).
            "expiry sweep (a write, none due)": lambda: repo.expire_overdue(clock.timestamp(), _never_audited),
        }
        for name, query in cases.items():
            report["cases"][name] = await _timed(args.rounds, query)
        if not args.skip_verify:
            rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            started, problems, rows = time.perf_counter(), 0, 0
            async for found in AuditChain(KEYS).verify(db):
                if isinstance(found, int):
                    rows = found
                    progress(f"verified {rows:,} rows")
                else:
                    problems += 1
            seconds = time.perf_counter() - started
            rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            report["verify"] = {"rows": args.audit_rows, "seconds": round(seconds, 1),
                                "rows_per_second": round(args.audit_rows / seconds), "problems": problems,
                                "peak_rss_growth_mb": round((rss_after - rss_before) / 1024, 1)}
    finally:
        await db.close()
    return report


def print_report(report: dict[str, Any]) -> None:
    print(f"\nproposals and audit at scale: {report['proposals']:,} proposals, {report['audit_rows']:,} audit rows\n")
    print(f"{'case':40} {'median ms':>10} {'p90 ms':>8}  target")
    worst = 0.0
    for name, figures in report["cases"].items():
        worst = max(worst, figures["median_ms"])
        mark = "ok" if figures["median_ms"] <= TARGET_MS else "MISSED"
        print(f"{name:40} {figures['median_ms']:10.3f} {figures['p90_ms']:8.3f}  ≤{TARGET_MS} {mark}")
    print(f"\nworst median {worst:.3f} ms (target {TARGET_MS} ms)")
    if verify := report.get("verify"):
        print(f"audit verify: {verify['rows']:,} rows in {verify['seconds']} s = {verify['rows_per_second']:,} rows/s, "
              f"{verify['problems']} problems, peak memory +{verify['peak_rss_growth_mb']} MB")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--proposals", type=int, default=1_000_000)
    parser.add_argument("--audit-rows", type=int, default=10_000_000)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--skip-verify", action="store_true", help="only the listing cases")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = anyio.run(run, args)
    print(json.dumps(report, indent=2) if args.json else "", end="")
    if not args.json:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

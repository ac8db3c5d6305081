"""Benchmark: what scrubbing costs per tool result, against serialising the same result.

    python scripts/bench_scrub.py [--rounds 2000] [--json]

Every tool result passes the scrubber once as JSON text, so its cost is best read next to the
json.dumps that produced that text (the baseline, measured in the same run). Cases: a clean
kilobyte of runs, a project with its workflows and runs (hints such as "token" and "://" occur,
so the pattern passes run), and a log page full of secrets; each with 20 literal secret values.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from mcp_knecht.core.scrub import Scrubber

LITERALS = [f"literal-{i:02d}-Zq9xW7vB" for i in range(20)]

CASES: dict[str, Any] = {
    "clean runs (1 KB)": {"runs": [{"id": i, "status": "failed", "branch": "main", "commit_sha": f"{i:040x}",
                                    "project": "payments-api"} for i in range(7)]},
    "project page (3 KB, hints present)": {
        "project": {"slug": "payments-api", "repository_url": "https://git.acme.internal/acme/payments-api.git"},
        "workflows": [{"id": i, "name": "ci", "path": ".knecht/ci.yml", "inputs": {"deploy_token": "string"}}
                      for i in range(12)],
        "runs": [{"id": i, "branch": "feature/high-contrast", "commit_sha": "ab" * 20} for i in range(10)],
    },
    "log page with secrets (2 KB)": {"lines": [
        "export AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE", "git push https://ci:ghp_abcdefghijklmnopqrstuvwxyz0123456789@git",
        "DATABASE_URL=postgres://app:Sup3rS3cret@db:5432/app", "password=hunter22 token: abcdef123",
        *[f"step {i}: ok literal-0{i % 10}-Zq9xW7vB" for i in range(30)],
    ]},
}


def _median_us(work: Callable[[], object], rounds: int) -> float:
    samples = []
    for _ in range(9):
        started = time.perf_counter()
        for _ in range(rounds):
            work()
        samples.append((time.perf_counter() - started) / rounds * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    scrub = Scrubber(LITERALS)
    rows = []
    for name, data in CASES.items():
        print(f"[bench] {name}", file=sys.stderr)
        text = json.dumps(data)
        rows.append({
            "case": name, "bytes": len(text),
            "scrub_us": round(_median_us(lambda text=text: scrub(text), args.rounds), 2),
            "dumps_us": round(_median_us(lambda data=data: json.dumps(data), args.rounds), 2),
            "changed": scrub(text) != text,
        })
    for row in rows:
        row["ratio_to_dumps"] = round(row["scrub_us"] / row["dumps_us"], 2)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'case':<36} {'bytes':>6} {'scrub µs':>9} {'dumps µs':>9} {'ratio':>6}  masked")
    for row in rows:
        print(f"{row['case']:<36} {row['bytes']:>6} {row['scrub_us']:>9} {row['dumps_us']:>9} "
              f"{row['ratio_to_dumps']:>6}  {'yes' if row['changed'] else 'no'}")


if __name__ == "__main__":
    main()

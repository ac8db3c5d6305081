"""What does a server cost, idle, while many proposals wait? The proposal watcher's looks, measured.

    python scripts/bench_watcher.py [--waiting 200000] [--seconds 10] [--json]

A server watches every open proposal so that a proposer's subscription hears of its decision,
however it was made (an operator's CLI, another replica). This stages 100 proposals through the
gate, then copies their rows in SQL until `--waiting` wait (staging 200,000 through the gate would
take minutes; a copy's seal is its original's, so nobody could approve it, and the watcher reads
only status and expiry). SQLite's planner statistics are left as the staging app's close wrote
them, at 100 proposals: the state of a store that grew since its server started.

Then, one after the other, on the same file:
  in process   the watcher's first look (it learns what is open), one look at every open proposal,
               and one look at what the store named (nothing: an idle moment);
  server       `mcp-knecht serve --transport http`, its CPU share over `--seconds` while idle, and
               its resident memory.
Baseline in the same run: the same server over a copy of the file with the 100 proposals alone.

Exit status 0 (this is a measurement); 1 when the server did not start.
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_approvals import _env, _stage  # noqa: E402
from bench_decisions_http import progress, start_server, stop_server  # noqa: E402
from bench_http import cpu_seconds, rss_mb  # noqa: E402

STAGED = 100


def copy_waiting(path: Path, waiting: int) -> int:
    """Copy the staged rows until `waiting` proposals wait; returns how many do."""
    db = sqlite3.connect(path)
    try:
        columns = ", ".join(row[1] for row in db.execute("PRAGMA table_info(proposals)") if row[1] != "id")
        while (count := db.execute("SELECT COUNT(*) FROM proposals").fetchone()[0]) < waiting:
            db.execute(f"INSERT INTO proposals ({columns}) SELECT {columns} FROM proposals LIMIT ?",
                       (min(50_000, waiting - count),))
            db.commit()
        return int(db.execute("SELECT COUNT(*) FROM proposals WHERE status = 'pending'").fetchone()[0])
    finally:
        db.close()


async def looks(env: dict[str, str]) -> dict[str, float]:
    """Seconds of the watcher's first look, a look at everything, and a look at what was named (nothing)."""
    from mcp_knecht.app import open_app
    from mcp_knecht.core.proposal_watch import ProposalWatcher
    from mcp_knecht.core.settings import load_settings

    async with open_app(load_settings(env=env), watch_policy=False) as app:
        watcher = ProposalWatcher(app.proposals, app.changes)
        timed: dict[str, float] = {}
        for name, look in (("first_look", lambda: watcher.poll()), ("look_at_all", lambda: watcher.poll()),
                           ("look_at_named", lambda: watcher.poll(frozenset()))):
            started = time.perf_counter()
            await look()
            timed[f"{name}_seconds"] = round(time.perf_counter() - started, 4)
        return timed


def _on_copy(env: dict[str, str], folder: Path) -> dict[str, str]:
    return {**env, "KNECHT_DATABASE_URL": f"sqlite:///{folder}/bench.db", "KNECHT_DATA_DIR": str(folder)}


def idle_server(env: dict[str, str], folder: Path, seconds: float) -> dict[str, float]:
    server, _ = start_server(env, folder / "server.log")
    try:
        time.sleep(3.0)  # its first look done
        before = cpu_seconds(server.pid)
        time.sleep(seconds)
        share = (cpu_seconds(server.pid) - before) / seconds
        return {"idle_cpu_share": round(share, 4), "rss_mb": round(rss_mb(server.pid), 1)}
    finally:
        stop_server(server)


def run(waiting: int, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "few").mkdir()
        env = {**_env(f"sqlite:///{folder}/bench.db", tmp), "KNECHT_JWT_SECRET": secrets.token_urlsafe(48)}
        progress(f"staging {STAGED} proposals…")
        anyio.run(_stage, env, STAGED, f"watch{int(time.time())}")
        shutil.copy(folder / "bench.db", folder / "few" / "bench.db")
        progress(f"copying rows until {waiting} wait…")
        pending = copy_waiting(folder / "bench.db", waiting)
        # Each phase on its own copy: closing a store refreshes SQLite's statistics, which the next would see.
        (folder / "looks").mkdir()
        shutil.copy(folder / "bench.db", folder / "looks" / "bench.db")
        progress("the watcher's looks, in process…")
        timed = anyio.run(looks, _on_copy(env, folder / "looks"))
        progress(f"a server idle for {seconds:g} s with {pending} waiting…")
        many = idle_server(env, folder, seconds)
        progress(f"baseline: idle for {seconds:g} s with {STAGED} waiting…")
        few = idle_server(_on_copy(env, folder / "few"), folder / "few", seconds)
    return {
        "waiting": pending, "baseline_waiting": STAGED, **timed,
        "idle_cpu_share": many["idle_cpu_share"], "baseline_idle_cpu_share": few["idle_cpu_share"],
        "ratio_idle_cpu_to_baseline": round(many["idle_cpu_share"] / max(few["idle_cpu_share"], 1e-4), 2),
        "rss_mb": many["rss_mb"], "baseline_rss_mb": few["rss_mb"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--waiting", type=int, default=200_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.waiting, args.seconds)
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['waiting']} waiting: first look {result['first_look_seconds']} s, a look at all "
          f"{result['look_at_all_seconds']} s, at the named {result['look_at_named_seconds']} s")
    print(f"idle server: {result['idle_cpu_share']:.1%} of a core (with {STAGED} waiting "
          f"{result['baseline_idle_cpu_share']:.1%}; ratio {result['ratio_idle_cpu_to_baseline']}), "
          f"RSS {result['rss_mb']} MB (with {STAGED}: {result['baseline_rss_mb']} MB)")


if __name__ == "__main__":
    main()

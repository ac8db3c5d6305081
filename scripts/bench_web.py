"""Benchmark: the web page on a large store. Targets: the dashboard's time to first byte ≤ 50 ms
(server time) with 5 projects and 1,000,000 runs; the proposals page, paged, with 10,000 pending
proposals.

    python scripts/bench_web.py                          # 1,000,000 runs (built once, cached), 10,000 proposals
    python scripts/bench_web.py --runs 100000 --proposals 2000    # quicker
    python scripts/bench_web.py --db /path/filled.db     # a database `mcp-knecht demo-data --runs N --no-run-logs` made
    python scripts/bench_web.py --json

Each page is measured twice: in-process through the ASGI app (the server's own time, nothing else)
and as time to first byte over HTTP from a real `mcp-knecht serve --transport http` on loopback.
The database is copied first, so the proposals staged here never reach the cached one.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
from starlette.applications import Starlette

from mcp_knecht.app import App, open_app
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.auth import TokenSettings, TokenVerifier
from mcp_knecht.core.settings import load_settings
from mcp_knecht.knecht import open_store
from mcp_knecht.knecht.demo import fill_demo_data
from mcp_knecht.web import web_routes
from mcp_knecht.web.store import LoginLinks, WebSchema

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("KNECHT_BENCH_CACHE", "/tmp/mcp-knecht-bench"))
DASHBOARD_TARGET_MS = 50.0
OPERATOR = ("proposals:decide", "proposals:read", "projects:read", "workflows:read", "runs:read", "logs:read")
AGENT = Actor("bench-agent", "bench", frozenset({"runs:read", "runs:write", "proposals:read"}))


async def _database(runs: int, seed: int) -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"web-{runs}-seed{seed}.db"
    if path.exists():
        return path
    partial = path.with_suffix(".partial")
    for leftover in (partial, Path(f"{partial}-wal"), Path(f"{partial}-shm")):
        leftover.unlink(missing_ok=True)
    print(f"building {runs:,} runs into {path} (once) …", file=sys.stderr, flush=True)
    db = await open_store(f"sqlite:///{partial}")
    try:
        await fill_demo_data(db, seed=seed, runs=runs, run_logs=False)
    finally:
        await db.close()
    partial.rename(path)
    return path


def _copy(source: Path, folder: Path) -> Path:
    target = folder / "bench.db"
    shutil.copyfile(source, target)
    for suffix in ("-wal", "-shm"):
        if Path(f"{source}{suffix}").exists():
            shutil.copyfile(f"{source}{suffix}", f"{target}{suffix}")
    return target


def _stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"median_ms": round(statistics.median(ordered), 2),
            "p95_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))], 2),
            "max_ms": round(ordered[-1], 2), "n": len(ordered)}


async def _stage(app: App, count: int) -> tuple[float, list[int]]:
    """`count` pending rerun_run proposals, each through the gate (frozen, sealed, audited)."""
    rows = await app.db.fetch_all("SELECT id FROM runs WHERE status IN ('succeeded', 'failed') ORDER BY id LIMIT ?",
                                  (count,))
    started, ids = time.perf_counter(), []
    for row in rows:
        staged = await app.gate.call_tool(AGENT, "rerun_run", {"run_id": row["id"]})
        assert staged.outcome == "staged", staged.text
        assert staged.data is not None
        ids.append(int(staged.data["id"]))
    return time.perf_counter() - started, ids


async def _in_process(env: dict[str, str], rounds: int, proposals: int) -> tuple[dict[str, Any], str, list[int]]:
    async with open_app(load_settings(env=env), watch_policy=False) as app:
        projects = await app.db.fetch_one("SELECT COUNT(*) AS n FROM projects")
        runs = await app.db.fetch_one("SELECT COUNT(*) AS n FROM runs")
        pending = await app.db.fetch_one("SELECT COUNT(*) AS n FROM proposals WHERE status = 'pending'")
        staging_seconds, ids = 0.0, list[int]()
        if pending is not None and pending["n"] < proposals:
            staging_seconds, ids = await _stage(app, proposals - int(pending["n"]))
        await app.audit.flush()
        ids = ids or [p.id for p in await app.proposals.list(status="pending", limit=proposals)]
        verifier = TokenVerifier(TokenSettings(secret=env["KNECHT_JWT_SECRET"]))
        asgi = Starlette(routes=web_routes(app, verifier, public_url="http://bench"))
        links = LoginLinks(WebSchema(app.db), app.keys)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://bench") as client:
            secret = await links.create("bench-operator", list(OPERATOR))
            form = (await client.get("/login", params={"link": secret})).text
            nonce = form.split('name="login_csrf" value="')[1].split('"')[0]
            signed_in = await client.post("/login", data={"login_csrf": nonce, "link": secret},
                                          headers={"Origin": "http://bench"})
            assert signed_in.status_code == 303, signed_in.text
            middle = sorted(ids)[len(ids) // 2]
            pages = {"dashboard /": "/", "proposals (newest page)": "/proposals",
                     "proposals (a deep page)": f"/proposals?before={middle}",
                     "proposals ?status=all": "/proposals?status=all",
                     "one proposal": f"/proposals/{middle}"}
            measured: dict[str, Any] = {}
            for name, path in pages.items():
                for _ in range(5):
                    warm = await client.get(path)
                    assert warm.status_code == 200, (path, warm.status_code, warm.text[:300])
                samples = []
                for _ in range(rounds):
                    started = time.perf_counter()
                    response = await client.get(path)
                    samples.append((time.perf_counter() - started) * 1000)
                    assert response.status_code == 200
                measured[name] = {"path": path, **_stats(samples), "bytes": len(response.content)}
        http_link = await links.create("bench-operator", list(OPERATOR))
        await app.audit.flush()
    facts = {"projects": projects["n"] if projects else 0, "runs": runs["n"] if runs else 0,
             "pending_proposals": len(ids), "staging_seconds": round(staging_seconds, 1)}
    return {"facts": facts, "in_process": measured, "pages": pages}, http_link, ids


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def _server(env: dict[str, str]) -> Iterator[str]:
    port = _free_port()
    executable = Path(sys.executable).parent / "mcp-knecht"
    process = subprocess.Popen([str(executable), "serve", "--transport", "http", "--port", str(port)],
                               env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                with urllib.request.urlopen(base + "/healthz", timeout=1):
                    break
            except OSError:
                time.sleep(0.1)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=15)


def _ttfb(port: int, path: str, cookie: str) -> float:
    """Milliseconds from sending the request to the status line (the first byte) over loopback."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.connect()
    started = time.perf_counter()
    connection.request("GET", path, headers={"Cookie": cookie})
    response = connection.getresponse()
    first_byte = (time.perf_counter() - started) * 1000
    response.read()
    connection.close()
    return first_byte


def _over_http(env: dict[str, str], link: str, pages: dict[str, str], rounds: int) -> dict[str, Any]:
    with _server(env) as base, httpx.Client(base_url=base) as client:
        form = client.get("/login", params={"link": link}).text
        nonce = form.split('name="login_csrf" value="')[1].split('"')[0]
        signed_in = client.post("/login", data={"login_csrf": nonce, "link": link}, headers={"Origin": base},
                                follow_redirects=False)
        assert signed_in.status_code == 303, signed_in.text
        cookie = f"knecht-session={client.cookies['knecht-session']}"
        port = int(base.rsplit(":", 1)[1])
        measured = {}
        for name, path in pages.items():
            for _ in range(5):
                _ttfb(port, path, cookie)
            measured[name] = _stats([_ttfb(port, path, cookie) for _ in range(rounds)])
        return measured


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--db", type=Path, help="a SQLite file filled by `mcp-knecht demo-data` (copied, not changed)")
    parser.add_argument("--proposals", type=int, default=10_000, help="pending proposals to stage (default 10,000)")
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    source = args.db or anyio.run(_database, args.runs, args.seed)
    with tempfile.TemporaryDirectory(prefix="bench-web-") as folder:
        database = _copy(Path(source), Path(folder))
        env = {"KNECHT_DATA_DIR": str(Path(folder) / "data"), "KNECHT_DATABASE_URL": f"sqlite:///{database}",
               "KNECHT_CONFIG_DIR": str(REPO), "KNECHT_JWT_SECRET": secrets.token_urlsafe(48)}
        report, link, _ = anyio.run(_in_process, env, args.rounds, args.proposals)
        report["over_http_ttfb"] = _over_http(env, link, report.pop("pages"), args.rounds)
    dashboard = report["in_process"]["dashboard /"]["median_ms"]
    report["dashboard_target_ms"] = DASHBOARD_TARGET_MS
    report["dashboard_within_target"] = dashboard <= DASHBOARD_TARGET_MS
    if args.json:
        print(json.dumps(report, indent=2))
        return 0 if report["dashboard_within_target"] else 1
    facts = report["facts"]
    print(f"{facts['projects']} projects, {facts['runs']:,} runs, {facts['pending_proposals']:,} pending proposals"
          + (f" (staged through the gate in {facts['staging_seconds']} s)" if facts["staging_seconds"] else ""))
    print(f"{'page':<26} {'server median':>14} {'p95':>8} {'TTFB median':>12} {'p95':>8} {'bytes':>8}")
    for name, inside in report["in_process"].items():
        outside = report["over_http_ttfb"][name]
        print(f"{name:<26} {inside['median_ms']:>11.2f} ms {inside['p95_ms']:>5.2f} ms {outside['median_ms']:>9.2f} ms"
              f" {outside['p95_ms']:>5.2f} ms {inside['bytes']:>8,}")
    verdict = "within" if report["dashboard_within_target"] else "OVER"
    print(f"dashboard: median {dashboard} ms server time, {verdict} the {DASHBOARD_TARGET_MS:.0f} ms target")
    return 0 if report["dashboard_within_target"] else 1


if __name__ == "__main__":
    sys.exit(main())

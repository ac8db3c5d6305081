"""SQLite vs PostgreSQL: gated calls per second over HTTP, and decisions per second with racing
approvers (double executions counted; must be 0).

1. Gated calls over Streamable HTTP: `mcp-knecht serve --transport http --stateless` (1 or 2
   replicas on the one store), client processes each holding several SDK clients that call
   - `get_project` (read, auto: runs and writes one audit entry, group-committed), and
   - `record_effect` (write, approve: freezes a proposal, one durable transaction per call).
   Rate = all calls / (last client done - first client started).
2. Decisions: `scripts/bench_approvals.py` (N proposals, K approver processes racing over all of
   them) on each store.

    python scripts/bench_stores.py                         # both stores, ~2 minutes
    python scripts/bench_stores.py --stores postgresql --clients 32 --calls 50 --json
    KNECHT_BENCH_POSTGRES_URL=postgresql://user@host/db python scripts/bench_stores.py

PostgreSQL: a database `knecht_bench_<random>` is created through the admin URL (default the local
trust-auth server, database `test`) and dropped afterwards. Clients, servers and the database
share this machine's cores: compare the stores with each other, not with a real deployment.
Exit status 1 when something did not work (an error result, a double execution).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

ADMIN_URL = os.environ.get("KNECHT_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
TOOLSETS = "mcp_knecht.knecht:toolset,tests.toolsets:toolset"
AGENT = ("projects:read", "runs:read", "runs:write", "proposals:read")
WORKLOADS = {"read": "get_project", "stage": "record_effect"}


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# --- Stores -------------------------------------------------------------------------------------


async def _admin(sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(ADMIN_URL, timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@contextmanager
def store(kind: str, folder: Path) -> Iterator[str]:
    """An empty store of `kind`, filled with demo data and the test effects table."""
    if kind == "sqlite":
        url = f"sqlite:///{folder / 'bench.db'}"
        anyio.run(_fill, url)
        yield url
        return
    name = f"knecht_bench_{secrets.token_hex(4)}"
    anyio.run(_admin, f'CREATE DATABASE "{name}"')
    try:
        url = ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
        anyio.run(_fill, url)
        yield url
    finally:
        anyio.run(_admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def _fill(url: str) -> None:
    from mcp_knecht.knecht import open_store
    from mcp_knecht.knecht.demo import fill_demo_data
    from tests.toolsets import EFFECTS_TABLE

    db = await open_store(url)
    try:
        await fill_demo_data(db)
        async with db.transaction() as tx:
            await tx.execute(EFFECTS_TABLE)
    finally:
        await db.close()


def _env(url: str, folder: Path, secret: str) -> dict[str, str]:
    return {**os.environ, "KNECHT_DATABASE_URL": url, "KNECHT_DATA_DIR": str(folder / "data"),
            "KNECHT_CONFIG_DIR": str(REPO), "KNECHT_TOOLSETS": TOOLSETS, "KNECHT_JWT_SECRET": secret,
            "PYTHONPATH": str(REPO)}


# --- Load clients (run as subprocesses of this script) -------------------------------------------


async def _client_process(urls: list[str], token: str, tool: str, clients: int, calls: int, tag: str) -> dict[str, Any]:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    errors = 0

    async def one(n: int) -> None:
        nonlocal errors
        url = urls[n % len(urls)]
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120) as http, \
                Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client:
            await client.list_tools()
            await barrier.wait()
            for i in range(calls):
                if (await client.call_tool(tool, _arguments(tool, f"{tag}-{n}-{i}"))).is_error:
                    errors += 1

    barrier = _Barrier(clients)
    started: list[float] = []

    async def timed() -> None:
        await barrier.all_ready.wait()
        started.append(time.time())

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(timed)
        for n in range(clients):
            tasks.start_soon(one, n)
    return {"started": started[0], "finished": time.time(), "calls": clients * calls, "errors": errors}


def _arguments(tool: str, label: str) -> dict[str, Any]:
    return {"label": label} if tool == "record_effect" else {"project": 1}


class _Barrier:
    """Every client connected before any call is timed."""

    def __init__(self, parties: int) -> None:
        self._left = parties
        self.all_ready = anyio.Event()

    async def wait(self) -> None:
        self._left -= 1
        if self._left == 0:
            self.all_ready.set()
        await self.all_ready.wait()


def http_rate(env: dict[str, str], replicas: int, workload: str, clients: int, calls: int,
              client_procs: int) -> dict[str, Any]:
    from mcp_knecht.core.auth import TokenSettings, mint_token
    from tests.servers import http_server

    tool = WORKLOADS[workload]
    token = mint_token(TokenSettings(secret=env["KNECHT_JWT_SECRET"]), subject="bench-agent", scopes=AGENT,
                       ttl=timedelta(hours=1))
    with ExitStack() as stack:
        urls = [stack.enter_context(http_server(env, "--stateless")) for _ in range(replicas)]
        per_proc = max(1, clients // client_procs)
        tag = secrets.token_hex(3)
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--client", json.dumps({
                    "urls": urls, "token": token, "tool": tool, "clients": per_proc, "calls": calls,
                    "tag": f"{tag}{p}"})],
                env=env, stdout=subprocess.PIPE, text=True)
            for p in range(client_procs)
        ]
        reports = []
        for proc in procs:
            out, _ = proc.communicate(timeout=900)
            if proc.returncode != 0:
                raise SystemExit("a load client failed")
            reports.append(json.loads(out))
    total = sum(r["calls"] for r in reports)
    seconds = max(r["finished"] for r in reports) - min(r["started"] for r in reports)
    return {"workload": workload, "tool": tool, "replicas": replicas, "clients": per_proc * client_procs,
            "calls": total, "errors": sum(r["errors"] for r in reports), "seconds": round(seconds, 2),
            "calls_per_s": round(total / seconds, 1)}


# --- Decisions ----------------------------------------------------------------------------------


def decisions(url: str, proposals: int, approvers: int) -> dict[str, Any]:
    spec = importlib.util.spec_from_file_location("bench_approvals", REPO / "scripts" / "bench_approvals.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.run(proposals, approvers, url)  # type: ignore[no-any-return]


# --- Main ---------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stores", nargs="+", default=["sqlite", "postgresql"], choices=["sqlite", "postgresql"])
    parser.add_argument("--clients", type=int, default=16, help="concurrent MCP clients (default 16)")
    parser.add_argument("--client-procs", type=int, default=2, help="processes the clients run in (default 2)")
    parser.add_argument("--calls", type=int, default=40, help="calls per client per workload (default 40)")
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2], help="server replicas (default 1 2)")
    parser.add_argument("--proposals", type=int, default=200, help="proposals for the approver race")
    parser.add_argument("--approvers", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        spec = json.loads(args.client)
        print(json.dumps(anyio.run(lambda: _client_process(**spec))))
        return 0

    results: dict[str, Any] = {}
    for kind in args.stores:
        with tempfile.TemporaryDirectory() as tmp, store(kind, Path(tmp)) as url:
            env = _env(url, Path(tmp), secrets.token_urlsafe(32))
            http = []
            for replicas in args.replicas:
                for workload in WORKLOADS:
                    progress(f"{kind}: {workload} over HTTP, {replicas} replica(s), {args.clients} clients…")
                    http.append(http_rate(env, replicas, workload, args.clients, args.calls, args.client_procs))
            progress(f"{kind}: {args.approvers} racing approvers over {args.proposals} proposals…")
            results[kind] = {"http": http, "decisions": decisions(url, args.proposals, args.approvers)}

    failed = any(h["errors"] for r in results.values() for h in r["http"]) or any(
        r["decisions"]["double_executions"] or r["decisions"]["missing_executions"] for r in results.values())
    if args.json:
        print(json.dumps(results))
        return 1 if failed else 0
    print(f"{'store':<11}{'workload':<8}{'replicas':>9}{'clients':>8}{'calls':>7}{'calls/s':>9}{'errors':>7}")
    for kind, result in results.items():
        for h in result["http"]:
            print(f"{kind:<11}{h['workload']:<8}{h['replicas']:>9}{h['clients']:>8}{h['calls']:>7}"
                  f"{h['calls_per_s']:>9}{h['errors']:>7}")
    print()
    print(f"{'store':<11}{'approvers':>10}{'proposals':>10}{'decisions/s':>12}{'1 approver/s':>13}{'double':>7}")
    for kind, result in results.items():
        d = result["decisions"]
        print(f"{kind:<11}{d['approvers']:>10}{d['proposals']:>10}{d['race_decisions_per_s']:>12}"
              f"{d['baseline_decisions_per_s']:>13}{d['double_executions']:>7}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

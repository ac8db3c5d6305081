"""Soak test: many clients for a long time against a real HTTP server; nothing may break.

    python scripts/soak.py [--minutes 10] [--clients 64] [--hostile 0.25] [--db URL] [--json]

Starts `mcp-knecht serve --transport http` (sessions) on demo data and runs N MCP clients over
Streamable HTTP — half on protocol 2026-07-28, half on 2025-11-25, each its own subject — doing
mixed reads (projects, runs, logs, greps, workflows, variables), staged writes (reruns,
dispatches, variables) and follow-ups, while an operator approves and rejects what is pending.
A fraction of the clients is hostile: lone surrogates, NUL, huge numbers, long strings, deep
nesting, injection strings, unknown tools, and raw `initialize` requests that try to fill the
session table. The server's RSS is sampled throughout.

At the end (after a clean stop): server errors (internal errors, 5xx, broken connections: must be
0), tool calls answered against `mcp`-source audit rows (must be equal), `mcp-knecht audit
verify` (must be intact), RSS at the start and the end, and throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets as random_secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mcp_knecht.core.auth import TokenSettings, mint_token  # noqa: E402
from tests.servers import free_port, knecht_executable  # noqa: E402

AGENT = ("projects:read", "workflows:read", "workflows:write", "runs:read", "runs:write", "logs:read",
         "variables:read", "variables:write", "proposals:read")
HOSTILE: list[Any] = ["a\x00b", 2**70, -(2**70), "x" * 120_000, "'; DROP TABLE runs; --", "%_%",
                      "\u202e\x1b[2J", 1e308, [[[[[[[[[[]]]]]]]]]], {"a": {"b": {"c": {"d": {"e": "f"}}}}}, None, True]


@dataclass
class Tally:
    calls: int = 0
    answered: int = 0
    tool_errors: int = 0
    server_errors: int = 0
    refused_sessions: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    def server_error(self, what: str) -> None:
        self.server_errors += 1
        if len(self.problems) < 20:
            self.problems.append(what[:300])


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _cli(program: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).parent / program), *args], env=env, capture_output=True,
                          text=True, timeout=120, check=False)


class Client:
    """One MCP client: its own subject, protocol and session, doing what its kind does."""

    def __init__(self, number: int, base: str, token: str, hostile: bool, ids: dict[str, list[Any]],
                 tally: Tally) -> None:
        self.number, self.base, self.token, self.hostile = number, base, token, hostile
        self.mode = "legacy" if number % 2 else "auto"
        self.ids, self.tally = ids, tally
        self.rng = random.Random(number)
        self.proposals: list[int] = []

    def _read(self) -> tuple[str, dict[str, Any]]:
        rng, ids = self.rng, self.ids
        run = rng.choice(ids["runs"])
        return rng.choice([
            ("list_projects", {}),
            ("get_project", {"project": rng.choice(ids["projects"])}),
            ("list_runs", {"status": rng.choice(["failed", "succeeded"]), "limit": 20}),
            ("list_runs", {"project": rng.choice(ids["projects"]), "branch": "main"}),
            ("get_run", {"run_id": run}),
            ("get_run_log", {"run_id": run, "tail": 50}),
            ("get_run_log", {"run_id": run, "grep": rng.choice(["error", "AKIA", "password", "ok", "*"])}),
            ("get_action_log", {"run_id": run, "action": "test", "tail": 100}),
            ("list_workflows", {}),
            ("get_workflow", {"workflow": rng.choice(ids["workflows"])}),
            ("project_variable", {"action": "list", "project": rng.choice(ids["projects"])}),
            ("list_proposals", {"limit": 10}),
        ])

    def _write(self) -> tuple[str, dict[str, Any]]:
        rng, ids = self.rng, self.ids
        return rng.choice([
            ("rerun_run", {"run_id": rng.choice(ids["finished"])}),
            ("dispatch_workflow", {"workflow": rng.choice(ids["workflows"]), "branch": "main"}),
            ("project_variable", {"action": "set", "project": rng.choice(ids["projects"]),
                                  "name": f"SOAK_{self.number}_{rng.randrange(50)}",
                                  "value": f"value-{rng.randrange(10**9)}", "secret": rng.random() < 0.5}),
        ])

    def _attack(self) -> tuple[str, dict[str, Any]]:
        rng = self.rng
        tool, arguments = self._read() if rng.random() < 0.7 else self._write()
        if arguments and rng.random() < 0.8:
            arguments[rng.choice(sorted(arguments))] = rng.choice(HOSTILE)
        else:
            arguments[rng.choice(["unknown", "x" * 300, "__proto__"])] = rng.choice(HOSTILE)
        if rng.random() < 0.1:
            tool = rng.choice(["no_such_tool", "list_runs; DROP TABLE runs", "x" * 500])
        return tool, arguments

    def _next(self) -> tuple[str, str, dict[str, Any]]:
        roll = self.rng.random()
        if self.hostile and roll < 0.5:
            return ("hostile", *self._attack())
        if self.proposals and roll < 0.15:
            return "follow-up", "get_proposal", {"id": self.rng.choice(self.proposals)}
        if roll < 0.85:
            return ("read", *self._read())
        return ("write", *self._write())

    def _raw_surrogates(self) -> None:
        """The SDK's client cannot even send a lone surrogate: raw JSON can (`\\ud800`)."""
        body = json.dumps({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
            "name": "list_runs", "arguments": {"branch": "@"}, "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {}}}}).replace('"@"', '"\\ud800"')
        request = urllib.request.Request(f"{self.base}/mcp", data=body.encode(), method="POST", headers={
            "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {self.token}", "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": "tools/call", "Mcp-Name": "list_runs"})
        self.tally.by_kind["raw surrogate"] += 1
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                answer = response.read().decode()
            self.tally.calls += 1  # it reached the gate (refused there, and audited)
            self.tally.answered += 1
            if "Internal error" in answer:
                self.tally.server_error(f"raw surrogate: {answer[:200]}")
        except urllib.error.HTTPError as error:  # 400: the SDK's JSON parser refused it first
            if error.code >= 500:
                self.tally.server_error(f"raw surrogate got {error.code}")
        except OSError as exc:
            self.tally.server_error(f"raw surrogate: {exc}")

    def _hog_sessions(self) -> None:
        """Open sessions without ever closing them: the server must refuse beyond the limit."""
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "hog", "version": "1"}}})
        request = urllib.request.Request(f"{self.base}/mcp", data=body.encode(), method="POST", headers={
            "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                response.read()
        except urllib.error.HTTPError as error:
            if error.code == 429:
                self.tally.refused_sessions += 1
            elif error.code >= 500:
                self.tally.server_error(f"session hog got {error.code}")

    async def run(self, deadline: float) -> None:
        import httpx2
        from mcp import Client as McpClient
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared.exceptions import MCPError

        while time.monotonic() < deadline:
            try:
                async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {self.token}"}, timeout=120) as http, \
                        McpClient(streamable_http_client(f"{self.base}/mcp", http_client=http), mode=self.mode) as mcp:
                    while time.monotonic() < deadline:
                        if self.hostile and self.rng.random() < 0.04:
                            hostile_http = self._hog_sessions if self.rng.random() < 0.5 else self._raw_surrogates
                            await anyio.to_thread.run_sync(hostile_http)
                            continue
                        kind, tool, arguments = self._next()
                        self.tally.calls += 1
                        self.tally.by_kind[kind] += 1
                        try:
                            with anyio.fail_after(120):
                                result = await mcp.call_tool(tool, arguments)
                        except MCPError as exc:
                            self.tally.server_error(f"{tool}: protocol error {exc}")
                            continue
                        self.tally.answered += 1
                        text = " ".join(getattr(part, "text", "") for part in result.content)
                        if result.is_error:
                            self.tally.tool_errors += 1
                            if "Internal error" in text:
                                self.tally.server_error(f"{tool}: {text}")
                        elif isinstance(result.structured_content, dict) and tool != "get_proposal" \
                                and result.structured_content.get("status") == "pending":
                            self.proposals.append(int(result.structured_content["id"]))
                            self.proposals = self.proposals[-20:]
            except Exception as exc:  # a broken connection or a 5xx: the server failed this client
                if "Too many open sessions" in _leaf(exc):  # its own hogging: refused, as it should be
                    self.tally.refused_sessions += 1
                else:
                    self.tally.server_error(f"client {self.number} ({self.mode}): {_leaf(exc)}")
                await anyio.sleep(1)


def _leaf(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


async def _operator(env: dict[str, str], deadline: float, decided: Counter[str]) -> None:
    """Decides what is pending every few seconds: approves most, rejects some."""
    rng = random.Random(7)
    while time.monotonic() < deadline:
        listed = await anyio.to_thread.run_sync(lambda: _cli("knecht-approve", env, "list", "--json", "--limit", "20"))
        for proposal in json.loads(listed.stdout or "[]")[:10]:
            verb = ["approve"] if rng.random() < 0.8 else ["reject", "--reason", "soak says no"]
            done = await anyio.to_thread.run_sync(
                lambda v=verb, p=proposal: _cli("knecht-approve", env, *v, str(p["id"]), "--as", "soak-operator"))
            decided[f"{verb[0]} exit {done.returncode}"] += 1
        await anyio.sleep(3)


async def _ids(base: str, token: str, tally: Tally) -> dict[str, list[Any]]:
    import httpx2
    from mcp import Client as McpClient
    from mcp.client.streamable_http import streamable_http_client

    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http, \
            McpClient(streamable_http_client(f"{base}/mcp", http_client=http)) as mcp:
        tally.calls += 3
        tally.answered += 3
        projects = (await mcp.call_tool("list_projects", {})).structured_content["projects"]  # type: ignore[index]
        workflows = (await mcp.call_tool("list_workflows", {})).structured_content["workflows"]  # type: ignore[index]
        runs = (await mcp.call_tool("list_runs", {"limit": 50})).structured_content["runs"]  # type: ignore[index]
    return {"projects": [p["slug"] for p in projects], "workflows": [w["id"] for w in workflows],
            "runs": [r["id"] for r in runs],
            "finished": [r["id"] for r in runs if r["status"] in ("failed", "succeeded", "cancelled")]}


def _sample_rss(pid: int, samples: list[int], stop: float) -> None:
    while time.monotonic() < stop:
        try:
            samples.append(_rss_kb(pid))
        except OSError:
            return
        time.sleep(5)


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="knecht-soak-"))
    secret = random_secrets.token_urlsafe(48)
    env = {**os.environ, "KNECHT_DATA_DIR": str(folder / "data"), "KNECHT_CONFIG_DIR": str(REPO),
           "KNECHT_DATABASE_URL": args.db or f"sqlite:///{folder / 'knecht.db'}", "KNECHT_JWT_SECRET": secret,
           "KNECHT_SESSIONS_PER_SUBJECT": "4", "KNECHT_SESSION_IDLE_TIMEOUT": "60s"}
    filled = _cli("mcp-knecht", env, "demo-data")
    if filled.returncode:
        raise SystemExit(filled.stderr)
    port = free_port()
    server = subprocess.Popen([knecht_executable(), "serve", "--transport", "http", "--port", str(port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=open(folder / "server.log", "w"))  # noqa: SIM115
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=1):
                break
        except OSError:
            time.sleep(0.1)
    settings = TokenSettings(secret=secret)
    tally, decided = Tally(), Counter[str]()
    try:
        ids = await _ids(base, mint_token(settings, subject="soak-setup", scopes=AGENT), tally)
        rss_start = _rss_kb(server.pid)
        deadline = time.monotonic() + args.minutes * 60
        samples: list[int] = []
        hostile_count = round(args.clients * args.hostile)
        clients = [Client(n, base, mint_token(settings, subject=f"soak-{n}", scopes=AGENT)
                          if n >= hostile_count or n % 2 == 0 else
                          mint_token(settings, subject=f"soak-{n}", scopes=()), n < hostile_count, ids, tally)
                   for n in range(args.clients)]
        started = time.monotonic()
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(anyio.to_thread.run_sync, _sample_rss, server.pid, samples, deadline)
            tasks.start_soon(_operator, env, deadline, decided)
            for client in clients:
                tasks.start_soon(client.run, deadline)
        elapsed = time.monotonic() - started
        rss_end = _rss_kb(server.pid)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
    verified = _cli("mcp-knecht", env, "audit", "verify", "--json")
    audited = _cli("mcp-knecht", env, "audit", "list", "--json", "--source", "mcp", "--limit", "1")
    count = _count_mcp_rows(env)
    return {
        "minutes": args.minutes, "clients": args.clients, "hostile_clients": round(args.clients * args.hostile),
        "calls": tally.calls, "answered": tally.answered, "calls_per_second": round(tally.answered / elapsed, 1),
        "by_kind": dict(tally.by_kind), "tool_errors": tally.tool_errors, "server_errors": tally.server_errors,
        "problems": tally.problems, "sessions_refused_429": tally.refused_sessions,
        "operator": dict(decided), "audit_rows_mcp": count,
        "audit_rows_equal_calls": count == tally.answered,
        "audit_verify": json.loads(verified.stdout or "{}") | {"exit": verified.returncode},
        "audit_list_ok": audited.returncode == 0,
        "rss_mb": {"start": round(rss_start / 1024, 1), "end": round(rss_end / 1024, 1),
                   "max": round(max(samples, default=0) / 1024, 1),
                   "samples": [round(s / 1024, 1) for s in samples[:: max(1, len(samples) // 12)]]},
        "server_exit": server.returncode, "folder": str(folder),
    }


def _count_mcp_rows(env: dict[str, str]) -> int:
    code = ("import anyio, sys\nfrom mcp_knecht.core.settings import load_settings\n"
            "from mcp_knecht.store import open_database\n"
            "async def main():\n    db = await open_database(load_settings().database_url)\n"
            "    row = await db.fetch_one(\"SELECT COUNT(*) AS n FROM audit_log WHERE source = 'mcp'\")\n"
            "    print(row['n']); await db.close()\nanyio.run(main)\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return int(done.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--hostile", type=float, default=0.25, help="fraction of hostile clients")
    parser.add_argument("--db", help="database URL (default: a fresh SQLite file)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = anyio.run(soak, args)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for key, value in report.items():
            print(f"{key:24} {value}")
    ok = (report["server_errors"] == 0 and report["audit_rows_equal_calls"] and report["audit_verify"]["exit"] == 0)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

"""What does the gate cost over HTTP? Throughput and latency against a bare SDK server, one run.

    python scripts/bench_http.py                          # ~3 minutes on 2 cores
    python scripts/bench_http.py --seconds 3 --clients 16 # a quick look
    python scripts/bench_http.py --modes stateless --protocols 2026-07-28 --json
    python scripts/bench_http.py --soak-minutes 10        # plus a 10-minute soak at 64 clients

Compared, per mode (sessions, `--stateless`), protocol (2026-07-28, 2025-11-25) and number of
concurrent clients (16, 64):
  gated  `mcp-knecht serve --transport http [--stateless]` on a temp SQLite demo database: a JWT
         verified per request, the gate (validation, policy, scrubbing) and an audit row per call;
  bare   `scripts/bare_http_server.py`: the SDK's own Streamable-HTTP app of a low-level
         `mcp.server.Server` whose only tool calls the very same Knecht handler (`get_project`) on
         the same database; no authentication, no validation, no audit. Same uvicorn settings.
Each client calls `tools/call get_project {"project": "payments-api"}` in a loop over its own
keep-alive HTTP/1.1 connection (raw JSON-RPC on asyncio streams: a light load generator, as the
machine's cores are shared with the servers). 2025-11-25 clients do `initialize` and
`notifications/initialized` once and send `Mcp-Session-Id` (stateful) and `MCP-Protocol-Version`;
2026-07-28 is sessionless by nature (per-request `_meta` envelope and `Mcp-Method`/`Mcp-Name`
headers), so its "stateful" cell only differs in the server's configuration. Cells alternate
gated/bare, bare/gated, … so drift hits both alike; calls completing in the first `--warmup`
seconds are not timed. Targets: calls/s ≥ 0.9 x bare, p99 ≤ 1.5 x bare, 0 errors, one audit row
(source mcp, outcome ran) per successful gated call. Server RSS: idle after start, peak and median
under load, and with `--soak-minutes` a soak at 64 clients against the gated server.

Exit status 0 even when a target is missed (this is a measurement, not a test); 1 when something
did not work (errors, different answers, a server that did not start, missing audit rows).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "scripts"), str(REPO)]

from bench_gate import LEGACY_VERSION, MODERN_META, MODERN_VERSION, TOOL, bench_env, fill_database  # noqa: E402

from tests.servers import free_port, knecht_executable  # noqa: E402

BARE_HTTP_SERVER = REPO / "scripts" / "bare_http_server.py"
HOST = "127.0.0.1"
TARGET_RATE_RATIO = 0.9
TARGET_P99_RATIO = 1.5
START_TIMEOUT = 60.0
SOAK_CLIENTS = 64
SOAK_SAMPLE_SECONDS = 5.0
LOAD_SAMPLE_SECONDS = 0.25
MODES = ("stateful", "stateless")
PROTOCOLS = (MODERN_VERSION, LEGACY_VERSION)


def progress(message: str) -> None:
    print(f"[bench-http] {message}", file=sys.stderr, flush=True)


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (all its threads)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


# --- servers -----------------------------------------------------------------------------------


@dataclass
class ServerProcess:
    side: str
    mode: str
    process: subprocess.Popen[bytes]
    port: int
    log: Path
    idle_rss_mb: float = 0.0

    @property
    def pid(self) -> int:
        return self.process.pid


def start_server(side: str, mode: str, env: dict[str, str], tmp: Path, arguments: dict[str, Any]) -> ServerProcess:
    port = free_port()
    stateless = ["--stateless"] if mode == "stateless" else []
    if side == "gated":
        command = [knecht_executable(), "serve", "--transport", "http", "--host", HOST, "--port", str(port), *stateless]
    else:
        command = [sys.executable, str(BARE_HTTP_SERVER), "--host", HOST, "--port", str(port), *stateless,
                   "--arguments", json.dumps(arguments)]
    log = tmp / f"{side}-{mode}.log"
    with open(log, "wb") as errors:
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=errors, cwd=str(tmp))
    server = ServerProcess(side, mode, process, port, log)
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{side} server ({mode}) exited with {process.returncode}:\n{log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://{HOST}:{port}/healthz", timeout=1) as response:
                if response.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            stop_server(server)
            raise RuntimeError(f"{side} server ({mode}) did not answer /healthz within {START_TIMEOUT}s")
        time.sleep(0.1)
    time.sleep(0.5)  # settle: start-up work done, then the idle figure
    server.idle_rss_mb = rss_mb(process.pid)
    return server


def stop_server(server: ServerProcess) -> int | None:
    """SIGTERM, as an operator would: the gated server writes its last audit rows before it exits."""
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
    return server.process.returncode


# --- a light HTTP/1.1 client -------------------------------------------------------------------


class HttpError(Exception):
    pass


class Connection:
    """One keep-alive HTTP/1.1 connection; one request at a time (as one MCP client does)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.host_header = f"Host: {HOST}:{port}\r\n".encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()
        self.reader = self.writer = None

    async def request(self, method: str, headers: bytes, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(HOST, self.port, limit=1 << 22)
        assert self.reader is not None
        self.writer.write(b"%s /mcp HTTP/1.1\r\n%s%sContent-Length: %d\r\n\r\n%s"
                          % (method.encode(), self.host_header, headers, len(body), body))
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        response_headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                response_headers[name.strip().lower()] = value.strip()
        if "content-length" in response_headers:
            data = await self.reader.readexactly(int(response_headers["content-length"]))
        elif response_headers.get("transfer-encoding", "").lower() == "chunked":
            data = await self._chunked()
        else:
            data = await self.reader.read()
            await self.close()
        if response_headers.get("connection", "").lower() == "close":
            await self.close()
        return status, response_headers, data

    async def _chunked(self) -> bytes:
        assert self.reader is not None
        parts: list[bytes] = []
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                while (await self.reader.readuntil(b"\r\n")) != b"\r\n":
                    pass  # trailers
                return b"".join(parts)
            parts.append((await self.reader.readexactly(size + 2))[:-2])


def jsonrpc_message(status: int, headers: dict[str, str], data: bytes, request_id: int) -> dict[str, Any]:
    """The JSON-RPC response to `request_id`, from a JSON or an SSE body."""
    if status != 200:
        raise HttpError(f"HTTP {status}: {data[:300]!r}")
    if headers.get("content-type", "").startswith("text/event-stream"):
        for event in data.split(b"\n\n"):
            for line in event.splitlines():
                if line.startswith(b"data:"):
                    message = json.loads(line[5:])
                    if message.get("id") == request_id:
                        return message  # type: ignore[no-any-return]
        raise HttpError(f"no response with id {request_id} in the event stream: {data[:300]!r}")
    return json.loads(data)  # type: ignore[no-any-return]


def call_problem(message: dict[str, Any]) -> str | None:
    """Why a tools/call answer counts as an error, or None."""
    if "error" in message:
        return f"JSON-RPC error {json.dumps(message['error'])[:300]}"
    result = message.get("result") or {}
    if result.get("isError"):
        return f"isError: {json.dumps(result.get('content'))[:300]}"
    return None


# --- one MCP client ----------------------------------------------------------------------------


class McpClient:
    """Raw JSON-RPC `tools/call` over one connection, in either protocol."""

    def __init__(self, port: int, token: str, protocol: str, arguments: dict[str, Any]) -> None:
        self.connection = Connection(port)
        self.protocol = protocol
        self.session_id: str | None = None
        self.next_id = 1
        self.base_headers = (b"Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
                             b"Authorization: Bearer %s\r\n" % token.encode())
        params: dict[str, Any] = {"name": TOOL, "arguments": arguments}
        if protocol == MODERN_VERSION:
            params["_meta"] = MODERN_META
        body = json.dumps({"jsonrpc": "2.0", "id": 0, "method": "tools/call", "params": params},
                          separators=(",", ":")).encode()
        self.body_prefix, self.body_suffix = body.split(b'"id":0', 1)
        self.call_headers = b""

    def _headers(self) -> bytes:
        extra = b"MCP-Protocol-Version: %s\r\n" % self.protocol.encode()
        if self.protocol == MODERN_VERSION:
            extra += b"Mcp-Method: tools/call\r\nMcp-Name: %s\r\n" % TOOL.encode()
        if self.session_id:
            extra += b"Mcp-Session-Id: %s\r\n" % self.session_id.encode()
        return self.base_headers + extra

    async def open(self) -> None:
        """2025-11-25: the `initialize` handshake (a session when the server keeps them). 2026-07-28: nothing."""
        if self.protocol == MODERN_VERSION:
            self.call_headers = self._headers()
            return
        body = json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": LEGACY_VERSION, "capabilities": {},
            "clientInfo": {"name": "bench-http", "version": "0"}}}).encode()
        status, headers, data = await self.connection.request("POST", self.base_headers, body)
        message = jsonrpc_message(status, headers, data, 0)
        if "result" not in message:
            raise HttpError(f"initialize failed: {json.dumps(message)[:300]}")
        self.session_id = headers.get("mcp-session-id")
        self.call_headers = self._headers()
        status, _, data = await self.connection.request(
            "POST", self.call_headers, b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
        if status != 202:
            raise HttpError(f"notifications/initialized: HTTP {status}: {data[:300]!r}")

    async def call(self) -> dict[str, Any]:
        request_id = self.next_id
        self.next_id += 1
        body = b'%s"id":%d%s' % (self.body_prefix, request_id, self.body_suffix)
        status, headers, data = await self.connection.request("POST", self.call_headers, body)
        return jsonrpc_message(status, headers, data, request_id)

    async def close(self) -> None:
        """End the session (DELETE), so the next cell's clients find room under the session limits."""
        if self.session_id:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError, ValueError):
                await self.connection.request("DELETE", self.call_headers)
        await self.connection.close()


# --- load --------------------------------------------------------------------------------------


@dataclass
class Load:
    """What N clients did against one server for one cell (or the soak)."""

    latencies_ms: list[float] = field(default_factory=list)
    ok: int = 0  # successful calls, timed or not (each one must have its audit row on the gated side)
    errors: int = 0
    problems: list[str] = field(default_factory=list)
    rss_samples_mb: list[float] = field(default_factory=list)
    timed_seconds: float = 0.0
    server_cpu: float = 0.0  # CPU seconds the server used in the timed window
    client_cpu: float = 0.0  # … and this process (the load generator)

    def error(self, what: str) -> None:
        self.errors += 1
        if len(self.problems) < 5:
            self.problems.append(what[:300])


async def client_loop(client: McpClient, load: Load, window: tuple[float, float]) -> None:
    start, end = window
    clock = time.perf_counter
    while True:
        t0 = clock()
        if t0 >= end:
            return
        try:
            message = await client.call()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, HttpError, ValueError) as exc:
            load.error(f"{type(exc).__name__}: {exc}")
            await client.connection.close()
            await asyncio.sleep(0.01)
            continue
        t1 = clock()
        problem = call_problem(message)
        if problem:
            load.error(problem)
            continue
        load.ok += 1
        if start <= t1 <= end:
            load.latencies_ms.append((t1 - t0) * 1000)


async def sample(pid: int, load: Load, window: tuple[float, float], every: float) -> None:
    """RSS every `every` seconds in the timed window, and the CPU both processes used in it."""
    start, end = window
    await asyncio.sleep(max(0.0, start - time.perf_counter()))
    server_cpu, client_cpu = cpu_seconds(pid), time.process_time()
    while time.perf_counter() < end:
        load.rss_samples_mb.append(rss_mb(pid))
        await asyncio.sleep(min(every, max(0.0, end - time.perf_counter())))
    load.server_cpu, load.client_cpu = cpu_seconds(pid) - server_cpu, time.process_time() - client_cpu


async def open_clients(server: ServerProcess, tokens: list[str], protocols: list[str],
                       arguments: dict[str, Any], load: Load) -> list[McpClient]:
    clients = [McpClient(server.port, token, protocols[i % len(protocols)], arguments)
               for i, token in enumerate(tokens)]
    opened = await asyncio.gather(*(c.open() for c in clients), return_exceptions=True)
    for outcome in opened:
        if isinstance(outcome, BaseException):
            load.error(f"handshake: {type(outcome).__name__}: {outcome}")
    return [c for c, outcome in zip(clients, opened, strict=True) if not isinstance(outcome, BaseException)]


async def run_load(server: ServerProcess, tokens: list[str], protocols: list[str], arguments: dict[str, Any],
                   warmup: float, seconds: float, rss_every: float = LOAD_SAMPLE_SECONDS) -> Load:
    load = Load(timed_seconds=seconds)
    clients = await open_clients(server, tokens, protocols, arguments, load)
    now = time.perf_counter()
    window = (now + warmup, now + warmup + seconds)
    try:
        await asyncio.gather(sample(server.pid, load, window, rss_every),
                             *(client_loop(c, load, window) for c in clients))
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    return load


def summarize(load: Load) -> dict[str, Any]:
    samples = load.latencies_ms
    return {
        "calls_per_second": round(len(samples) / load.timed_seconds, 1) if load.timed_seconds else 0.0,
        "timed_calls": len(samples),
        "p50_ms": round(quantile(samples, 0.50), 2),
        "p99_ms": round(quantile(samples, 0.99), 2),
        "errors": load.errors,
        "problems": load.problems,
        "ok_calls": load.ok,
        "server_cpu_percent": round(100 * load.server_cpu / load.timed_seconds) if load.timed_seconds else 0,
        "loadgen_cpu_percent": round(100 * load.client_cpu / load.timed_seconds) if load.timed_seconds else 0,
        "rss_peak_mb": round(max(load.rss_samples_mb, default=0.0), 1),
        "rss_median_mb": round(statistics.median(load.rss_samples_mb), 1) if load.rss_samples_mb else 0.0,
    }


# --- phases ------------------------------------------------------------------------------------


async def verify_same_answer(gated: ServerProcess, bare: ServerProcess, token: str, protocol: str,
                             arguments: dict[str, Any]) -> int:
    """One call each: both must succeed with the same structured content. Returns gated successes."""
    answers = []
    for server in (gated, bare):
        client = McpClient(server.port, token, protocol, arguments)
        try:
            await client.open()
            message = await client.call()
        finally:
            await client.close()
        problem = call_problem(message)
        if problem:
            raise RuntimeError(f"{server.side} ({server.mode}, {protocol}) answered with an error: {problem}")
        answers.append(message["result"].get("structuredContent"))
    if answers[0] != answers[1] or answers[0] is None:
        raise RuntimeError(f"gated and bare answer differently ({gated.mode}, {protocol}):\n"
                           f"{json.dumps(answers[0])[:600]}\n{json.dumps(answers[1])[:600]}")
    return 1


def cell_plan(protocols: list[str], clients: list[int]) -> list[tuple[str, int, tuple[str, str]]]:
    """(protocol, clients, side order): gated/bare, bare/gated, … so drift hits both alike."""
    cells = [(p, n) for p in protocols for n in clients]
    return [(p, n, ("gated", "bare") if i % 2 == 0 else ("bare", "gated")) for i, (p, n) in enumerate(cells)]


async def run_mode(mode: str, args: argparse.Namespace, env: dict[str, str], tmp: Path,
                   tokens: list[str], report: dict[str, Any]) -> int:
    """All cells of one mode; returns the gated side's successful calls (for the audit check)."""
    arguments = json.loads(args.arguments)
    progress(f"{mode}: starting the gated and the bare server")
    servers: dict[str, ServerProcess] = {}
    gated_ok = 0
    try:
        for side in ("gated", "bare"):
            servers[side] = start_server(side, mode, env, tmp, arguments)
        report["rss_idle_mb"][mode] = {side: round(s.idle_rss_mb, 1) for side, s in servers.items()}
        for protocol in args.protocols:
            gated_ok += await verify_same_answer(servers["gated"], servers["bare"], tokens[0], protocol, arguments)
        for protocol, n, order in cell_plan(args.protocols, args.clients):
            cell: dict[str, Any] = {"mode": mode, "protocol": protocol, "clients": n,
                                    "sessionless": protocol == MODERN_VERSION or mode == "stateless"}
            for side in order:
                progress(f"{mode} {protocol} {n} clients: {side} ({args.warmup:g} s warm-up + {args.seconds:g} s)")
                load = await run_load(servers[side], tokens[:n], [protocol], arguments, args.warmup, args.seconds)
                cell[side] = summarize(load)
                if side == "gated":
                    gated_ok += load.ok
                if load.errors:
                    progress(f"  {load.errors} errors, e.g. {load.problems[0]}")
            cell.update(ratios(cell["gated"], cell["bare"]))
            report["cells"].append(cell)
        if args.soak_minutes > 0 and mode == args.modes[0]:
            gated_ok += await soak(servers["gated"], tokens[:SOAK_CLIENTS], args, arguments, report)
    finally:
        for side, server in servers.items():
            code = stop_server(server)
            if side == "gated" and code not in (0, -signal.SIGTERM):
                report["failures"].append(f"gated server ({mode}) exited with {code}: {server.log}")
    return gated_ok


def ratios(gated: dict[str, Any], bare: dict[str, Any]) -> dict[str, Any]:
    rate = gated["calls_per_second"] / bare["calls_per_second"] if bare["calls_per_second"] else float("nan")
    p99 = gated["p99_ms"] / bare["p99_ms"] if bare["p99_ms"] else float("nan")
    return {"rate_ratio": round(rate, 3), "p99_ratio": round(p99, 3),
            "meets_rate": rate >= TARGET_RATE_RATIO, "meets_p99": p99 <= TARGET_P99_RATIO}


async def soak(server: ServerProcess, tokens: list[str], args: argparse.Namespace, arguments: dict[str, Any],
               report: dict[str, Any]) -> int:
    """64 clients (the protocols alternating) against the gated server for `--soak-minutes`."""
    seconds = args.soak_minutes * 60
    progress(f"soak: {len(tokens)} clients against the gated server ({server.mode}) for {args.soak_minutes:g} min")
    rss_start = rss_mb(server.pid)
    load = await run_load(server, tokens, args.protocols, arguments, 0.0, seconds, rss_every=SOAK_SAMPLE_SECONDS)
    await asyncio.sleep(2)  # let the last requests' garbage go
    samples = load.rss_samples_mb
    per_minute = max(1, int(60 / SOAK_SAMPLE_SECONDS))
    report["soak"] = {
        "mode": server.mode, "minutes": args.soak_minutes, "clients": len(tokens), "protocols": args.protocols,
        **{k: v for k, v in summarize(load).items() if not k.startswith("rss_")},
        "rss_mb": {"start": round(rss_start, 1), "end": round(rss_mb(server.pid), 1),
                   "max": round(max(samples, default=0.0), 1),
                   "first_minute_median": round(statistics.median(samples[:per_minute]), 1) if samples else 0.0,
                   "last_minute_median": round(statistics.median(samples[-per_minute:]), 1) if samples else 0.0,
                   "samples": [round(s, 1) for s in samples[:: max(1, len(samples) // 12)]]},
    }
    return load.ok


async def count_audit_rows(url: str) -> int:
    from mcp_knecht.store import open_database

    db = await open_database(url)
    try:
        row = await db.fetch_one(
            "SELECT COUNT(*) AS n FROM audit_log WHERE source = 'mcp' AND tool = ? AND outcome = 'ran'", (TOOL,))
    finally:
        await db.close()
    return int(row["n"]) if row else 0


def mint_tokens(env: dict[str, str], count: int) -> list[str]:
    """One readonly token per client, each its own subject (the per-subject session limit is real)."""
    from mcp_knecht.core.auth import TokenSettings, mint_token
    from mcp_knecht.core.scopes import load_scopes
    from mcp_knecht.core.settings import load_settings

    scopes = load_scopes(load_settings(env=env).scopes_dir).profile("readonly").scopes
    settings = TokenSettings(secret=env["KNECHT_JWT_SECRET"])
    return [mint_token(settings, subject=f"bench-http-{n}", scopes=scopes, client="bench") for n in range(count)]


async def bench(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    env = bench_env(tmp, secrets.token_urlsafe(48))
    progress(f"demo data into {env['KNECHT_DATABASE_URL']}")
    demo = await fill_database(env["KNECHT_DATABASE_URL"])
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "VIRTUAL_ENV", "TMPDIR", "PYTHONPATH")  # PYTHONPATH: a worktree's code
    child_env = {**{k: v for k, v in os.environ.items() if k in keep}, **env}
    tokens = mint_tokens(env, max([*args.clients, SOAK_CLIENTS if args.soak_minutes > 0 else 1]))
    report: dict[str, Any] = {
        "python": sys.version.split()[0], "cpus": os.cpu_count(), "demo": demo, "tool": TOOL,
        "arguments": json.loads(args.arguments), "seconds_per_cell": args.seconds, "warmup": args.warmup,
        "cells": [], "rss_idle_mb": {}, "failures": [],
    }
    gated_ok = 0
    for mode in args.modes:
        try:
            gated_ok += await run_mode(mode, args, child_env, tmp, tokens, report)
        except RuntimeError as exc:
            report["failures"].append(str(exc))
            progress(f"{mode} failed: {exc}")
    rows = await count_audit_rows(env["KNECHT_DATABASE_URL"])
    report["audit"] = {"rows_ran": rows, "gated_successful_calls": gated_ok, "equal": rows == gated_ok}
    return report


# --- report ------------------------------------------------------------------------------------


def _mark(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def print_report(report: dict[str, Any]) -> None:
    print(f"mcp-knecht HTTP benchmark  (python {report['python']}, {report['cpus']} cpus; "
          f"tools/call {report['tool']} {json.dumps(report['arguments'])}; {report['seconds_per_cell']:g} s per cell "
          f"after {report['warmup']:g} s warm-up; bare = no auth, no gate, no audit)")
    print(f"{'mode':<9} {'protocol':<10} {'cl':>3} | {'gated/s':>8} {'p50':>6} {'p99':>7} {'err':>4} | "
          f"{'bare/s':>8} {'p50':>6} {'p99':>7} {'err':>4} | {'rate g/b':>13} {'p99 g/b':>13} | rss g/b MB"
          " | cpu% srv/gen g, b")
    for c in report["cells"]:
        g, b = c["gated"], c["bare"]
        print(f"{c['mode']:<9} {c['protocol']:<10} {c['clients']:>3} | "
              f"{g['calls_per_second']:>8.1f} {g['p50_ms']:>6.1f} {g['p99_ms']:>7.1f} {g['errors']:>4} | "
              f"{b['calls_per_second']:>8.1f} {b['p50_ms']:>6.1f} {b['p99_ms']:>7.1f} {b['errors']:>4} | "
              f"{c['rate_ratio']:>6.3f} {_mark(c['meets_rate']):<6} "
              f"{c['p99_ratio']:>6.3f} {_mark(c['meets_p99']):<6} | "
              f"{g['rss_peak_mb']:>5.0f}/{b['rss_peak_mb']:<4.0f} | "
              f"{g['server_cpu_percent']}/{g['loadgen_cpu_percent']}, "
              f"{b['server_cpu_percent']}/{b['loadgen_cpu_percent']}")
    print(f"(latencies in ms; targets: rate g/b ≥ {TARGET_RATE_RATIO}, p99 g/b ≤ {TARGET_P99_RATIO}; rss: peak "
          "under load; cpu%: server / load generator, 100 = one core; 2026-07-28 is sessionless in both modes: "
          "its stateful cells differ only in the server's configuration)")
    for mode, idle in report["rss_idle_mb"].items():
        loaded = [c for c in report["cells"] if c["mode"] == mode]
        peak = {side: max((c[side]["rss_peak_mb"] for c in loaded), default=0.0) for side in ("gated", "bare")}
        median = {side: statistics.median([c[side]["rss_median_mb"] for c in loaded]) if loaded else 0.0
                  for side in ("gated", "bare")}
        print(f"RSS {mode:<9} gated idle {idle['gated']:.1f}, under load median {median['gated']:.1f} peak "
              f"{peak['gated']:.1f} MB;  bare idle {idle['bare']:.1f}, median {median['bare']:.1f} peak "
              f"{peak['bare']:.1f} MB")
    soak = report.get("soak")
    if soak:
        r = soak["rss_mb"]
        print(f"soak {soak['minutes']:g} min, {soak['clients']} clients, gated {soak['mode']}: "
              f"{soak['calls_per_second']:.1f} calls/s, p50 {soak['p50_ms']:.1f} p99 {soak['p99_ms']:.1f} ms, "
              f"{soak['errors']} errors; RSS start {r['start']} end {r['end']} max {r['max']} MB, "
              f"first-minute median {r['first_minute_median']} last-minute median {r['last_minute_median']} MB")
        print(f"     RSS samples: {r['samples']}")
    audit = report["audit"]
    print(f"audit rows (source mcp, {report['tool']}, ran): {audit['rows_ran']} for {audit['gated_successful_calls']} "
          f"successful gated calls: {'ok' if audit['equal'] else 'MISMATCH'}")
    for failure in report["failures"]:
        print(f"FAILED: {failure}")
    print(f"total {report['total_seconds']:.1f} s")


def csv_of(kind: type, allowed: tuple[Any, ...] | None = None) -> Any:
    def parse(text: str) -> list[Any]:
        values = [kind(part.strip()) for part in text.split(",") if part.strip()]
        if not values or (allowed is not None and any(v not in allowed for v in values)):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {allowed or kind.__name__}")
        return values
    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="timed seconds per cell and side")
    parser.add_argument("--warmup", type=float, default=1.0, help="untimed seconds before each timed run")
    parser.add_argument("--clients", type=csv_of(int), default=[16, 64], help="concurrent clients, e.g. 16,64")
    parser.add_argument("--modes", type=csv_of(str, MODES), default=list(MODES), help="stateful,stateless")
    parser.add_argument("--protocols", type=csv_of(str, PROTOCOLS), default=list(PROTOCOLS),
                        help=f"{MODERN_VERSION},{LEGACY_VERSION}")
    parser.add_argument("--soak-minutes", type=float, default=0.0,
                        help=f"soak at {SOAK_CLIENTS} clients against the gated server (first mode); 0 = skip")
    parser.add_argument("--arguments", default='{"project": "payments-api"}', metavar="JSON",
                        help=f"{TOOL} arguments")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    return parser.parse_args(argv)


def failed(report: dict[str, Any]) -> bool:
    errors = sum(c[side]["errors"] for c in report["cells"] for side in ("gated", "bare"))
    errors += report.get("soak", {}).get("errors", 0)
    return bool(report["failures"]) or errors > 0 or not report["audit"]["equal"]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="knecht-bench-http-") as folder:
        report = asyncio.run(bench(args, Path(folder)))
        report["total_seconds"] = round(time.perf_counter() - started, 1)
        if report["failures"]:  # the servers' logs go with the temp dir: show their tails
            for log in sorted(Path(folder).glob("*.log")):
                progress(f"--- {log.name}\n{log.read_text(errors='replace')[-1500:]}")
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        print_report(report)
    return 1 if failed(report) else 0


if __name__ == "__main__":
    sys.exit(main())

"""What does the gate cost? Medians and ratios against a bare SDK server, measured in one run.

1. In-memory `tools/call` round trip through the SDK client (`mcp.Client(server)`), protocol
   2026-07-28 ("auto") and 2025-11-25 ("legacy"):
     gated   `build_mcp_server(app.gate, …)` over `open_app(...)` on a temp SQLite demo database,
             audit records written by the group-committing AuditLog;
     bare    a low-level `mcp.server.Server` whose `on_call_tool` calls the very same Knecht
             handler (`get_project`) with arguments parsed once up front: no validation, no audit.
   Batches alternate (gated/bare, then bare/gated, …) so drift hits both sides alike. Each call is
   timed on its own; the "amortized" figure adds the audit flush after every gated batch, so the
   background group commit is charged to the gate and never leaks into a bare batch.
2. stdio cold start: spawn `mcp-knecht serve` vs `python scripts/bare_server.py`, write raw
   JSON-RPC lines to stdin at once and time spawn → response line. Modern: one `tools/list`
   (sessionless 2026-07-28). Legacy: `initialize`, `notifications/initialized`, `tools/list`
   pipelined; both the `initialize` and the `tools/list` responses are timed.

    python scripts/bench_gate.py                 # ~1 minute on 2 cores
    python scripts/bench_gate.py --calls 10000 --starts 30 --json
    python scripts/bench_gate.py --importtime    # also: top start-up imports of `mcp-knecht serve`
    python scripts/bench_gate.py --classes       # also: start-up time spent creating classes
    python scripts/bench_gate.py --skip calls --compare /tmp/before   # also: an earlier checkout's start
    python scripts/bench_gate.py --profile 3000  # also: cProfile of N gated calls (tottime)
    python scripts/bench_gate.py --steps 3000    # also: each gate step's time inside calls and warm

Exit status 0 even when a target is missed (this is a measurement, not a test); 1 when something
did not work (an error result, a server that did not answer, missing audit rows).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import selectors
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BARE_SERVER = REPO / "scripts" / "bare_server.py"
TOOL = "get_project"
TARGET_CALL_RATIO = 1.10  # issue 17: gate ≤ 1.10x the bare server in memory
TARGET_START_RATIO = 1.05  # issue 17: stdio cold start ≤ 1.05x the bare server
BATCH = 200
MODERN_VERSION = "2026-07-28"
LEGACY_VERSION = "2025-11-25"
START_TIMEOUT = 30.0


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def median_us(samples_ns: list[int] | list[float]) -> float:
    return statistics.median(samples_ns) / 1000


def quantile_us(samples_ns: list[int], q: float) -> float:
    ordered = sorted(samples_ns)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000


# --- set-up ------------------------------------------------------------------------------------


def bench_env(tmp: Path, secret: str) -> dict[str, str]:
    return {
        "KNECHT_DATA_DIR": str(tmp / "data"),
        "KNECHT_DATABASE_URL": f"sqlite:///{tmp / 'knecht.db'}",
        "KNECHT_CONFIG_DIR": str(REPO),
        "KNECHT_JWT_SECRET": secret,
    }


async def fill_database(url: str) -> dict[str, Any]:
    from mcp_knecht.knecht import open_store
    from mcp_knecht.knecht.demo import fill_demo_data

    db = await open_store(url)
    try:
        summary = await fill_demo_data(db)
    finally:
        await db.close()
    return {"projects": summary.projects, "runs": summary.runs, "actions": summary.actions}


def mint(env: dict[str, str], subject: str, profile: str) -> tuple[str, Any]:
    """A token from the readonly profile and the actor the server would build from it."""
    from mcp_knecht.core.auth import TokenSettings, TokenVerifier, mint_token
    from mcp_knecht.core.scopes import load_scopes
    from mcp_knecht.core.settings import load_settings

    settings = load_settings(env=env)
    scopes = load_scopes(settings.scopes_dir).profile(profile).scopes
    token_settings = TokenSettings(secret=env["KNECHT_JWT_SECRET"])
    token = mint_token(token_settings, subject=subject, scopes=scopes, client="bench")
    return token, TokenVerifier(token_settings).verify(token)


# --- phase 1: in-memory tools/call -------------------------------------------------------------


def build_bare_server(tool: Any, parsed_arguments: Any, context: Any) -> Any:
    """A bare low-level server serving the same tool: the handler, called directly."""
    import mcp_types as types
    from mcp.server import Server
    from pydantic import BaseModel

    listed = types.Tool(
        name=tool.name,
        title=tool.title,
        description=tool.description,
        input_schema=tool.input_schema,
        output_schema=tool.output_schema,
    )
    handler = tool.handler

    async def list_tools(ctx: Any, params: Any) -> Any:
        return types.ListToolsResult(tools=[listed])

    async def call_tool(ctx: Any, params: Any) -> Any:
        raw = await handler(parsed_arguments, context)
        if isinstance(raw, BaseModel):
            raw = raw.model_dump(mode="json")
        data = raw if isinstance(raw, dict) else {"result": raw}
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(data, ensure_ascii=False, default=str))],
            structured_content=data,
        )

    return Server("bare", version="0", on_list_tools=list_tools, on_call_tool=call_tool)


async def default_arguments(app: Any) -> dict[str, Any]:
    row = await app.db.fetch_one("SELECT slug FROM projects ORDER BY id LIMIT 1")
    if row is None:
        raise SystemExit("bench: the demo database has no projects")
    return {"project": row["slug"]}


class Side:
    def __init__(self, name: str, client: Any, after_batch: Callable[[], Awaitable[None]] | None) -> None:
        self.name = name
        self.client = client
        self.after_batch = after_batch
        self.samples: list[int] = []
        self.batch_ns: list[int] = []  # whole batch including after_batch (the audit flush)
        self.calls = 0
        self.errors = 0

    async def run(self, n: int, arguments: dict[str, Any], *, record: bool) -> None:
        call = self.client.call_tool
        clock = time.perf_counter_ns
        samples: list[int] = []
        errors = 0
        batch_start = clock()
        for _ in range(n):
            t0 = clock()
            result = await call(TOOL, arguments)
            samples.append(clock() - t0)
            errors += bool(result.is_error)
        if self.after_batch is not None:
            await self.after_batch()
        batch_ns = clock() - batch_start
        self.calls += n
        self.errors += errors
        if errors:
            progress(f"{self.name}: {errors} of {n} calls returned is_error: {result.content[0].text[:300]}")
        if record:
            self.samples += samples
            self.batch_ns.append(batch_ns)


async def in_memory(app: Any, actor: Any, arguments: dict[str, Any], mode: str, calls: int,
                    warmup: int, scrub: bool = True) -> tuple[dict[str, Any], Side]:
    from mcp import Client

    from mcp_knecht.core.gate import Gate
    from mcp_knecht.core.tools import ToolContext
    from mcp_knecht.transports.mcp_server import build_mcp_server

    tool = app.registry.get(TOOL)
    parsed = tool.input_model.model_validate(arguments)
    # Without the scrubber: what the gate's own steps cost (validation, policy, audit).
    gate = app.gate if scrub else Gate(app.registry, app.audit, policy=app.policy)
    gated_server = build_mcp_server(gate, lambda ctx: actor)
    bare_server = build_bare_server(tool, parsed, ToolContext(actor=actor, source="mcp"))
    async with Client(gated_server, mode=mode) as gated_client, Client(bare_server, mode=mode) as bare_client:
        gated = Side("gated", gated_client, app.audit.flush)
        bare = Side("bare", bare_client, None)
        # The two answers must be the same document, or we would compare different work.
        g = await gated_client.call_tool(TOOL, arguments)
        b = await bare_client.call_tool(TOOL, arguments)
        if g.is_error or b.is_error or g.structured_content != b.structured_content:
            raise SystemExit(f"bench: gated and bare answers differ:\n{g}\n{b}")
        for _ in range(max(1, warmup // BATCH)):
            await gated.run(min(BATCH, warmup), arguments, record=False)
            await bare.run(min(BATCH, warmup), arguments, record=False)
        rounds = max(1, calls // BATCH)
        gc.collect()
        for i in range(rounds):
            first, second = (gated, bare) if i % 2 == 0 else (bare, gated)
            await first.run(BATCH, arguments, record=True)
            await second.run(BATCH, arguments, record=True)
    # Ratio per round too: robust against slow drift, shows the spread of the ratio.
    per_round = [
        statistics.median(gated.samples[i * BATCH:(i + 1) * BATCH])
        / statistics.median(bare.samples[i * BATCH:(i + 1) * BATCH])
        for i in range(rounds)
    ]
    result = {
        "mode": mode,
        "protocol": MODERN_VERSION if mode == "auto" else LEGACY_VERSION,
        "calls_per_side": rounds * BATCH,
        "gated_median_us": round(median_us(gated.samples), 1),
        "bare_median_us": round(median_us(bare.samples), 1),
        "gated_p90_us": round(quantile_us(gated.samples, 0.9), 1),
        "bare_p90_us": round(quantile_us(bare.samples, 0.9), 1),
        "gated_mean_us": round(statistics.fmean(gated.samples) / 1000, 1),
        "bare_mean_us": round(statistics.fmean(bare.samples) / 1000, 1),
        "gated_amortized_us": round(sum(gated.batch_ns) / (rounds * BATCH) / 1000, 1),
        "bare_amortized_us": round(sum(bare.batch_ns) / (rounds * BATCH) / 1000, 1),
        "round_ratio_min": round(min(per_round), 3),
        "round_ratio_max": round(max(per_round), 3),
        "errors": gated.errors + bare.errors,
    }
    result["ratio"] = round(result["gated_median_us"] / result["bare_median_us"], 3)
    result["ratio_amortized"] = round(result["gated_amortized_us"] / result["bare_amortized_us"], 3)
    result["target"] = TARGET_CALL_RATIO
    result["meets_target"] = result["ratio"] <= TARGET_CALL_RATIO
    return result, gated


async def profile_gated(app: Any, actor: Any, arguments: dict[str, Any], calls: int) -> str:
    import cProfile
    import io
    import pstats

    from mcp import Client

    from mcp_knecht.transports.mcp_server import build_mcp_server

    server = build_mcp_server(app.gate, lambda ctx: actor)
    async with Client(server) as client:
        for _ in range(200):
            await client.call_tool(TOOL, arguments)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(calls):
            await client.call_tool(TOOL, arguments)
        await app.audit.flush()
        profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(25)
    print(f"--- our code, by cumulative time (for {calls} calls; coroutines count once per resumption)",
          file=out)
    stats.sort_stats("cumulative").print_stats(r"mcp_knecht|canonical|dataclasses.py:.*asdict|hashlib", 30)
    return out.getvalue()


# Steps timed where they run (`--steps`): a step costs several times more inside a call — after the
# handler's hop to the database thread, its code and data are out of the CPU caches — than in a loop.
# A call's arguments hash and audit entry are built when the audit log writes (`Gate._finish`).
STEPS = ("_look_up", "validate_arguments", "handler", "_render", "_finish")
WARM_STEPS = ("_look_up", "validate_arguments", "_render")


async def time_steps(app: Any, actor: Any, arguments: dict[str, Any], calls: int) -> dict[str, Any]:
    """Median µs of each gate step inside `calls` gated calls (mode auto), and of the same call warm."""
    from mcp import Client

    from mcp_knecht.core import gate as gate_module
    from mcp_knecht.transports.mcp_server import build_mcp_server

    gate, tool = app.gate, app.registry.get(TOOL)
    samples: dict[str, list[int]] = {name: [] for name in ("call_tool", *STEPS)}
    last: dict[str, tuple[Any, ...]] = {}
    clock = time.perf_counter_ns

    def timed(name: str, step: Callable[..., Any]) -> Callable[..., Any]:
        def run(*a: Any, **k: Any) -> Any:
            t0 = clock()
            try:
                return step(*a, **k)
            finally:
                samples[name].append(clock() - t0)
                last[name] = (a, k)
        return run

    def timed_async(name: str, step: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def run(*a: Any, **k: Any) -> Any:
            t0 = clock()
            try:
                return await step(*a, **k)
            finally:
                samples[name].append(clock() - t0)
        return run

    originals = {name: getattr(gate, name) for name in ("_look_up", "_render", "_finish")}
    validate, handler, call_tool = gate_module.validate_arguments, tool.handler, gate.call_tool
    try:
        for name, step in originals.items():
            setattr(gate, name, timed(name, step))
        gate_module.validate_arguments = timed("validate_arguments", validate)
        object.__setattr__(tool, "handler", timed_async("handler", handler))
        gate.call_tool = timed_async("call_tool", call_tool)
        async with Client(build_mcp_server(gate, lambda ctx: actor)) as client:
            for _ in range(calls):
                await client.call_tool(TOOL, arguments)
    finally:
        for name, step in originals.items():
            setattr(gate, name, step)
        gate_module.validate_arguments = validate
        object.__setattr__(tool, "handler", handler)
        del gate.call_tool
    warm_steps = {**originals, "validate_arguments": validate}
    steps = []
    for name in ("call_tool", *STEPS):
        in_call = samples[name][calls // 10:]  # the first calls warm up
        row: dict[str, Any] = {"step": name, "in_call_us": round(median_us(in_call), 1)}
        if name in WARM_STEPS:
            a, k = last[name]
            step = warm_steps[name]
            runs = []
            for _ in range(2000):
                t0 = clock()
                step(*a, **k)
                runs.append(clock() - t0)
            row["warm_us"] = round(median_us(runs[200:]), 1)
        steps.append(row)
    return {"calls": calls, "steps": steps}


async def phase_in_memory(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    from mcp_knecht.app import open_app
    from mcp_knecht.cli.startup_heap import collect_later, serving
    from mcp_knecht.core.settings import load_settings
    from mcp_knecht.store.audit_log import verify_chain

    _, actor = mint(env, "bench", "readonly")
    results: dict[str, Any] = {"modes": []}
    collect_later()  # the heap as `mcp-knecht serve` keeps it (both sides share this process)
    async with open_app(load_settings(env=env)) as app:
        serving()
        arguments = json.loads(args.arguments) if args.arguments else await default_arguments(app)
        results["tool"], results["arguments"] = TOOL, arguments
        gated_calls = 0
        for mode in ("auto", "legacy"):
            progress(f"in-memory tools/call, mode {mode}: {args.calls} calls per side, batches of {BATCH}")
            result, gated = await in_memory(app, actor, arguments, mode, args.calls, args.warmup,
                                            scrub=not args.without_scrubber)
            gated_calls += gated.calls + 1  # + the comparison call
            results["modes"].append(result)
        if args.profile:
            progress(f"cProfile of {args.profile} gated calls (mode auto)")
            results["profile"] = await profile_gated(app, actor, arguments, args.profile)
            gated_calls += args.profile + 200
        if args.steps:
            progress(f"timing the gate's steps inside {args.steps} gated calls (mode auto)")
            results["steps"] = await time_steps(app, actor, arguments, args.steps)
            gated_calls += args.steps
        await app.audit.flush()
        row = await app.db.fetch_one(
            "SELECT COUNT(*) AS n FROM audit_log WHERE subject = ? AND tool = ? AND outcome = 'ran'",
            (actor.subject, TOOL),
        )
        progress("verifying the audit hash chain")
        problems = await verify_chain(app.db, app.audit.chain)
    results["audit"] = {
        "rows_written": row["n"] if row else 0,
        "gated_calls": gated_calls,
        "chain_problems": len(problems),
    }
    return results


# --- phase 2: stdio cold start -----------------------------------------------------------------


def _line(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
    "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "0"},
    "io.modelcontextprotocol/clientCapabilities": {},
}
MODERN_REQUESTS = _line({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": MODERN_META}})
LEGACY_REQUESTS = b"".join([
    _line({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": LEGACY_VERSION, "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}}),
    _line({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    _line({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
])


class StartFailed(Exception):
    pass


def spawn_once(command: list[str], env: dict[str, str], requests: bytes, want: int, stderr_path: Path, *,
               timeout: float = START_TIMEOUT,
               on_answer: Callable[[subprocess.Popen[bytes]], None] | None = None) -> dict[int, float]:
    """Spawn, write `requests`, return {response id: seconds since spawn} until id `want` arrives;
    `on_answer(process)` is called the moment it does (`bench_instructions.py` stops the count there)."""
    seen: dict[int, float] = {}
    with open(stderr_path, "wb") as errors:
        t0 = time.perf_counter()
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
                                env=env, cwd=str(stderr_path.parent))
        try:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(requests)
            proc.stdin.flush()
            fd = proc.stdout.fileno()
            buffer = b""
            with selectors.DefaultSelector() as selector:
                selector.register(fd, selectors.EVENT_READ)
                while want not in seen:
                    if not selector.select(timeout=max(0.0, t0 + timeout - time.perf_counter())):
                        raise StartFailed(f"no response within {timeout}s")
                    chunk = os.read(fd, 65536)
                    now = time.perf_counter() - t0
                    if not chunk:
                        raise StartFailed("the server closed stdout before answering")
                    buffer += chunk
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        message = json.loads(line)
                        if "result" not in message:
                            raise StartFailed(f"error response: {line[:300]!r}")
                        if "tools" in message["result"] and not message["result"]["tools"]:
                            raise StartFailed("tools/list answered with no tools")
                        seen[message["id"]] = now
            if on_answer is not None:
                on_answer(proc)
            proc.stdin.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        except BaseException as exc:
            proc.kill()
            proc.wait()
            if isinstance(exc, StartFailed):
                tail = stderr_path.read_text(errors="replace")[-2000:]
                raise StartFailed(f"{' '.join(command)}: {exc}\n{tail}") from None
            raise
    return seen


def server_commands(tmp: Path) -> dict[str, list[str]]:
    knecht = Path(sys.executable).parent / "mcp-knecht"
    if not knecht.exists():
        found = shutil.which("mcp-knecht")
        if found is None:
            raise SystemExit("bench: the mcp-knecht command is not installed (pip install -e .)")
        knecht = Path(found)
    return {"gated": [str(knecht), "serve"], "bare": [sys.executable, str(BARE_SERVER)]}


def child_env(env: dict[str, str], token: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "VIRTUAL_ENV")}
    return {**keep, **env, "KNECHT_TOKEN": token}


def phase_cold_start(args: argparse.Namespace, env: dict[str, str], tmp: Path) -> dict[str, Any]:
    token, _ = mint(env, "bench", "readonly")
    environment = child_env(env, token)
    commands = server_commands(tmp)
    environments = {name: environment for name in commands}
    if args.compare:  # the same command, importing mcp_knecht from another checkout
        commands["compare"] = commands["gated"]
        environments["compare"] = {**environment, "PYTHONPATH": str(Path(args.compare).resolve())}
    times: dict[tuple[str, str], list[float]] = {}
    progress(f"stdio cold start: {args.starts} starts per server and protocol, interleaved")
    # One unrecorded start each: page cache and .pyc files warm for both.
    for name, command in commands.items():
        spawn_once(command, environments[name], MODERN_REQUESTS, 1, tmp / f"{name}.stderr")
    for i in range(args.starts):
        order = list(commands.items()) if i % 2 == 0 else list(commands.items())[::-1]
        for name, command in order:
            seen = spawn_once(command, environments[name], MODERN_REQUESTS, 1, tmp / f"{name}.stderr")
            times.setdefault((name, "modern_tools_list"), []).append(seen[1])
            seen = spawn_once(command, environments[name], LEGACY_REQUESTS, 2, tmp / f"{name}.stderr")
            times.setdefault((name, "legacy_initialize"), []).append(seen[1])
            times.setdefault((name, "legacy_tools_list"), []).append(seen[2])
    result: dict[str, Any] = {"starts": args.starts, "commands": commands, "compare": args.compare, "measures": []}
    for measure in ("modern_tools_list", "legacy_initialize", "legacy_tools_list"):
        gated = statistics.median(times[("gated", measure)]) * 1000
        bare = statistics.median(times[("bare", measure)]) * 1000
        row = {
            "measure": measure,
            "gated_median_ms": round(gated, 1),
            "bare_median_ms": round(bare, 1),
            "gated_min_ms": round(min(times[("gated", measure)]) * 1000, 1),
            "bare_min_ms": round(min(times[("bare", measure)]) * 1000, 1),
            "ratio": round(gated / bare, 3),
            "target": TARGET_START_RATIO,
            "meets_target": gated / bare <= TARGET_START_RATIO,
        }
        if args.compare:
            compared = statistics.median(times[("compare", measure)]) * 1000
            row.update(compare_median_ms=round(compared, 1), compare_ratio=round(compared / bare, 3))
        result["measures"].append(row)
    return result


# --- optional: import time ---------------------------------------------------------------------


def _import_times(command: list[str], environment: dict[str, str], tmp: Path) -> dict[str, tuple[int, int, int]]:
    """{module: (self µs, cumulative µs, depth)} from `python -X importtime` of a server start."""
    proc = subprocess.run([sys.executable, "-X", "importtime", *command], input=MODERN_REQUESTS,
                          capture_output=True, env=environment, cwd=str(tmp), timeout=60)
    modules: dict[str, tuple[int, int, int]] = {}
    for line in proc.stderr.decode(errors="replace").splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cumulative_us, name = line[len("import time:"):].split("|", 2)
        depth = (len(name) - len(name.lstrip(" "))) // 2
        modules[name.strip()] = (int(self_us), int(cumulative_us), depth)
    return modules


def phase_import_time(env: dict[str, str], tmp: Path, top: int = 15) -> dict[str, Any]:
    progress("python -X importtime of both servers' start-up")
    token, _ = mint(env, "bench", "readonly")
    environment = child_env(env, token)
    knecht = _import_times(["-m", "mcp_knecht.cli.main", "serve"], environment, tmp)
    bare = _import_times([str(BARE_SERVER)], environment, tmp)
    extra = {name: times for name, times in knecht.items() if name not in bare}
    # Attribute each extra module to its top-level package for a per-package total.
    packages: dict[str, int] = {}
    for name, (self_us, _, _) in extra.items():
        packages[name.split(".")[0]] = packages.get(name.split(".")[0], 0) + self_us
    return {
        "knecht_total_ms": round(sum(t[0] for t in knecht.values()) / 1000, 1),
        "bare_total_ms": round(sum(t[0] for t in bare.values()) / 1000, 1),
        "extra_total_ms": round(sum(t[0] for t in extra.values()) / 1000, 1),
        "extra_modules": len(extra),
        "top_cumulative": [
            {"module": n, "cumulative_ms": round(t[1] / 1000, 1), "depth": t[2]}
            for n, t in sorted(knecht.items(), key=lambda kv: -kv[1][1])[:top]
        ],
        "extra_by_package_ms": [
            {"package": p, "self_ms": round(us / 1000, 1)}
            for p, us in sorted(packages.items(), key=lambda kv: -kv[1])[:top]
        ],
        "extra_top_self": [
            {"module": n, "self_ms": round(t[0] / 1000, 1)}
            for n, t in sorted(extra.items(), key=lambda kv: -kv[1][0])[:top]
        ],
    }


# --- optional: class creation ---------------------------------------------------------------------


CLASS_TIMER = REPO / "scripts" / "class_timer.py"


def phase_classes(env: dict[str, str], tmp: Path, runs: int = 5) -> dict[str, Any]:
    """Median milliseconds each server's start (to its first `tools/list`, then stdin closes) spent
    creating dataclasses and pydantic models, ours and the SDK's (`scripts/class_timer.py`)."""
    progress(f"class creation during start-up: {runs} starts per server")
    token, _ = mint(env, "bench", "readonly")
    environment = child_env(env, token)
    targets = {"gated": ["-m", "mcp_knecht.cli.main", "serve"], "bare": [str(BARE_SERVER)]}
    result: dict[str, Any] = {"runs": runs}
    reported: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
    for run in range(runs):  # interleaved, so that drift hits both alike
        for name, target in (list(targets.items()) if run % 2 == 0 else list(targets.items())[::-1]):
            out = tmp / f"classes-{name}-{run}.json"
            spawn_once([sys.executable, str(CLASS_TIMER), str(out), *target], environment, MODERN_REQUESTS, 1,
                       tmp / f"{name}.stderr")
            if not out.exists():  # killed because it did not exit after its answer: no report at exit
                raise StartFailed(f"{name}: the server did not exit when stdin closed; no class report")
            reported[name].append(json.loads(out.read_text()))
    for name, reports in reported.items():
        side: dict[str, Any] = {"process_ms": round(statistics.median(r["process_ms"] for r in reports), 1)}
        for kind in ("dataclass", "pydantic"):
            for owner in ("ours", "others"):
                counts = [r[kind].get(owner, {"classes": 0, "ms": 0.0}) for r in reports]
                side[f"{kind}_{owner}"] = {"classes": counts[0]["classes"],
                                           "ms": round(statistics.median(c["ms"] for c in counts), 1)}
        result[name] = side
    return result


# --- report ------------------------------------------------------------------------------------


def _mark(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def print_report(report: dict[str, Any]) -> None:
    print(f"mcp-knecht gate benchmark  (python {report['python']}, {report['cpus']} cpus, "
          f"demo db: {report['demo']})")
    memory = report.get("in_memory")
    if memory:
        print(f"\n1. in-memory tools/call {memory['tool']} {json.dumps(memory['arguments'])}  (µs per call)")
        print(f"   {'protocol':<11} {'calls':>6} {'gated':>8} {'bare':>8} {'ratio':>6}  {'p90 g/b':>13}  "
              f"{'amortized g/b (+flush)':>24}  round ratios   target")
        for m in memory["modes"]:
            print(f"   {m['protocol']:<11} {m['calls_per_side']:>6} {m['gated_median_us']:>8.1f} "
                  f"{m['bare_median_us']:>8.1f} {m['ratio']:>6.3f}  "
                  f"{m['gated_p90_us']:>6.0f}/{m['bare_p90_us']:<6.0f}  "
                  f"{m['gated_amortized_us']:>9.1f}/{m['bare_amortized_us']:<7.1f} = {m['ratio_amortized']:.3f}  "
                  f"{m['round_ratio_min']:.2f}..{m['round_ratio_max']:.2f}   "
                  f"≤{m['target']} {_mark(m['meets_target'])}")
        audit = memory["audit"]
        print(f"   audit rows written: {audit['rows_written']} for {audit['gated_calls']} gated calls; "
              f"hash chain problems: {audit['chain_problems']}")
    cold = report.get("cold_start")
    if cold:
        print(f"\n2. stdio cold start, spawn → response  (ms, median of {cold['starts']}; min in brackets)")
        for m in cold["measures"]:
            print(f"   {m['measure']:<18} gated {m['gated_median_ms']:>7.1f} ({m['gated_min_ms']:.0f})  "
                  f"bare {m['bare_median_ms']:>7.1f} ({m['bare_min_ms']:.0f})  ratio {m['ratio']:.3f}  "
                  f"≤{m['target']} {_mark(m['meets_target'])}")
            if "compare_median_ms" in m:
                print(f"   {'':<18} {cold['compare']}: {m['compare_median_ms']:>7.1f}  ratio {m['compare_ratio']:.3f}")
    imports = report.get("import_time")
    if imports:
        print(f"\n3. -X importtime: mcp-knecht serve {imports['knecht_total_ms']} ms of imports, bare "
              f"{imports['bare_total_ms']} ms; {imports['extra_modules']} extra modules, "
              f"{imports['extra_total_ms']} ms (self times, inflated by the instrumentation)")
        print("   extra, by top-level package: " + ", ".join(
            f"{p['package']} {p['self_ms']}" for p in imports["extra_by_package_ms"]))
        print("   extra, slowest modules (self ms): " + ", ".join(
            f"{m['module']} {m['self_ms']}" for m in imports["extra_top_self"]))
        print("   top cumulative: " + ", ".join(
            f"{m['module']} {m['cumulative_ms']}" for m in imports["top_cumulative"]))
    classes = report.get("classes")
    if classes:
        print(f"\n3b. class creation during start-up (ms, median of {classes['runs']}; classes in brackets)")
        for name in ("gated", "bare"):
            side = classes[name]
            print(f"   {name:<5}  process {side['process_ms']:>7.1f}  " + "  ".join(
                f"{key.replace('_', ' ')} {side[key]['ms']:>6.1f} ({side[key]['classes']})"
                for key in ("dataclass_ours", "pydantic_ours", "dataclass_others", "pydantic_others")))
    if memory and memory.get("steps"):
        print(f"\n5. the gate's steps, median µs inside {memory['steps']['calls']} calls and called in a loop (warm)")
        for row in memory["steps"]["steps"]:
            warm = f"{row['warm_us']:>7.1f}" if "warm_us" in row else "      -"
            print(f"   {row['step']:<20} in call {row['in_call_us']:>7.1f}   warm {warm}")
    if memory and memory.get("profile"):
        print("\n4. cProfile of gated calls (tottime)\n" + memory["profile"])
    print(f"\ntotal {report['seconds']:.1f} s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=4000, help="measured calls per side and protocol")
    parser.add_argument("--warmup", type=int, default=400, help="unrecorded calls per side first")
    parser.add_argument("--starts", type=int, default=15, help="cold starts per server and protocol")
    parser.add_argument("--arguments", metavar="JSON", help=f"{TOOL} arguments (default: the first project)")
    parser.add_argument("--skip", choices=("calls", "starts"), action="append", default=[],
                        help="leave out a phase (repeatable)")
    parser.add_argument("--compare", metavar="CHECKOUT",
                        help="also cold-start another checkout's server (say, a git worktree of an earlier "
                             "commit), interleaved with the two")
    parser.add_argument("--importtime", action="store_true", help="also report start-up import times")
    parser.add_argument("--classes", action="store_true",
                        help="also report the start-up time spent creating dataclasses and pydantic models")
    parser.add_argument("--profile", type=int, metavar="N", default=0, help="also cProfile N gated calls")
    parser.add_argument("--steps", type=int, metavar="N", default=0,
                        help="also time the gate's steps inside N gated calls, and warm in a loop")
    parser.add_argument("--without-scrubber", action="store_true",
                        help="gated side without output scrubbing: the cost of the gate's own steps")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import secrets

    import anyio

    args = parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="knecht-bench-") as folder:
        tmp = Path(folder)
        env = bench_env(tmp, secrets.token_urlsafe(48))
        progress(f"demo data into {env['KNECHT_DATABASE_URL']}")
        demo = anyio.run(fill_database, env["KNECHT_DATABASE_URL"])
        report: dict[str, Any] = {
            "python": sys.version.split()[0], "cpus": os.cpu_count(), "demo": demo,
        }
        failed = False
        if "calls" not in args.skip:
            memory = anyio.run(phase_in_memory, args, env)
            report["in_memory"] = memory
            audit = memory["audit"]
            failed |= any(m["errors"] for m in memory["modes"])
            failed |= audit["rows_written"] != audit["gated_calls"] or audit["chain_problems"] > 0
        if "starts" not in args.skip:
            try:
                report["cold_start"] = phase_cold_start(args, env, tmp)
            except StartFailed as exc:
                progress(f"cold start failed: {exc}")
                failed = True
        if args.importtime:
            report["import_time"] = phase_import_time(env, tmp)
        if args.classes:
            try:
                report["classes"] = phase_classes(env, tmp)
            except StartFailed as exc:
                progress(f"class report failed: {exc}")
                failed = True
        report["seconds"] = round(time.perf_counter() - started, 1)
    return show(report, print_report, as_json=args.json, failed=failed)


def show(report: dict[str, Any], table: Callable[[dict[str, Any]], None], *, as_json: bool, failed: bool) -> int:
    """Print `report` as one JSON document or as `table` prints it; the exit status (1: something failed)."""
    if as_json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        table(report)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

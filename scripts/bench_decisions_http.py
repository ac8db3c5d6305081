"""Decisions per second through the HTTP decision API with racing operator clients, and double executions.

    python scripts/bench_decisions_http.py [--proposals 400] [--clients 8] [--order lockstep|shuffled]
                                           [--db URL] [--json]
    python scripts/bench_decisions_http.py --proposals 200 --order shuffled
    python scripts/bench_decisions_http.py --db postgresql://postgres@127.0.0.1:5432/scratch --json

Stages N proposals of the test write tool `record_effect` (its effect inserts one row into
`test_effects`), starts the real server (`mcp-knecht serve --transport http`), then K client
processes, each with its own operator token (profile `operator`, subject `operator-<i>`) and one
keep-alive connection (`http.client`), try to approve every proposal with `POST /api/proposals/{id}/approve`:
`lockstep` (all in id order, the worst case) or `shuffled` (each in its own seeded random order).
Clients connect first and wait for a common start signal, so process start-up is not timed; each
reports its first-request and last-response `perf_counter` stamps (one clock across processes on
Linux), and the race lasts from the earliest start to the latest end.

A lost race answers 409 `not_pending` and counts as "lost"; any other non-2xx answer is an HTTP
error. Effects per label are counted in the database: double executions and missing ones must be 0.
Baseline in the same run: one client alone over N fresh proposals, through the same server; and
for reference one in-process approver (`tests.approver_worker`) over another N. Then the K clients
go over the raced proposals once more ("late": every answer a 409), which prices a lost attempt
alone: a race's server CPU per decision is about the baseline's plus K-1 of these, and what it
costs beyond that is the queueing.
The server's CPU seconds (utime+stime from /proc) during each phase show whether it was CPU-bound.

With `--floor`, the same clients then race against a bare Starlette app on the same uvicorn
settings (uvloop, httptools) that only remembers which ids it has answered: no authentication, no
store, no decision. What they reach there is the most the decision API could do on this machine,
whatever a decision cost.

Target: ≥ 500 decided-and-executed proposals/s with 8 racing clients, 0 double executions, 0 missing.
Exit status 0 even when the target is missed (this is a measurement); 1 when something did not
work (HTTP errors, double executions, missing effects, a client or the server failing).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_http import cpu_seconds  # noqa: E402

TARGET_DECISIONS_PER_S = 500.0
START_TIMEOUT = 30.0
CLIENT_TIMEOUT = 900.0
SEED = 20240611
WORKER_FLAG = "--client-worker"
FLOOR_SERVER_FLAG = "--floor-server"
TOKEN_VARIABLE = "BENCH_OPERATOR_TOKEN"


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# --- one racing client (a subprocess of this script) -------------------------------------------


def _classify(status_code: int, text: str) -> tuple[str, str]:
    """("won" | "recorded" | "lost" | "error", detail) of one approve answer."""
    try:
        body = json.loads(text)
    except ValueError:
        body = {}
    if status_code == 200:
        status = body.get("status", "?")
        return ("recorded" if status == "pending" else "won"), status
    error = body.get("error", {}) if isinstance(body, dict) else {}
    detail = f"{status_code} {error.get('code')}: {error.get('message', text[:200])}"
    if status_code == 409 and error.get("code") == "not_pending":
        return "lost", detail
    return "error", detail


def client_worker(name: str, base: str, first: int, last: int, order: str, seed: int) -> dict[str, Any]:
    """Connect, say "ready", wait for the go line on stdin, then try to approve every id.

    The client is the standard library's `http.client` on one keep-alive connection: about a tenth
    of httpx's CPU per request, which matters when eight of them share two cores with the server."""
    import http.client
    from urllib.parse import urlsplit

    ids = list(range(first, last + 1))
    if order == "shuffled":
        random.Random(f"{seed}-{name}").shuffle(ids)
    tally: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    samples: dict[str, str] = {}
    headers = {"Authorization": f"Bearer {os.environ[TOKEN_VARIABLE]}", "Content-Type": "application/json"}
    address = urlsplit(base)
    connection = http.client.HTTPConnection(address.hostname or "127.0.0.1", address.port, timeout=120.0)
    try:
        connection.request("GET", "/healthz")
        answer = connection.getresponse()
        answer.read()
        if answer.status != 200:
            raise SystemExit(f"/healthz answered {answer.status}")
        print("ready", flush=True)  # the keep-alive connection is open
        sys.stdin.readline()
        cpu_started, started = time.process_time(), time.perf_counter()
        for proposal_id in ids:
            try:
                connection.request("POST", f"/api/proposals/{proposal_id}/approve", body=b"{}", headers=headers)
                answer = connection.getresponse()
                kind, detail = _classify(answer.status, answer.read().decode("utf-8", "replace"))
            except (OSError, http.client.HTTPException) as exc:
                kind, detail = "error", f"{type(exc).__name__}: {exc}"
                connection.close()  # the next request reconnects
            tally[kind] += 1
            if kind == "won":
                statuses[detail] += 1
            samples.setdefault(kind, detail)
        ended = time.perf_counter()
    finally:
        connection.close()
    return {"client": name, "won": tally["won"], "recorded": tally["recorded"], "lost": tally["lost"],
            "errors": tally["error"], "won_statuses": dict(statuses), "samples": samples,
            "started": started, "ended": ended, "cpu_seconds": time.process_time() - cpu_started}


# --- the server --------------------------------------------------------------------------------


def start_server(env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    from tests.servers import free_port, knecht_executable

    port = free_port()
    server = subprocess.Popen(
        [knecht_executable(), "serve", "--transport", "http", "--host", "127.0.0.1", "--port", str(port)],
        env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=1) as response:
                if response.status == 200:
                    return server, base
        except OSError:
            time.sleep(0.1)
    stop_server(server)
    raise SystemExit(f"the server did not answer /healthz within {START_TIMEOUT:.0f} s")


def stop_server(server: subprocess.Popen[bytes]) -> int:
    server.send_signal(signal.SIGINT)
    try:
        return server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        return server.wait()


def mint_operators(env: dict[str, str], names: list[str]) -> dict[str, str]:
    """One `operator`-profile token per subject, signed with the key the server verifies with."""
    from mcp_knecht.core.auth import load_token_settings, mint_token
    from mcp_knecht.core.scopes import load_scopes
    from mcp_knecht.core.settings import load_settings

    settings = load_settings(env=env)
    token_settings = load_token_settings(settings, create_dev_secret=False)
    scopes = load_scopes(settings.scopes_dir).profile("operator").scopes
    return {name: mint_token(token_settings, subject=name, scopes=scopes, client="bench") for name in names}


# --- the race ----------------------------------------------------------------------------------


def race(env: dict[str, str], base: str, tokens: dict[str, str], id_range: tuple[int, int], order: str,
         server_pid: int) -> dict[str, Any]:
    """Start one client process per token, release them together, and collect their reports."""
    clients = {
        name: subprocess.Popen(
            [sys.executable, __file__, WORKER_FLAG, name, base, str(id_range[0]), str(id_range[1]), order, str(SEED)],
            env={**env, TOKEN_VARIABLE: token}, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        for name, token in tokens.items()
    }
    for name, client in clients.items():
        assert client.stdout is not None
        if client.stdout.readline().strip() != "ready":
            raise SystemExit(f"client {name} did not connect:\n{client.communicate()[1]}")
    cpu_before = cpu_seconds(server_pid)
    for client in clients.values():
        assert client.stdin is not None
        client.stdin.write("go\n")
        client.stdin.flush()
    reports = []
    for name, client in clients.items():
        out, err = client.communicate(timeout=CLIENT_TIMEOUT)
        if client.returncode != 0:
            raise SystemExit(f"client {name} failed:\n{err}")
        reports.append(json.loads(out.splitlines()[-1]))
    server_cpu = cpu_seconds(server_pid) - cpu_before
    seconds = max(r["ended"] for r in reports) - min(r["started"] for r in reports)
    return {"seconds": seconds, "server_cpu_seconds": server_cpu, "reports": reports}


def in_process(env: dict[str, str], id_range: tuple[int, int]) -> float:
    """Seconds one in-process approver (`tests.approver_worker`) takes over the range."""
    done = subprocess.run([sys.executable, "-m", "tests.approver_worker", "operator-inprocess", *map(str, id_range)],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=CLIENT_TIMEOUT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the in-process approver failed:\n{done.stderr}")
    return float(json.loads(done.stdout)["seconds"])


def floor_server(port: int) -> None:
    """The decision API with nothing behind it: the first approve of an id wins, the rest get 409."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    answered: set[int] = set()

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def approve(request: Request) -> JSONResponse:
        proposal_id = int(request.path_params["proposal_id"])
        await request.body()
        if proposal_id in answered:
            return JSONResponse({"error": {"code": "not_pending", "message": f"Proposal #{proposal_id} is not "
                                           "pending any more."}}, status_code=409)
        answered.add(proposal_id)
        return JSONResponse({"id": proposal_id, "status": "succeeded"})

    app = Starlette(routes=[Route("/healthz", healthz),
                            Route("/api/proposals/{proposal_id:int}/approve", approve, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", http="httptools",
                loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio")


def measure_floor(proposals: int, clients: int, order: str, folder: str) -> dict[str, Any]:
    from tests.servers import free_port

    port = free_port()
    log = Path(folder) / "floor.log"
    server = subprocess.Popen([sys.executable, __file__, FLOOR_SERVER_FLAG, str(port)], cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=log.open("w"))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                with urllib.request.urlopen(base + "/healthz", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit(f"the floor server did not start:\n{log.read_text()[-2000:]}") from None
                time.sleep(0.1)
        progress(f"floor: {clients} HTTP clients against a bare app…")
        raced = race(dict(os.environ), base, {f"floor-{i}": "none" for i in range(clients)}, (1, proposals), order,
                     server.pid)
    finally:
        stop_server(server)
    won = sum(r["won"] for r in raced["reports"])
    return {"floor_decisions_per_s": round(won / raced["seconds"], 1),
            "floor_requests_per_s": round(proposals * clients / raced["seconds"], 1),
            "floor_server_cpu_share": round(raced["server_cpu_seconds"] / raced["seconds"], 2),
            "floor_clients_cpu_seconds": round(sum(r["cpu_seconds"] for r in raced["reports"]), 2),
            "floor_errors": sum(r["errors"] for r in raced["reports"]), "floor_won": won}


def check(effects: dict[str, int], proposals: int) -> dict[str, int]:
    return {"executed": len(effects), "double_executions": sum(1 for n in effects.values() if n > 1),
            "missing": proposals - len(effects)}


def measure(env: dict[str, str], folder: str, proposals: int, clients: int, order: str) -> dict[str, Any]:
    import anyio
    from bench_approvals import _effects, _stage

    tag = f"http{int(time.time())}"
    load_before = round(os.getloadavg()[0], 2)
    batches = ("solo", "race", "inproc")
    progress(f"staging {len(batches) * proposals} proposals…")
    ranges = {batch: anyio.run(_stage, env, proposals, f"{tag}{batch}") for batch in batches}
    tokens = mint_operators(env, ["operator-solo", *(f"operator-{i}" for i in range(clients))])
    log = Path(folder) / "server.log"
    server, base = start_server(env, log)
    progress(f"server up at {base} (pid {server.pid})")
    try:
        progress("baseline: 1 HTTP client…")
        solo = race(env, base, {"operator-solo": tokens["operator-solo"]}, ranges["solo"], order, server.pid)
        progress(f"race: {clients} HTTP clients, {order}…")
        racers = {n: t for n, t in tokens.items() if n != "operator-solo"}
        raced = race(env, base, racers, ranges["race"], order, server.pid)
        progress(f"late: {clients} HTTP clients over the proposals just decided…")
        late = race(env, base, racers, ranges["race"], order, server.pid)
        progress("reference: 1 in-process approver…")
        inproc_seconds = in_process(env, ranges["inproc"])
    finally:
        server_exit = stop_server(server)
    effects = {batch: check(anyio.run(_effects, env, f"{tag}{batch}"), proposals) for batch in ("solo", "race")}
    log_text = log.read_text(errors="replace")
    return {"solo": solo, "race": raced, "late": late, "inproc_seconds": inproc_seconds, "effects": effects,
            "server_exit": server_exit, "server_tracebacks": log_text.count("Traceback"), "load_before": load_before}


def summarize(measured: dict[str, Any], url: str, proposals: int, clients: int, order: str) -> dict[str, Any]:
    solo, raced, effects = measured["solo"], measured["race"], measured["effects"]
    reports = raced["reports"]
    won = sum(r["won"] for r in reports)
    baseline = solo["reports"][0]["won"] / solo["seconds"]
    rate = won / raced["seconds"]
    errors = sum(r["errors"] for r in [*reports, *solo["reports"]])
    result = {
        "database": url.split("://")[0],
        "proposals": proposals,
        "clients": clients,
        "order": order,
        "baseline_decisions_per_s": round(baseline, 1),
        "baseline_server_cpu_share": round(solo["server_cpu_seconds"] / solo["seconds"], 2),
        "inprocess_decisions_per_s": round(proposals / measured["inproc_seconds"], 1),
        "race_seconds": round(raced["seconds"], 3),
        "race_decisions_per_s": round(rate, 1),
        "race_attempts_per_s": round(proposals * clients / raced["seconds"], 1),
        "ratio_race_to_baseline": round(rate / baseline, 2),
        "executed": effects["race"]["executed"],
        "double_executions": effects["race"]["double_executions"],
        "missing": effects["race"]["missing"],
        "baseline_double_executions": effects["solo"]["double_executions"],
        "baseline_missing": effects["solo"]["missing"],
        "wins_per_client": [r["won"] for r in reports],
        "lost_per_client": [r["lost"] for r in reports],
        "recorded": sum(r["recorded"] for r in reports),
        "won_statuses": dict(sum((Counter(r["won_statuses"]) for r in reports), Counter())),
        "http_errors": errors,
        "error_sample": next((r["samples"]["error"] for r in [*reports, *solo["reports"]] if "error" in r["samples"]),
                             None),
        "lost_race_answer": next((r["samples"]["lost"] for r in reports if "lost" in r["samples"]), None),
        "baseline_server_cpu_ms_per_decision": round(solo["server_cpu_seconds"] / max(proposals, 1) * 1000, 3),
        "race_server_cpu_ms_per_decision": round(raced["server_cpu_seconds"] / max(won, 1) * 1000, 3),
        "late_server_cpu_ms_per_request": round(
            measured["late"]["server_cpu_seconds"] / max(proposals * clients, 1) * 1000, 3),
        "late_requests_per_s": round(proposals * clients / measured["late"]["seconds"], 1),
        "late_unexpected": sum(r["won"] + r["recorded"] + r["errors"] for r in measured["late"]["reports"]),
        "server_cpu_seconds": round(raced["server_cpu_seconds"], 2),
        "server_cpu_share": round(raced["server_cpu_seconds"] / raced["seconds"], 2),
        "clients_cpu_seconds": round(sum(r["cpu_seconds"] for r in reports), 2),
        "server_exit": measured["server_exit"],
        "server_tracebacks": measured["server_tracebacks"],
        "cores": os.cpu_count(),
        "load_average_before": measured["load_before"],
        "target_decisions_per_s": TARGET_DECISIONS_PER_S,
    }
    result["target_met"] = (rate >= TARGET_DECISIONS_PER_S and not result["double_executions"]
                            and not result["missing"] and not errors)
    return result


def run(proposals: int, clients: int, order: str, db_url: str | None, floor: bool = False) -> dict[str, Any]:
    from bench_approvals import _env

    with tempfile.TemporaryDirectory() as folder:
        url = db_url or f"sqlite:///{folder}/bench.db"
        env = {**_env(url, folder), "KNECHT_JWT_SECRET": secrets.token_urlsafe(48)}
        progress(f"store {url.split('@')[-1]}")
        measured = measure(env, folder, proposals, clients, order)
        result = summarize(measured, url, proposals, clients, order)
        if floor:
            result.update(measure_floor(proposals, clients, order, folder))
    return result


def failed(result: dict[str, Any]) -> bool:
    return bool(result["http_errors"] or result.get("floor_errors") or result["double_executions"] or result["missing"]
                or result["baseline_double_executions"] or result["baseline_missing"] or result["recorded"]
                or result["server_tracebacks"] or result["late_unexpected"])


def report(result: dict[str, Any]) -> None:
    k = result["clients"]
    print(f"store                     {result['database']}  ({result['proposals']} proposals, {result['order']}, "
          f"{result['cores']} cores, load {result['load_average_before']} before)")
    print(f"baseline (1 HTTP client)  {result['baseline_decisions_per_s']:>8} decisions/s  "
          f"(server CPU {result['baseline_server_cpu_share']:.0%} of a core, "
          f"{result['baseline_server_cpu_ms_per_decision']} ms per decision)")
    print(f"in-process (1 approver)   {result['inprocess_decisions_per_s']:>8} decisions/s")
    print(f"race ({k} HTTP clients)    {result['race_decisions_per_s']:>8} decisions/s  "
          f"({result['race_attempts_per_s']} attempts/s, ratio {result['ratio_race_to_baseline']}x, "
          f"target ≥ {result['target_decisions_per_s']:.0f}: {'met' if result['target_met'] else 'MISSED'})")
    print(f"race time                 {result['race_seconds']} s; server CPU {result['server_cpu_seconds']} s "
          f"({result['server_cpu_share']:.0%} of a core, {result['race_server_cpu_ms_per_decision']} ms per "
          f"decision), clients CPU {result['clients_cpu_seconds']} s")
    print(f"late ({k} HTTP clients)    {result['late_requests_per_s']:>8} requests/s over decided proposals  "
          f"(server CPU {result['late_server_cpu_ms_per_request']} ms per request)")
    print(f"wins per client           {result['wins_per_client']}")
    print(f"executed                  {result['executed']} of {result['proposals']}  {result['won_statuses']}")
    print(f"double executions         {result['double_executions']}")
    print(f"missing                   {result['missing']}")
    print(f"HTTP errors               {result['http_errors']}" +
          (f"  e.g. {result['error_sample']}" if result["error_sample"] else ""))
    print(f"lost race answered        {result['lost_race_answer']}")
    if "floor_decisions_per_s" in result:
        print(f"floor (bare app, same clients) {result['floor_decisions_per_s']:>8} decisions/s  "
              f"({result['floor_requests_per_s']} requests/s; server CPU {result['floor_server_cpu_share']:.0%} of a "
              f"core, clients CPU {result['floor_clients_cpu_seconds']} s)")
    if result["server_tracebacks"] or result["server_exit"]:
        print(f"server                    exit {result['server_exit']}, {result['server_tracebacks']} tracebacks")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == FLOOR_SERVER_FLAG:
        floor_server(int(sys.argv[2]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == WORKER_FLAG:
        name, base, first, last, order, seed = sys.argv[2:8]
        print(json.dumps(client_worker(name, base, int(first), int(last), order, int(seed))))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--proposals", type=int, default=400)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--order", choices=("lockstep", "shuffled"), default="lockstep")
    parser.add_argument("--db", help="database URL (default: a temporary SQLite file)")
    parser.add_argument("--floor", action="store_true",
                        help="also race the same clients against a bare app with no decision behind it")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.proposals, args.clients, args.order, args.db, floor=args.floor)
    if args.json:
        print(json.dumps(result))
    else:
        report(result)
    sys.exit(1 if failed(result) else 0)


if __name__ == "__main__":
    main()

"""Notifications: does a dead webhook slow the gate or a decision? And how fast does the worker
deliver?

    python scripts/bench_notify.py                      # SQLite and PostgreSQL, ~1-2 minutes
    python scripts/bench_notify.py --stores sqlite --calls 200 --events 500 --json

1. Latency (median and p95, milliseconds) of a gate call that stages a proposal, and of a
   decision (approve, which includes the execution, alternating with reject), measured in a
   server process (`open_app` as `serve` runs it: the delivery worker in the same event loop) with
   - `no-outbox`: the repository without the status hook (the server before notifications),
   - `outbox-only`: the outbox row written, no worker (the cost of the row itself),
   - `none`: the outbox written and routed by the worker, no destination configured,
   - `live`: KNECHT_WEBHOOK_URL on a local receiver that answers 200,
   - `dead-refused`: KNECHT_WEBHOOK_URL on a closed port (every attempt refused at once),
   - `dead-hanging`: KNECHT_WEBHOOK_URL on a port that accepts and never answers (10 s timeout:
     every delivery slot stuck),
   all with the default delivery settings.
   Variants run in rounds (each round every variant once, in turn) and samples are pooled, so
   drift of the machine hits them alike. Calls come `--pace` seconds apart (the worker delivers
   in the gaps, as between a real server's requests). Ratios are against `none`; "attempts
   meanwhile" counts the delivery attempts made while the calls were measured.
2. Throughput: N proposals staged with no worker running (N pending events), then one worker
   (`run`, as in the server; concurrency 8) delivers them to a local receiver (its own process)
   that verifies every signature with `standardwebhooks` and answers 200: events per second,
   from the worker's start to the receiver holding the last one.

Receiver, server and database share this machine's cores; compare the variants with each other.
PostgreSQL: a database `knecht_bench_<random>` through KNECHT_BENCH_POSTGRES_URL (default the
local trust-auth server, database `test`), dropped afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import mcp_knecht.app as app_module  # noqa: E402
from mcp_knecht.app import open_app  # noqa: E402
from mcp_knecht.core.actor import Actor  # noqa: E402
from mcp_knecht.core.approval import Operator  # noqa: E402
from mcp_knecht.core.settings import load_settings  # noqa: E402
from tests.receivers import new_webhook_secret  # noqa: E402
from tests.staging import make_config  # noqa: E402
from tests.toolsets import EFFECTS_TABLE  # noqa: E402

ADMIN_URL = os.environ.get("KNECHT_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
TOOLSETS = "tests.toolsets:toolset"
AGENT = frozenset({"runs:write", "proposals:read"})
VARIANTS = ("no-outbox", "outbox-only", "none", "live", "dead-refused", "dead-hanging")


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # the default 5 drops concurrent connects (a 1 s SYN retry each)
    daemon_threads = True


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# --- endpoints -----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def hanging_endpoint() -> Iterator[str]:
    """Accepts connections (the kernel completes the handshake) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/hook"
    finally:
        sock.close()


class Counts:
    """Deliveries the receiver process verified and refused, shared with this process."""

    def __init__(self, context: Any) -> None:
        self._verified = context.Value("i", 0)
        self._refused = context.Value("i", 0)
        self.port = 0

    @property
    def verified(self) -> int:
        return int(self._verified.value)

    @property
    def refused(self) -> int:
        return int(self._refused.value)


def _serve_receiver(secret: str, sock: socket.socket, counts: Counts) -> None:
    from standardwebhooks import Webhook

    verifier = Webhook(secret)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            try:
                verifier.verify(body, dict(self.headers.items()))
                ok = True
            except Exception:
                ok = False
            counter = counts._verified if ok else counts._refused
            with counter.get_lock():
                counter.value += 1
            self.send_response(200 if ok else 401)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = _Server(("127.0.0.1", 0), Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.server_activate()
    server.serve_forever()


@contextmanager
def verifying_receiver(secret: str) -> Iterator[Counts]:
    """A receiver in its own process (so that its work does not share this process's GIL) that
    verifies every signature with `standardwebhooks`: 200 if good, 401 if not."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    counts = Counts(context)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    counts.port = sock.getsockname()[1]
    process = context.Process(target=_serve_receiver, args=(secret, sock, counts), daemon=True)
    process.start()
    sock.close()
    try:
        yield counts
    finally:
        process.terminate()
        process.join(5)


# --- stores --------------------------------------------------------------------------------------


async def _admin(sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(ADMIN_URL, timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@contextmanager
def store(kind: str, folder: Path, name: str) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{folder / f'{name}.db'}"
        return
    database = f"knecht_bench_{secrets.token_hex(4)}"
    anyio.run(_admin, f'CREATE DATABASE "{database}"')
    try:
        yield ADMIN_URL.rsplit("/", 1)[0] + f"/{database}"
    finally:
        anyio.run(_admin, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def _env(url: str, folder: Path, knecht_toml: str, webhook: str | None, secret: str) -> dict[str, str]:
    config = make_config(folder / "config")
    (config / "knecht.toml").write_text(knecht_toml, encoding="utf-8")
    env = {"KNECHT_DATABASE_URL": url, "KNECHT_DATA_DIR": str(folder / "data"), "KNECHT_CONFIG_DIR": str(config),
           "KNECHT_TOOLSETS": TOOLSETS, "KNECHT_JWT_SECRET": secrets.token_urlsafe(32)}
    if webhook:
        env |= {"KNECHT_WEBHOOK_URL": webhook, "KNECHT_WEBHOOK_SECRET": secret}
    return env


# --- 1. latency ----------------------------------------------------------------------------------


async def _measure(env: dict[str, str], calls: int, variant: str, pace: float) -> tuple[list[float], list[float], int]:
    """Stage `calls` proposals and decide each; the worker runs as in `serve` (unless switched off)."""
    real_writer, real_worker = app_module.OutboxWriter, app_module.notification_worker
    outbox = variant != "no-outbox"
    if not outbox:
        app_module.OutboxWriter = lambda scrub: None  # type: ignore[assignment,misc,return-value]
    if variant == "outbox-only":
        app_module.notification_worker = lambda app: None  # type: ignore[assignment,return-value]
    try:
        async with open_app(load_settings(env=env), watch_policy=True) as app:
            async with app.db.transaction() as tx:
                await tx.execute(EFFECTS_TABLE)
            service, operator = app.approvals, Operator("bench-operator", verified=True)
            agent = Actor("bench-agent", "bench", AGENT)
            stage_ms, decide_ms = [], []
            for n in range(calls):
                started = time.perf_counter()
                staged = await app.gate.call_tool(agent, "record_effect", {"label": f"e{n}"})
                stage_ms.append((time.perf_counter() - started) * 1000)
                proposal_id = staged.data["id"]  # type: ignore[index]
                started = time.perf_counter()
                if n % 2:
                    await service.reject(proposal_id, operator, "benchmark")
                else:
                    await service.approve(proposal_id, operator)
                decide_ms.append((time.perf_counter() - started) * 1000)
                await anyio.sleep(pace)  # calls arrive with gaps, in which the worker delivers
            row = await app.db.fetch_one("SELECT COALESCE(SUM(attempts), 0) AS n FROM notify_deliveries") \
                if outbox else {"n": 0}
            return stage_ms, decide_ms, int(row["n"]) if row else 0
    finally:
        app_module.OutboxWriter, app_module.notification_worker = real_writer, real_worker


def _stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"median_ms": round(statistics.median(ordered), 3),
            "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))], 3)}


def latency(kind: str, calls: int, rounds: int, pace: float) -> dict[str, Any]:
    secret = new_webhook_secret()
    samples: dict[str, tuple[list[float], list[float]]] = {v: ([], []) for v in VARIANTS}
    attempts: dict[str, int] = dict.fromkeys(VARIANTS, 0)
    per_round: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp, hanging_endpoint() as hanging, verifying_receiver(secret) as live:
        folder = Path(tmp)
        refused = f"http://127.0.0.1:{_free_port()}/hook"
        # Default delivery settings throughout (timeout 10 s, retries from 10 s doubling).
        setups = {"no-outbox": ("", None), "outbox-only": ("", None), "none": ("", None),
                  "live": ("", f"http://127.0.0.1:{live.port}/hook"), "dead-refused": ("", refused),
                  "dead-hanging": ("", hanging)}
        for round_number in range(rounds):
            # Every other round in reverse order, so that drift during a round hits all variants alike.
            for variant in VARIANTS if round_number % 2 == 0 else tuple(reversed(VARIANTS)):
                knecht_toml, webhook = setups[variant]
                with store(kind, folder / f"{variant}-{round_number}", variant) as url:
                    env = _env(url, folder / f"{variant}-{round_number}", knecht_toml, webhook, secret)
                    stage_ms, decide_ms, tried = anyio.run(_measure, env, calls, variant, pace)
                samples[variant][0].extend(stage_ms)
                samples[variant][1].extend(decide_ms)
                per_round[variant].append((statistics.median(stage_ms), statistics.median(decide_ms)))
                attempts[variant] += tried
            progress(f"{kind}: latency round {round_number + 1}/{rounds} done")
    result: dict[str, Any] = {}
    base_stage = statistics.median(samples["none"][0])
    base_decide = statistics.median(samples["none"][1])
    for variant in VARIANTS:
        stage_ms, decide_ms = samples[variant]
        result[variant] = {
            "stage": _stats(stage_ms), "decide": _stats(decide_ms),
            "ratio_stage_to_none": round(statistics.median(stage_ms) / base_stage, 3),
            "ratio_decide_to_none": round(statistics.median(decide_ms) / base_decide, 3),
            # The same ratio within each round (paired, so drift between rounds cancels): its spread
            # is the noise the pooled ratio should be read against.
            "round_ratios_stage": [round(mine[0] / none[0], 2) for mine, none in zip(
                per_round[variant], per_round["none"], strict=True)],
            "round_ratios_decide": [round(mine[1] / none[1], 2) for mine, none in zip(
                per_round[variant], per_round["none"], strict=True)],
            "delivery_attempts_meanwhile": attempts[variant],
        }
    return result


# --- 2. throughput -------------------------------------------------------------------------------


async def _stage_events(env: dict[str, str], count: int) -> None:
    async with open_app(load_settings(env=env), watch_policy=False) as app:
        async with app.db.transaction() as tx:
            await tx.execute(EFFECTS_TABLE)
        agent = Actor("bench-agent", "bench", AGENT)
        for n in range(count):
            await app.gate.call_tool(agent, "record_effect", {"label": f"e{n}"})


async def _deliver_all(env: dict[str, str], taken: Counts, events: int) -> tuple[float, int]:
    """The worker as the server runs it (`run`, pipelined), until the receiver has every event."""
    import httpx

    from mcp_knecht.notify import NotifyWorker, notify_config
    from mcp_knecht.notify.channels import destinations

    async with open_app(load_settings(env=env), watch_policy=False) as app:
        config = notify_config(app.settings, app.registry)
        async with httpx.AsyncClient() as client, anyio.create_task_group() as tasks:
            worker = NotifyWorker(app.db, config, destinations(config, client), scrub=app.secrets)
            started = time.perf_counter()
            tasks.start_soon(worker.run)
            with anyio.fail_after(600):
                while taken.verified + taken.refused < events:
                    await anyio.sleep(0.005)
            seconds = time.perf_counter() - started
            tasks.cancel_scope.cancel()
        return seconds, worker.delivered + worker.failed_attempts


def throughput(kind: str, events: int) -> dict[str, Any]:
    secret = new_webhook_secret()
    with tempfile.TemporaryDirectory() as tmp, verifying_receiver(secret) as taken:
        folder = Path(tmp)
        with store(kind, folder, "throughput") as url:
            env = _env(url, folder, "", f"http://127.0.0.1:{taken.port}/hook", secret)
            anyio.run(_stage_events, env, events)
            seconds, attempts = anyio.run(_deliver_all, env, taken, events)
    return {"events": events, "seconds": round(seconds, 3), "events_per_s": round(taken.verified / seconds, 1),
            "verified": taken.verified, "bad_signatures": taken.refused, "attempts": attempts}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stores", nargs="+", choices=("sqlite", "postgresql"), default=["sqlite", "postgresql"])
    parser.add_argument("--calls", type=int, default=300, help="staged calls (and decisions) per variant and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pace", type=float, default=0.005, help="seconds between two calls (default 0.005)")
    parser.add_argument("--events", type=int, default=1000, help="events for the throughput run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import logging

    logging.getLogger("mcp_knecht.store.changes").setLevel(logging.ERROR)  # each dropped database's LISTEN
    results: dict[str, Any] = {}
    for kind in args.stores:
        progress(f"{kind}: latency, {len(VARIANTS)} variants x {args.rounds} rounds x {args.calls} calls")
        results[kind] = {"latency": latency(kind, args.calls, args.rounds, args.pace)}
        progress(f"{kind}: throughput, {args.events} events")
        results[kind]["throughput"] = throughput(kind, args.events)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for kind, result in results.items():
            print(f"\n{kind}: gate call (stage) and decision latency, ms "
                  f"({args.rounds} x {args.calls} samples each)")
            print(f"  {'variant':<14}{'stage med':>10}{'p95':>8}{'ratio':>7} {'per round':<16}"
                  f"{'decide med':>10}{'p95':>8}{'ratio':>7} {'per round':<16}attempts meanwhile")
            for variant, row in result["latency"].items():
                stage_spread = f"{min(row['round_ratios_stage']):.2f}-{max(row['round_ratios_stage']):.2f}"
                decide_spread = f"{min(row['round_ratios_decide']):.2f}-{max(row['round_ratios_decide']):.2f}"
                print(f"  {variant:<14}{row['stage']['median_ms']:>10.3f}{row['stage']['p95_ms']:>8.2f}"
                      f"{row['ratio_stage_to_none']:>7.2f} {stage_spread:<16}{row['decide']['median_ms']:>10.3f}"
                      f"{row['decide']['p95_ms']:>8.2f}{row['ratio_decide_to_none']:>7.2f} {decide_spread:<16}"
                      f"{row['delivery_attempts_meanwhile']}")
            t = result["throughput"]
            print(f"  delivery: {t['events_per_s']} events/s ({t['verified']} verified deliveries in "
                  f"{t['seconds']} s, {t['bad_signatures']} bad signatures)")
    bad = any(r["throughput"]["bad_signatures"] or r["throughput"]["verified"] != r["throughput"]["events"]
              for r in results.values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

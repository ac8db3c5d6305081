#!/usr/bin/env python3
"""The server killed with `kill -9` while operators race through its decision API: nothing runs twice.

    python scripts/soak_server_kills.py [--proposals 400] [--clients 8] [--kills 8]
                                        [--order lockstep|shuffled] [--db URL] [--json]

Stages `--proposals` proposals of the test write tool `record_effect`, starts `mcp-knecht serve
--transport http`, and lets `--clients` operators (each with its own operator token and keep-alive
connection) race to approve all of them with `POST /api/proposals/{id}/approve`. Each time another
share (1/(kills+1)) of the answers the clients will get has come, the server is killed with
SIGKILL, wherever it is (inside a claim, between a claim's commit and its flush, mid-execution,
writing an answer), and started again on the same port, until `--kills` servers have died. A
client whose request found no server, or lost its answer with the server, asks again until it has
an answer. Then one approver that is never killed goes over them all.

The checks are `scripts/soak_approver_kills.py`'s (no double execution, nothing pending or failed,
one claim audited per proposal and before its effect, `audit verify`, `integrity_check`), and one
more: every proposal a client was told had succeeded did, and ran exactly once. A killed server
may leave as many executions "outcome unknown" (`executing`) as it had decisions in flight, at
most one per client. Exit status 1 when a check fails or a client got an answer other than a
decision or a 409 `not_pending`.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import anyio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_approvals import _effects, _env, _stage  # noqa: E402
from bench_decisions_http import _classify, mint_operators  # noqa: E402
from soak_approver_kills import Approver, _audit_verify, _facts, _integrity, checks_hold, judge  # noqa: E402

KILL_JITTER = (0.0, 0.05)
"""Seconds, drawn at random, between a kill's share of the proposals being decided and the kill: a
decision takes a few milliseconds, so kills land anywhere in one."""
START_TIMEOUT = 30.0
GIVE_UP_AFTER = 120.0
"""Seconds a client keeps asking for one answer while no server answers."""


class Server:
    """`mcp-knecht serve --transport http` on one port, started again after each kill."""

    def __init__(self, env: dict[str, str], folder: str) -> None:
        from tests.servers import free_port, knecht_executable

        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self._command = [knecht_executable(), "serve", "--transport", "http", "--host", "127.0.0.1",
                         "--port", str(self.port)]
        self._env = env
        self._log = Path(folder) / "server.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self._log.open("a") as log:
            self.process = subprocess.Popen(self._command, env=self._env, cwd=REPO, stdout=subprocess.DEVNULL,
                                            stderr=log)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"the server exited with {self.process.returncode}:\n{self.log()[-3000:]}")
            try:
                with urllib.request.urlopen(self.base + "/healthz", timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.05)
        raise SystemExit(f"the server did not answer /healthz within {START_TIMEOUT:.0f} s")

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def log(self) -> str:
        return self._log.read_text(errors="replace")


def _client(base: str, token: str, ids: list[int], told: dict[int, str], tally: Counter[str],
            errors: list[str]) -> None:
    """Approve every id in turn, asking again (on a new connection) until a server answers."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    port = int(base.rsplit(":", 1)[1])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60.0)
    try:
        for proposal_id in ids:
            given_up_at = time.monotonic() + GIVE_UP_AFTER
            while True:
                try:
                    connection.request("POST", f"/api/proposals/{proposal_id}/approve", body=b"{}", headers=headers)
                    answer = connection.getresponse()
                    kind, detail = _classify(answer.status, answer.read().decode("utf-8", "replace"))
                    break
                except (OSError, http.client.HTTPException):  # no server, or it died with our request
                    connection.close()
                    tally["asked_again"] += 1
                    if time.monotonic() > given_up_at:
                        kind, detail = "error", f"no answer for #{proposal_id} within {GIVE_UP_AFTER:g} s"
                        break
                    time.sleep(0.02)
            tally[kind] += 1
            if kind == "won":
                told[proposal_id] = detail
            elif kind == "error" and len(errors) < 20:
                errors.append(detail)
    finally:
        connection.close()


def _race_with_kills(server: Server, tokens: dict[str, str], first: int, last: int, kills: int, shuffled: bool,
                     rng: random.Random, progress: bool) -> dict[str, Any]:
    told: dict[int, str] = {}
    tally: Counter[str] = Counter()
    errors: list[str] = []
    threads = []
    for name, token in tokens.items():
        ids = list(range(first, last + 1))
        if shuffled:
            random.Random(f"{rng.random()}-{name}").shuffle(ids)
        threads.append(threading.Thread(target=_client, args=(server.base, token, ids, told, tally, errors),
                                        daemon=True))
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    killed, answers = 0, (last - first + 1) * len(tokens)
    while killed < kills and any(thread.is_alive() for thread in threads):
        # Spread over the race whatever the machine's pace: the next kill once its share is answered.
        if tally["won"] + tally["lost"] + tally["error"] < answers * (killed + 1) // (kills + 1):
            time.sleep(0.002)
            continue
        time.sleep(rng.uniform(*KILL_JITTER))
        server.kill()
        killed += 1
        server.start()
        if progress:
            print(f"\r  {killed} of {kills} servers killed", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    for thread in threads:
        thread.join(timeout=900)
    return {"race_seconds": round(time.perf_counter() - started, 2), "killed": killed, "told": told,
            "answers": dict(tally), "client_errors": errors}


def soak(proposals: int, clients: int, kills: int, order: str, db_url: str | None, seed: int,
         progress: bool = True) -> dict[str, Any]:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="knecht-server-kills-") as folder:
        url = db_url or f"sqlite:///{folder}/soak.db"
        env = {**_env(url, folder), "KNECHT_JWT_SECRET": secrets.token_urlsafe(48)}
        tag = f"serverkills{rng.randrange(1 << 30)}x{int(time.time())}"
        if progress:
            print(f"staging {proposals} proposals in {url.split('@')[-1]} …", file=sys.stderr)
        first, last = anyio.run(_stage, env, proposals, tag)
        tokens = mint_operators(env, [f"operator-{i}" for i in range(clients)])
        server = Server(env, folder)
        server.start()
        try:
            race = _race_with_kills(server, tokens, first, last, kills, order == "shuffled", rng, progress)
        finally:
            server_exit = server.stop()
        if progress:
            print("last approver, never killed …", file=sys.stderr)
        status, final, err = Approver("operator-last", first, last, None, env).finish(timeout=600)
        effects = anyio.run(_effects, env, tag)
        facts = anyio.run(_facts, env, first, last)
        verified = _audit_verify(env)
        told = race.pop("told")
        report = {
            "database": url.split("://")[0], "proposals": proposals, "clients": clients, "order": order,
            "seed": seed, **race, "server_exit": server_exit,
            "server_tracebacks": server.log().count("Traceback"),
            "last_approver": "ok" if status == 0 else f"exit {status}: {err.strip().splitlines()[-1:]}",
            "won_by_last": final["won"] if final else None,
            "told_succeeded": sum(1 for s in told.values() if s == "succeeded"),
            "told_succeeded_but_not": sum(
                1 for pid, s in told.items()
                if s == "succeeded" and (facts[pid]["status"] != "succeeded" or effects.get(facts[pid]["label"]) != 1)),
            **judge(facts, effects, race["killed"] * clients),
            "audit_verified": bool(verified.get("ok")), "audit_rows": verified.get("rows"),
            "audit_problems": verified.get("problems", [])[:3],
            "integrity": _integrity(url),
        }
    report["ok"] = (not report["client_errors"] and report["last_approver"] == "ok"
                    and report["server_exit"] == 0 and report["server_tracebacks"] == 0
                    and report["told_succeeded_but_not"] == 0 and checks_hold(report))
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--proposals", type=int, default=400, help="proposals to decide (default 400)")
    parser.add_argument("--clients", type=int, default=8, help="operators racing through the API (default 8)")
    parser.add_argument("--kills", type=int, default=8, help="servers to kill with SIGKILL (default 8)")
    parser.add_argument("--order", choices=("lockstep", "shuffled"), default="lockstep",
                        help="all clients in id order (default), or each in its own order")
    parser.add_argument("--db", help="database URL (default: a SQLite file in a temporary folder)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the kills' timing")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    args = parser.parse_args()
    if args.proposals < 1 or args.clients < 1 or args.kills < 0:
        parser.error("--proposals and --clients must be at least 1, --kills at least 0")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    report = soak(args.proposals, args.clients, args.kills, args.order, args.db, seed, progress=not args.json)
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:>26}: {value}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

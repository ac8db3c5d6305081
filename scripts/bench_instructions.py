"""Instructions, not seconds: the gate and the stdio cold start against the bare SDK server, counted.

On two noisy cores a 5 % difference drowns in the spread of wall-clock runs (`bench_gate.py`
quotes single rounds from 0.67x to 1.43x). Valgrind counts the instructions a process executes
(`cachegrind --cache-sim=no`, every thread, user space only), which does not depend on what else
the machine is doing: two runs of the same code agree to well under 1 %. What it leaves out is
the kernel's share (reading files, page faults, the disk), so it complements `bench_gate.py`'s
wall-clock figures, it does not replace them.

1. Per gated `tools/call` in memory (`mcp.Client(server)`), protocol 2026-07-28 and 2025-11-25,
   against the bare low-level server calling the same handler (the sides of `bench_gate.py`).
   A child process sets up (the policy file unwatched) and keeps its heap as `mcp-knecht serve`
   does (`startup_heap`: what start-up made is frozen, out of every collection's walk; both sides
   share the process, so both get it), makes N calls in batches of 200 (the gated side flushes
   the audit log after each, so its group commit is charged to it, as often as it comes natively:
   the 50 ms background flush is held off, since under valgrind it would write every other call),
   then stops itself with SIGTERM, before any teardown. It runs twice, with N1 and N2 calls:
   per call = (count(N2) - count(N1)) / (N2 - N1), so everything before the first call cancels out.
2. stdio cold start: spawn `mcp-knecht serve` / `scripts/bare_server.py` under valgrind, write the
   requests of `bench_gate.py` (modern `tools/list`; legacy `initialize` + `tools/list`), and send
   SIGTERM the moment the awaited response arrives: the count is spawn → first answer.
3. A decision (`--decisions`, SQLite): one approver process (`tests.approver_worker`, as
   `bench_approvals.py` races them) approves N1, then N2 fresh proposals of a write tool, each
   claimed, executed and finished: per decision = the difference over N2 - N1, start-up and
   teardown cancelled out. Then an approver comes late to the N2 and N1 decided ones: per late
   attempt (what each of the 7 losers of a race costs at the least). No baseline of its own: the
   count is the budget (two cores at today's instructions per second bound decisions per second).
   With `--race K`, K approvers also race over N1, then N2 fresh proposals in lockstep, each under
   valgrind: all their instructions per decision, and per lost attempt (a loser that waited for the
   winner's turn, unlike a late one). Under valgrind every process runs ~50x slower, so who waits
   how often is not quite as natively; the figure is what the race costs in work, not in time.

    python scripts/bench_instructions.py                    # ~7 minutes on 2 cores
    python scripts/bench_instructions.py --skip calls --compare /tmp/before   # an earlier checkout too
    python scripts/bench_instructions.py --calls 200 1000 --repeat 2 --json
    python scripts/bench_instructions.py --skip calls --skip starts --decisions 50 250 [--race 8]
    python scripts/bench_instructions.py --skip calls --skip starts --stop-at mcp_knecht.notify sqlite3.connect

`--stop-at NAME …` attributes the cold start: `mcp-knecht serve` counted up to the first import of
module NAME, or the first audit event NAME (`sqlite3.connect`: the store opens), each in a run of
its own; the difference between two stops is what lies between them.

PYTHONHASHSEED is fixed, so dict and set layouts (and the work they cost) repeat from run to run.
Needs `valgrind` on PATH. Exit status 0 even when a target is missed; 1 when something did not work.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_gate import (  # noqa: E402
    BATCH,
    LEGACY_REQUESTS,
    LEGACY_VERSION,
    MODERN_REQUESTS,
    MODERN_VERSION,
    TARGET_CALL_RATIO,
    TARGET_START_RATIO,
    TOOL,
    StartFailed,
    bench_env,
    child_env,
    fill_database,
    mint,
    progress,
    server_commands,
    show,
    spawn_once,
)

VALGRIND = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
REFS = re.compile(r"I\s+refs:\s+([\d,]+)")
START_TIMEOUT = 600.0
MODES = {"auto": MODERN_VERSION, "legacy": LEGACY_VERSION}


def counted(stderr: str, what: str) -> int:
    found = REFS.findall(stderr)
    if not found:
        raise StartFailed(f"{what}: valgrind reported no instruction count:\n{stderr[-2000:]}")
    return int(found[-1].replace(",", ""))


# --- 1. per call, in memory ---------------------------------------------------------------------


async def _child_calls(side: str, mode: str, calls: int) -> None:
    """Set up one side, make `calls` calls, stop with SIGTERM (run under valgrind by `calls_counted`)."""
    from bench_gate import build_bare_server, default_arguments
    from mcp import Client

    from mcp_knecht.app import open_app
    from mcp_knecht.cli.startup_heap import collect_later, serving
    from mcp_knecht.core.settings import load_settings
    from mcp_knecht.core.tools import ToolContext
    from mcp_knecht.transports.mcp_server import build_mcp_server

    collect_later()  # the heap as `mcp-knecht serve` keeps it: no collections during start-up, then frozen
    env = json.loads(os.environ["BENCH_ENV"])
    _, actor = mint(env, "bench", "readonly")
    async with open_app(load_settings(env=env), watch_policy=False) as app:
        # Under valgrind a call takes ~50x as long, so the audit log's 50 ms background flush would write
        # every other call where natively it writes every ~170: the explicit flush after each batch of
        # 200 stands in for it, as often as it comes natively.
        app.audit._interval = 3600.0
        arguments = await default_arguments(app)
        tool = app.registry.get(TOOL)
        assert tool is not None
        if side == "gated":
            server = build_mcp_server(app.gate, lambda ctx: actor)
        else:
            server = build_bare_server(tool, tool.input_model.model_validate(arguments),
                                       ToolContext(actor=actor, source="mcp"))
        async with Client(server, mode=mode) as client:
            first = await client.call_tool(TOOL, arguments)  # the first call's one-off work is set-up
            serving()  # as the server does once it serves: start-up's objects out of every collection's walk
            if first.is_error:
                raise SystemExit(f"bench: {side} answered with an error: {first.content}")
            if side == "gated":
                await app.audit.flush()
            errors = 0
            for start in range(0, calls, BATCH):
                for _ in range(min(BATCH, calls - start)):
                    errors += bool((await client.call_tool(TOOL, arguments)).is_error)
                if side == "gated":
                    await app.audit.flush()
            if errors:
                raise SystemExit(f"bench: {errors} of {calls} {side} calls returned an error")
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGTERM)  # counted up to here: no teardown


def calls_counted(side: str, mode: str, calls: int, env: dict[str, str]) -> int:
    command = [*VALGRIND, sys.executable, __file__, "--child", side, mode, str(calls)]
    environment = {**os.environ, "BENCH_ENV": json.dumps(env), "PYTHONHASHSEED": "0"}
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=3600)
    if done.returncode != -signal.SIGTERM and "signal 15" not in done.stderr:
        raise StartFailed(f"{side} {mode} {calls} calls: exit {done.returncode}\n{done.stderr[-3000:]}")
    return counted(done.stderr, f"{side} {mode}")


def phase_calls(args: argparse.Namespace, env: dict[str, str]) -> list[dict[str, Any]]:
    low, high = args.calls
    rows = []
    for mode, protocol in MODES.items():
        per_call: dict[str, list[float]] = {"gated": [], "bare": []}
        for repeat in range(args.repeat):
            for side in ("gated", "bare") if repeat % 2 == 0 else ("bare", "gated"):
                progress(f"{mode}: {side}, {low} and {high} calls under valgrind (run {repeat + 1}/{args.repeat})")
                few, many = calls_counted(side, mode, low, env), calls_counted(side, mode, high, env)
                per_call[side].append((many - few) / (high - low))
        gated, bare = statistics.median(per_call["gated"]), statistics.median(per_call["bare"])
        rows.append({
            "mode": mode, "protocol": protocol, "calls": [low, high],
            "gated_instructions_per_call": round(gated), "bare_instructions_per_call": round(bare),
            "gated_runs": [round(x) for x in per_call["gated"]], "bare_runs": [round(x) for x in per_call["bare"]],
            "ratio": round(gated / bare, 3), "target": TARGET_CALL_RATIO,
            "meets_target": gated / bare <= TARGET_CALL_RATIO,
        })
    return rows


# --- 2. stdio cold start --------------------------------------------------------------------------


def start_counted(command: list[str], environment: dict[str, str], requests: bytes, want: int,
                  stderr_path: Path) -> int:
    """Instructions from spawn to the response with id `want`: SIGTERM as soon as it is read."""
    spawn_once([*VALGRIND, *command], {**environment, "PYTHONHASHSEED": "0"}, requests, want, stderr_path,
               timeout=START_TIMEOUT, on_answer=lambda process: process.send_signal(signal.SIGTERM))
    return counted(stderr_path.read_text(errors="replace"), " ".join(command))


def phase_starts(args: argparse.Namespace, env: dict[str, str], tmp: Path) -> list[dict[str, Any]]:
    token, _ = mint(env, "bench", "readonly")
    environment = child_env(env, token)
    commands = server_commands(tmp)
    commands = {"gated": [sys.executable, *commands["gated"]], "bare": commands["bare"]}
    environments = {name: environment for name in commands}
    if args.compare:
        commands["compare"] = commands["gated"]
        environments["compare"] = {**environment, "PYTHONPATH": str(Path(args.compare).resolve())}
    for name, command in commands.items():  # .pyc files written, page cache warm: not counted
        spawn_once(command, environments[name], MODERN_REQUESTS, 1, tmp / f"{name}.stderr")
    measures = {"modern_tools_list": (MODERN_REQUESTS, 1), "legacy_tools_list": (LEGACY_REQUESTS, 2)}
    counts: dict[tuple[str, str], list[int]] = {}
    for repeat in range(args.repeat):
        for name, command in commands.items() if repeat % 2 == 0 else reversed(commands.items()):
            for measure, (requests, want) in measures.items():
                progress(f"cold start under valgrind: {name}, {measure} (run {repeat + 1}/{args.repeat})")
                counts.setdefault((name, measure), []).append(
                    start_counted(command, environments[name], requests, want, tmp / f"{name}.vg"))
    rows = []
    for measure in measures:
        gated, bare = (statistics.median(counts[(name, measure)]) for name in ("gated", "bare"))
        row: dict[str, Any] = {
            "measure": measure, "gated_instructions": round(gated), "bare_instructions": round(bare),
            "gated_runs": counts[("gated", measure)], "bare_runs": counts[("bare", measure)],
            "ratio": round(gated / bare, 3), "target": TARGET_START_RATIO,
            "meets_target": gated / bare <= TARGET_START_RATIO,
        }
        if args.compare:
            compared = statistics.median(counts[("compare", measure)])
            row.update(compare_instructions=round(compared), compare_ratio=round(compared / bare, 3))
        rows.append(row)
    return rows


# --- where a start goes: counted up to a point -----------------------------------------------------

_STOPPER = """
import os, runpy, signal, sys
point = sys.argv.pop(1)
def stop(event, args):
    if event == point or (event == "import" and args[0] == point):
        os.kill(os.getpid(), signal.SIGTERM)
sys.addaudithook(stop)
sys.argv = ["mcp-knecht", "serve"]
runpy.run_module("mcp_knecht.cli.main", run_name="__main__")
"""


def phase_stops(points: list[str], env: dict[str, str]) -> list[dict[str, Any]]:
    token, _ = mint(env, "bench", "readonly")
    environment = {**child_env(env, token), "PYTHONHASHSEED": "0"}
    rows = []
    for point in points:
        progress(f"cold start under valgrind, up to {point}")
        done = subprocess.run([*VALGRIND, sys.executable, "-c", _STOPPER, point], env=environment, input=b"",
                              capture_output=True, timeout=3600)
        stderr = done.stderr.decode(errors="replace")
        reached = "signal 15" in stderr
        if not reached and done.returncode != 0:  # a start that failed is no figure
            raise StartFailed(f"mcp-knecht serve, counted up to {point}: exit {done.returncode}\n{stderr[-3000:]}")
        rows.append({"point": point, "reached": reached, "instructions": counted(stderr, point)})
    return rows


# --- 3. a decision ---------------------------------------------------------------------------------


def approvers_counted(env: dict[str, str], first: int, last: int,
                      approvers: int = 1) -> tuple[int, list[dict[str, Any]]]:
    """`approvers` processes at once over the ids `first..last`, each under valgrind: their instructions
    summed, and their reports."""
    workers = [subprocess.Popen([*VALGRIND, sys.executable, "-m", "tests.approver_worker", f"bench-operator-{n}",
                                 str(first), str(last)], env={**env, "PYTHONHASHSEED": "0"}, cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for n in range(approvers)]
    total, reports, problems = 0, [], []
    try:
        for worker in workers:
            out, err = worker.communicate(timeout=3600)
            if worker.returncode != 0:
                problems.append(f"approver {first}..{last}: exit {worker.returncode}\n{err[-3000:]}")
                continue
            total += counted(err, "approver")
            reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:  # one that hung (or a Ctrl-C) must not leave the others running under valgrind
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    if problems:
        raise StartFailed("\n".join(problems))
    return total, reports


def phase_decisions(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    import anyio
    from bench_approvals import _env, _stage

    low, high = args.decisions
    folder = tmp / "decisions"
    folder.mkdir()
    env = _env(f"sqlite:///{folder / 'decisions.db'}", str(folder))
    progress(f"decisions: staging {low} + {high} proposals")
    few, many = anyio.run(_stage, env, low, "few"), anyio.run(_stage, env, high, "many")
    counts: dict[str, int] = {}
    for name, (first, last), expected in (("won_few", few, "won"), ("won_many", many, "won"),
                                          ("late_many", many, "lost"), ("late_few", few, "lost")):
        progress(f"decisions under valgrind: {name.replace('_', ', ')} ({last - first + 1} proposals)")
        counts[name], [report] = approvers_counted(env, first, last)
        if report[expected] != last - first + 1:
            raise StartFailed(f"approver {name}: expected {last - first + 1} {expected}, got {report}")
    per_decision = (counts["won_many"] - counts["won_few"]) / (high - low)
    per_late = (counts["late_many"] - counts["late_few"]) / (high - low)
    result = {"proposals": [low, high], "instructions_per_decision": round(per_decision),
              "instructions_per_late_attempt": round(per_late),
              "instructions_per_decision_of_8_racing": round(per_decision + 7 * per_late)}
    if args.race > 1:
        result.update(_race_counted(env, args.race, low, high, per_decision))
    return result


def _race_counted(env: dict[str, str], approvers: int, low: int, high: int, per_decision: float) -> dict[str, Any]:
    import anyio
    from bench_approvals import _stage

    counts = {}
    for name, size in (("few", low), ("many", high)):
        first, last = anyio.run(_stage, env, size, f"race-{name}")
        progress(f"decisions under valgrind: {approvers} racing over {size} proposals")
        counts[name], reports = approvers_counted(env, first, last, approvers)
        if sum(r["won"] for r in reports) != size:
            raise StartFailed(f"race over {size}: {sum(r['won'] for r in reports)} won, not {size}: {reports}")
    in_race = (counts["many"] - counts["few"]) / (high - low)
    return {"racing_approvers": approvers, "instructions_per_decision_in_race": round(in_race),
            "instructions_per_lost_attempt_in_race": round((in_race - per_decision) / (approvers - 1))}


# --- report ---------------------------------------------------------------------------------------


def _millions(n: float) -> str:
    return f"{n / 1e6:,.1f} M"


def print_report(report: dict[str, Any]) -> None:
    mark = {True: "meets", False: "MISSES"}
    print(f"instructions counted by valgrind (cachegrind, user space), python {report['python']}")
    if "calls" in report:
        print("\n1. per tools/call in memory  (instructions per call; each run's in brackets, gated | bare)")
        for row in report["calls"]:
            runs = " | ".join(", ".join(f"{x:,}" for x in row[f"{side}_runs"]) for side in ("gated", "bare"))
            print(f"  {row['protocol']}  gated {row['gated_instructions_per_call']:>9,}  "
                  f"bare {row['bare_instructions_per_call']:>9,}  ratio {row['ratio']:.3f}x  "
                  f"({mark[row['meets_target']]} ≤ {row['target']}x)  [{runs}]")
    if "starts" in report:
        print("\n2. stdio cold start, spawn → response  (instructions)")
        for row in report["starts"]:
            line = (f"  {row['measure']:<18} gated {_millions(row['gated_instructions']):>10}  "
                    f"bare {_millions(row['bare_instructions']):>10}  ratio {row['ratio']:.3f}x  "
                    f"({mark[row['meets_target']]} ≤ {row['target']}x)")
            if "compare_instructions" in row:
                line += f"  compare {_millions(row['compare_instructions'])} ({row['compare_ratio']:.3f}x)"
            print(line)
    if "stops" in report:
        print("\nwhere the start goes: mcp-knecht serve counted up to  (instructions)")
        for row in report["stops"]:
            reached = "" if row["reached"] else "  (never reached: the whole run, stdin closed)"
            print(f"  {row['point']:<40} {_millions(row['instructions']):>10}{reached}")
    if "decisions" in report:
        d = report["decisions"]
        print("\n3. a decision, SQLite, one approver process  (instructions)")
        print(f"  decided and executed {d['instructions_per_decision']:>11,}   late attempt (already decided) "
              f"{d['instructions_per_late_attempt']:>9,}   8 racing: {d['instructions_per_decision_of_8_racing']:,} "
              "per decision at the least")
        if "racing_approvers" in d:
            print(f"  {d['racing_approvers']} racing, counted: {d['instructions_per_decision_in_race']:,} "
                  f"per decision, {d['instructions_per_lost_attempt_in_race']:,} per lost attempt")
    print(f"\n{report['seconds']} s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, nargs=2, metavar=("N1", "N2"), default=[200, 800],
                        help="the two call counts whose difference gives the per-call figure (some hundreds apart: "
                             "with 5 and 15, one-off work swings the ratio from 0.9x to 1.1x)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per side and measure (the median is shown)")
    parser.add_argument("--skip", choices=("calls", "starts"), action="append", default=[],
                        help="leave out a phase (repeatable)")
    parser.add_argument("--compare", metavar="CHECKOUT", help="also count another checkout's cold start")
    parser.add_argument("--stop-at", nargs="+", metavar="NAME", default=[],
                        help="also count the gated start up to the first import of module NAME or audit event NAME")
    parser.add_argument("--decisions", type=int, nargs=2, metavar=("N1", "N2"),
                        help="also count a decision: one approver over N1, then N2 proposals (say 50 250)")
    parser.add_argument("--race", type=int, default=1, metavar="K",
                        help="with --decisions: also count K approvers racing over N1, then N2 proposals (say 8)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    parser.add_argument("--child", nargs=3, metavar=("SIDE", "MODE", "CALLS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.race > 1 and args.decisions is None:
        parser.error("--race needs --decisions N1 N2")
    for option in ("calls", "decisions"):
        pair = getattr(args, option)
        if pair is not None and not 0 < pair[0] < pair[1]:
            parser.error(f"--{option} N1 N2 needs 0 < N1 < N2")
    return args


def main(argv: list[str] | None = None) -> int:
    import secrets

    import anyio

    args = parse_args(argv)
    if args.child:
        side, mode, calls = args.child
        anyio.run(_child_calls, side, mode, int(calls))
        return 0
    if shutil.which("valgrind") is None:
        raise SystemExit("bench: valgrind is not installed (Debian: apt-get install valgrind)")
    started = time.perf_counter()
    report: dict[str, Any] = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    failed = False
    with tempfile.TemporaryDirectory(prefix="knecht-bench-") as folder:
        tmp = Path(folder)
        env = bench_env(tmp, secrets.token_urlsafe(48))
        progress(f"demo data into {env['KNECHT_DATABASE_URL']}")
        anyio.run(fill_database, env["KNECHT_DATABASE_URL"])
        try:
            if "calls" not in args.skip:
                report["calls"] = phase_calls(args, env)
            if "starts" not in args.skip:
                report["starts"] = phase_starts(args, env, tmp)
            if args.stop_at:
                report["stops"] = phase_stops(args.stop_at, env)
            if args.decisions:
                report["decisions"] = phase_decisions(args, tmp)
        except StartFailed as exc:
            progress(f"failed: {exc}")
            failed = True
    report["seconds"] = round(time.perf_counter() - started, 1)
    return show(report, print_report, as_json=args.json, failed=failed)


if __name__ == "__main__":
    sys.exit(main())

"""What do policy rules cost? Decision time with 1,000 rules, and the gate against the bare SDK.

1. Parsing: 1,000 `[[rules]]` (validated against the Knecht tools' input models) — once per start
   and per reload.
2. `Policy.decide` on a call's rule-visible values, median µs per decision (timed in batches of 50),
   target ≤ 20 µs. Rules are indexed by call (tool and action) on first use, and within a call by
   bit masks per argument value and per caller (core/policy.py, `_Entry`):
     spread    1,000 rules over every Knecht tool (exact values, any-of lists, globs, callers):
               a call no rule matches · a call the last rule of its tool matches · a tool with no rules
     hot       1,000 rules on one tool, 90 % exact values of one argument, 10 % globs
     globs     1,000 glob rules on one tool
   Masks per argument value are kept once worked out; "a value never seen before" times the first
   sight of a value: exact values are one look-up, a glob is tried only on values that start with
   its literal prefix — the worst case is 1,000 globs that all share the prefix of a new value.
3. The gate, in memory through the SDK client (scripts/bench_gate.py's method, `get_project`): a bare
   SDK server calling the same handler, the gate with the built-in policy, and the gate with the
   1,000 rules (100 of them on `get_project`, so each call is decided on its arguments), in rotating
   batches in one process. Target: the ratio to the bare SDK unchanged within noise.

    python scripts/bench_policy.py                  # ~1 minute on 2 cores
    python scripts/bench_policy.py --rules 1000 --calls 4000 --json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import bench_gate  # noqa: E402

TARGET_DECISION_US = 20.0
BATCH = 50
PROJECTS = [f"project-{n}" for n in range(400)]


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# --- the rules ---------------------------------------------------------------------------------------


def _rule(tool: str, when: str = "", *, decision: str = "approve", extra: str = "") -> str:
    return f'[[rules]]\ntool = "{tool}"\n' + (f"when = {{ {when} }}\n" if when else "") + \
        f'decision = "{decision}"\n{extra}'


def spread_rules(count: int, registry: Any) -> str:
    """`count` rules over every tool that has arguments a rule can compare, of every kind."""
    tools = [t for t in registry if any(n in t.rule_fields for n in ("project", "branch", "name", "limit"))]
    rules = []
    for n in range(count):
        tool = tools[n % len(tools)]
        fields = tool.rule_fields
        kind = n % 10
        if "project" in fields and kind < 5:
            when = f'project = "{PROJECTS[n % len(PROJECTS)]}"'
        elif "branch" in fields and kind < 7:
            when = f'branch = ["release/{n}", "hotfix/{n}-*"]'
        elif "name" in fields and kind < 8:
            when = f'name = "SECRET_{n}_*"'
        elif "limit" in fields and kind < 8:
            when = f"limit = {n % 50 + 1}"
        else:
            rules.append(_rule(tool.name, decision="deny", extra=f'subject = "bot-{n}-*"\n'))
            continue
        action = f'action = "{tool.actions[n % len(tool.actions)]}"\n' if tool.actions else ""
        rules.append(_rule(tool.name, when, extra=action + (f"approvers = {n % 3 + 1}\n" if n % 4 == 0 else "")))
    return "\n".join(rules)


def hot_rules(count: int, tool: str, *, globs_only: bool = False) -> str:
    rules = []
    for n in range(count):
        if globs_only or n % 10 == 9:
            rules.append(_rule(tool, f'project = "{PROJECTS[n % len(PROJECTS)]}-*"', decision="deny"))
        else:
            rules.append(_rule(tool, f'project = ["{PROJECTS[n % len(PROJECTS)]}", "alias-{n}"]'))
    return "\n".join(rules)


# --- 1 and 2: parsing and deciding ---------------------------------------------------------------------


def _median_us(decide: Any, rounds: int) -> float:
    clock = time.perf_counter_ns
    samples = []
    for _ in range(rounds):
        t0 = clock()
        for _ in range(BATCH):
            decide()
        samples.append((clock() - t0) / BATCH)
    return statistics.median(samples) / 1000


def decisions(count: int, rounds: int) -> dict[str, Any]:
    from mcp_knecht.core.actor import Actor
    from mcp_knecht.core.policy_file import parse_policy
    from mcp_knecht.core.registry import Registry
    from mcp_knecht.knecht import knecht_tools

    registry = Registry(knecht_tools(None))  # type: ignore[arg-type]  # parsing and deciding touch no store
    path = Path("policies.toml")
    caller = Actor("alice", "claude-code", frozenset())
    results: dict[str, Any] = {"rules": count, "target_us": TARGET_DECISION_US, "cases": []}

    text = spread_rules(count, registry)
    t0 = time.perf_counter()
    policy = parse_policy(text, path, registry)
    results["parse_ms"] = round((time.perf_counter() - t0) * 1000, 1)
    assert len(policy.rule_list) == count

    def case(name: str, policy: Any, tool_name: str, action: str | None, values: dict[str, Any],
             expect: str, *, unseen: str | None = None) -> None:
        """`unseen`: an argument that gets a value never seen before in every call (no cached mask)."""
        tool = registry.get(tool_name)
        assert tool is not None
        decided = policy.decide(tool, action, values, caller)  # builds the index entry: not timed
        assert expect in decided.rule, (name, decided)
        if unseen is None:
            median = _median_us(lambda: policy.decide(tool, action, values, caller), rounds)
        else:
            fresh = iter([{**values, unseen: f"never-seen-{n}"} for n in range(rounds * BATCH + 1)])
            median = _median_us(lambda: policy.decide(tool, action, next(fresh), caller), rounds // 20)
        per_call = len(policy._entry(tool, action).rules)
        results["cases"].append({"case": name, "rules_of_the_call": per_call, "median_us": round(median, 2),
                                 "meets_target": median <= TARGET_DECISION_US})

    last = next(r for r in reversed(policy.rule_list) if r.tool == "list_runs" and r.when)
    last_value = {c.name: c.values[0] for c in last.when}
    case("spread: no rule matches", policy, "list_runs", None,
         {"project": "elsewhere", "branch": "main", "limit": 99}, "built-in")
    case("spread: the tool's last rule matches", policy, "list_runs", None,
         {"project": "elsewhere", "branch": "main", "limit": 99, **last_value}, f"rule {last.number}:")
    case("spread: a tool without rules", policy, "get_run", None, {"run_id": 1}, "built-in")

    hot = parse_policy(hot_rules(count, "rerun_run"), path, registry)
    case("hot: 1 tool, no rule matches", hot, "rerun_run", None, {"project": "elsewhere"}, "built-in")
    case("hot: 1 tool, the last exact rule matches", hot, "rerun_run", None, {"project": f"alias-{count - 2}"},
         f"rule {count - 1}:")
    case("hot: 1 tool, a value never seen before", hot, "rerun_run", None, {"project": "elsewhere"}, "built-in",
         unseen="project")
    globs = parse_policy(hot_rules(count, "rerun_run", globs_only=True), path, registry)
    case("globs: 1 tool, every rule a glob, none matches", globs, "rerun_run", None, {"project": "elsewhere"},
         "built-in")
    case("globs: the same, a value never seen before", globs, "rerun_run", None, {"project": "elsewhere"},
         "built-in", unseen="project")
    shared = parse_policy("\n".join(_rule("rerun_run", f'project = "never-*-{n}"', decision="deny")
                                     for n in range(count)), path, registry)
    case("worst: globs sharing the value's prefix, unseen", shared, "rerun_run", None, {"project": "x"},
         "built-in", unseen="project")
    return results


# --- 3: the gate -------------------------------------------------------------------------------------


def _config(folder: Path, policy: str) -> Path:
    folder.mkdir(parents=True)
    shutil.copytree(REPO / "scopes", folder / "scopes")
    (folder / "policies.toml").write_text(policy, encoding="utf-8")
    return folder


async def _gate(env: dict[str, str], calls: int, warmup: int) -> dict[str, Any]:
    """bare SDK · gate with the built-in policy · gate with the rules, in rotating batches, one app."""
    from mcp import Client

    from mcp_knecht.app import open_app
    from mcp_knecht.core.gate import Gate
    from mcp_knecht.core.policy import Policy
    from mcp_knecht.core.settings import load_settings
    from mcp_knecht.core.tools import ToolContext
    from mcp_knecht.transports.mcp_server import build_mcp_server

    _, actor = bench_gate.mint(env, "bench", "readonly")
    async with open_app(load_settings(env=env)) as app:
        arguments = await bench_gate.default_arguments(app)
        tool = app.registry.get(bench_gate.TOOL)
        policy = app.policy()
        rules_on_call = len(policy._entry(tool, None).rules)
        empty = Policy()

        def gate_with(chosen: Policy) -> Gate:  # as the app builds its gate, but for the policy
            return Gate(app.registry, app.audit, policy=lambda: chosen, scrub=app.secrets,
                        hash_arguments=app.gate.hash_arguments, observe=getattr(app.gate, "_observe", None))

        servers = {
            "bare": bench_gate.build_bare_server(tool, tool.input_model.model_validate(arguments),
                                                 ToolContext(actor=actor, source="mcp")),
            "no rules": build_mcp_server(gate_with(empty), lambda ctx: actor),
            "rules": build_mcp_server(gate_with(policy), lambda ctx: actor),
        }
        async with Client(servers["bare"]) as bare, Client(servers["no rules"]) as no_rules, \
                Client(servers["rules"]) as with_rules:
            sides = [bench_gate.Side("bare", bare, None), bench_gate.Side("no rules", no_rules, app.audit.flush),
                     bench_gate.Side("rules", with_rules, app.audit.flush)]
            answers = [await side.client.call_tool(bench_gate.TOOL, arguments) for side in sides]
            if any(a.is_error for a in answers) or len({json.dumps(a.structured_content) for a in answers}) != 1:
                raise SystemExit(f"bench: the three answers differ: {answers}")
            for side in sides:
                await side.run(warmup, arguments, record=False)
            rounds = max(1, calls // bench_gate.BATCH)
            for i in range(rounds):
                for side in sides[i % 3:] + sides[:i % 3]:
                    await side.run(bench_gate.BATCH, arguments, record=True)
    medians = {side.name: statistics.median(side.samples) / 1000 for side in sides}

    def per_round(name: str, base: str) -> list[float]:
        by = {side.name: side.samples for side in sides}
        step = bench_gate.BATCH
        return [statistics.median(by[name][i * step:(i + 1) * step])
                / statistics.median(by[base][i * step:(i + 1) * step]) for i in range(rounds)]

    rules_vs_plain = per_round("rules", "no rules")
    return {
        "calls_per_side": rounds * bench_gate.BATCH, "rules": len(policy.rule_list), "rules_on_the_call": rules_on_call,
        "bare_median_us": round(medians["bare"], 1), "no_rules_median_us": round(medians["no rules"], 1),
        "rules_median_us": round(medians["rules"], 1),
        "ratio_no_rules": round(medians["no rules"] / medians["bare"], 3),
        "ratio_rules": round(medians["rules"] / medians["bare"], 3),
        "rules_over_no_rules": round(medians["rules"] / medians["no rules"], 3),
        "rules_over_no_rules_round_median": round(statistics.median(rules_vs_plain), 3),
        "errors": sum(side.errors for side in sides),
    }


def gate(count: int, calls: int, warmup: int) -> dict[str, Any]:
    import secrets

    import anyio

    from mcp_knecht.core.registry import Registry
    from mcp_knecht.knecht import knecht_tools

    registry = Registry(knecht_tools(None))  # type: ignore[arg-type]
    on_call = "\n".join(_rule("get_project", f'project = "{PROJECTS[n]}"', decision="deny") for n in range(100))
    many = on_call + "\n" + spread_rules(count - 100, registry)
    with tempfile.TemporaryDirectory(prefix="knecht-bench-policy-") as folder:
        tmp = Path(folder)
        env = bench_gate.bench_env(tmp, secrets.token_urlsafe(48))
        progress(f"demo data into {env['KNECHT_DATABASE_URL']}")
        anyio.run(bench_gate.fill_database, env["KNECHT_DATABASE_URL"])
        env["KNECHT_CONFIG_DIR"] = str(_config(tmp / "config", many))
        progress(f"bare SDK · gate without rules · gate with {count} rules: {calls} calls each, rotating batches")
        return dict(anyio.run(_gate, env, calls, warmup))


# --- report ------------------------------------------------------------------------------------------


def print_report(report: dict[str, Any]) -> None:
    d = report["decisions"]
    print(f"mcp-knecht policy benchmark  (python {report['python']}, {report['cpus']} cpus)")
    print(f"\n1. parsing {d['rules']:,} rules (validated against the tools' input models): {d['parse_ms']} ms")
    print(f"\n2. Policy.decide, median µs per decision ({d['rules']:,} rules; target ≤ {d['target_us']:.0f} µs)")
    for c in d["cases"]:
        print(f"   {c['case']:<46} {c['rules_of_the_call']:>5} rules of the call  {c['median_us']:>8.2f} µs  "
              f"{'ok' if c['meets_target'] else 'MISSED'}")
    if report.get("gate"):
        g = report["gate"]
        print(f"\n3. in-memory tools/call get_project through the SDK client, protocol 2026-07-28: µs per call "
              f"(median of {g['calls_per_side']} each, rotating batches)")
        print(f"   bare SDK                         {g['bare_median_us']:>8.1f}")
        print(f"   gate, built-in policy (no rules) {g['no_rules_median_us']:>8.1f}   "
              f"ratio to bare {g['ratio_no_rules']:.3f}")
        print(f"   gate, {g['rules']:,} rules ({g['rules_on_the_call']} on this call, decided after freezing)"
              f" {g['rules_median_us']:>8.1f}   ratio to bare {g['ratio_rules']:.3f}")
        print(f"   rules / no rules: {g['rules_over_no_rules']:.3f} (median of per-round ratios "
              f"{g['rules_over_no_rules_round_median']:.3f})")
    print(f"\ntotal {report['seconds']:.1f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rules", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2000, help="timed batches of 50 decisions per case")
    parser.add_argument("--calls", type=int, default=4000, help="gate: measured calls per side")
    parser.add_argument("--warmup", type=int, default=400)
    parser.add_argument("--skip-gate", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    report: dict[str, Any] = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    progress(f"deciding with {args.rules} rules")
    report["decisions"] = decisions(args.rules, args.rounds)
    if not args.skip_gate:
        report["gate"] = gate(args.rules, args.calls, args.warmup)
    report["seconds"] = round(time.perf_counter() - started, 1)
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

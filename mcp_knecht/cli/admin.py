"""`mcp-knecht policy …` and `mcp-knecht audit …`: what the admin checks."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from mcp_knecht.cli.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from mcp_knecht.errors import KnechtError, UsageError

if TYPE_CHECKING:
    from mcp_knecht.core.actor import Actor
    from mcp_knecht.core.policy import Decision, Policy
    from mcp_knecht.core.tools import Tool


def _in_app(args: argparse.Namespace, work: Callable[[Any], Awaitable[int]]) -> int:
    """Run `work(app)` on the tools and policy exactly as the server would load them; fails as the
    server would."""
    import anyio

    from mcp_knecht.app import open_app
    from mcp_knecht.core.settings import load_settings

    settings = load_settings(db=args.db, config=args.config)

    async def run() -> int:
        async with open_app(settings, watch_policy=False) as app:
            return await work(app)

    return anyio.run(run)


def _calls(tool: Tool) -> list[str | None]:
    return list(tool.actions or (None,))


def _call_name(tool: Tool, action: str | None) -> str:
    return f"{tool.name}.{action}" if action else tool.name


def cmd_policy_check(args: argparse.Namespace) -> int:
    async def check(app: Any) -> int:
        from mcp_knecht.cli.render import table
        from mcp_knecht.core.policy_file import missing_or_empty
        from mcp_knecht.core.policy_text import rule_warnings

        path, policy, registry = app.settings.policy_file, app.policy(), app.registry
        if (gone := missing_or_empty(path)) is not None:
            print(f"mcp-knecht: warning: {gone}: the built-in defaults apply here, but a running server that loaded "
                  "a policy keeps its last good policy until the file is back.", file=sys.stderr)
        warnings = rule_warnings(policy, registry)
        rows: list[dict[str, Any]] = []
        for tool in sorted(registry, key=lambda t: t.name):
            for action in _calls(tool):
                cases = policy.cases(tool, action)
                modes = list(dict.fromkeys(case.decision.mode for case in cases))
                labels = [f"rule {c.rule.number}" for c in cases if c.rule is not None]
                if cases[-1].rule is None:
                    labels.append(cases[-1].decision.rule)
                rule = ", then ".join(labels)
                rows.append({"call": _call_name(tool, action), "scope": tool.scope_of(action),
                             "effect": tool.effect_of(action), "decision": "|".join(modes), "rule": rule})
        if args.json:
            print(json.dumps({"file": str(path), "calls": rows,
                              "rules": [{"number": r.number, "summary": r.summary()} for r in policy.rule_list],
                              "warnings": [w.message for w in warnings]}, indent=2, ensure_ascii=False))
            return EXIT_OK
        print(f"{path}: OK\n")
        if policy.rule_list:
            print("Rules, in order (the first that matches a call decides; then the table below):")
            for each in policy.rule_list:
                print(f"  {each.summary()}")
            print()
        for warning in warnings:
            print(f"{'warning' if warning.shadowed else 'note'}: {warning.message}")
        if warnings:
            print()
        print(table(["CALL", "SCOPE", "EFFECT", "DECISION", "RULE"],
                    [[r["call"], r["scope"], r["effect"], r["decision"], r["rule"]] for r in rows]))
        return EXIT_OK

    return _in_app(args, check)


def cmd_policy_explain(args: argparse.Namespace) -> int:
    name, _, action = args.call.partition(".")

    async def explain(app: Any) -> int:
        tool = app.registry.get(name)
        if tool is None:
            print(f"mcp-knecht: no tool named {name!r}.", file=sys.stderr)
            return EXIT_USAGE
        if action and action not in tool.actions:
            print(f"mcp-knecht: {name} has no action {action!r}; actions: {', '.join(tool.actions) or 'none'}.",
                  file=sys.stderr)
            return EXIT_USAGE
        from mcp_knecht.core.actor import Actor

        caller = None
        if args.subject is not None or args.client is not None:
            every_scope = frozenset(scope for t in app.registry for scope in t.scopes)
            caller = Actor(args.subject or "policy-explain", args.client or "policy-explain", every_scope)
        if args.arguments is not None:
            return await explain_call(app, tool, action or None, caller, args.arguments, args.json)
        for each in ([action] if action else _calls(tool)):
            _print_cases(app.policy(), tool, each, caller, args.json)
        if not args.json and (names := _names(app.policy(), tool)):
            from mcp_knecht.core.policy_text import rule_names

            print(f"\nA rule on {tool.name} can test (the rules here test {', '.join(sorted(names))}):")
            for line in rule_names(tool):
                print(f"  {line}")
            print("Give --args JSON for the decision on a concrete call.")
        return EXIT_OK

    return _in_app(args, explain)


def _names(policy: Policy, tool: Tool) -> set[str]:
    return {name for action in _calls(tool) for name in policy.names(tool, action)}


def _print_cases(policy: Policy, tool: Tool, action: str | None, caller: Actor | None, as_json: bool) -> None:
    from mcp_knecht.core.policy_text import case_line

    call = _call_name(tool, action)
    cases = policy.cases(tool, action, caller)
    if as_json:
        print(json.dumps({"call": call, "decision": cases[0].decision.mode if len(cases) == 1 else "depends",
                          "rule": cases[0].decision.rule if len(cases) == 1 else None,
                          "cases": [{"rule": c.decision.rule, "decision": c.decision.mode,
                                     "approvers": c.decision.approvers, "reason": c.decision.reason}
                                    for c in cases]}, ensure_ascii=False))
    elif len(cases) == 1:
        print(f"{call}: {_verdict(cases[0].decision)}  (rule: {cases[0].decision.rule})")
    else:
        print(f"{call}: depends on the call; the first that matches decides:")
        for case in cases:
            print(f"  {case_line(case)}")


def _verdict(decision: Decision) -> str:
    quorum = f" ({decision.approvers} approvers)" if decision.approvers > 1 else ""
    return decision.mode + quorum + (f": {decision.reason}" if decision.reason else "")


async def explain_call(app: Any, tool: Tool, action: str | None, caller: Actor | None, raw: str,
                       as_json: bool) -> int:
    """The decision for one concrete call, on what the gate would see: the arguments validated and
    frozen (with the store), and the tool's facts. Values that are no complete call (say
    `{"branch": "main"}`) are taken as given, as rule-visible names."""
    from mcp_knecht.core.actor import Actor
    from mcp_knecht.core.gate import GateResult
    from mcp_knecht.core.policy_text import shown_values
    from mcp_knecht.core.tools import Source
    from mcp_knecht.core.validation import validate_arguments
    from mcp_knecht.errors import InvalidArgumentsError

    try:
        given = json.loads(raw)
    except ValueError as exc:
        raise UsageError(f"--args is not valid JSON: {exc}") from None
    if not isinstance(given, dict):
        raise UsageError("--args must be a JSON object of arguments, e.g. '{\"run_id\": 12}'.")
    if action is not None and tool.actions and "action" not in given:
        given["action"] = action
    if tool.actions:
        action = given.get("action") if isinstance(given.get("action"), str) else action
    who = caller or Actor("policy-explain", "policy-explain", frozenset(s for t in app.registry for s in t.scopes))
    note = "validated and frozen, as the gate would see this call"
    values: dict[str, Any]
    try:
        validated = validate_arguments(tool.name, tool.input_model, given)
    except InvalidArgumentsError as exc:
        if unknown := sorted(set(given) - set(tool.rule_fields)):
            raise UsageError(f"{exc.message} — and as rule values, {unknown[0]!r} is nothing a rule on {tool.name} "
                             f"can test ({', '.join(sorted(tool.rule_fields))}).") from None
        values, note = dict(given), "taken as given: not a complete call, so nothing was validated or frozen"
    else:
        source = Source("feature", "policy-explain")
        frozen = await app.gate.freeze(who, tool, validated, source=source)
        if isinstance(frozen, GateResult):
            raise KnechtError(f"This call cannot be frozen, so the gate would refuse it: {frozen.text}")
        found = await app.gate.rule_values(who, tool, frozen, source=source)
        if isinstance(found, GateResult):
            raise KnechtError(f"The facts of this call cannot be looked up: {found.text}")
        values = found
    decision = app.policy().decide(tool, action, values, caller)
    call = _call_name(tool, action)
    if as_json:
        print(json.dumps({"call": call, "decision": decision.mode, "rule": decision.rule,
                          "approvers": decision.approvers, "reason": decision.reason, "values": values,
                          "as": {"subject": caller.subject, "client": caller.client} if caller else None},
                         ensure_ascii=False, default=str))
        return EXIT_OK
    print(f"{call}: {_verdict(decision)}  (rule: {decision.rule})")
    print(f"  as        {'anyone (no --as)' if caller is None else f'{caller.subject} (client {caller.client})'}")
    print(f"  rules see {shown_values(values)}")
    print(f"            ({note})")
    return EXIT_OK


async def _verify(db: Any, chain: Any, as_json: bool) -> int:
    """Stream the chain once (bounded memory), with a progress line on long logs."""
    import time

    from mcp_knecht.cli.errors import say
    from mcp_knecht.store.audit_log import ChainProblem

    problems: list[ChainProblem] = []
    started, rows = time.perf_counter(), 0
    async for found in chain.verify(db):
        if isinstance(found, ChainProblem):
            problems.append(found)
        else:
            rows = found
            say(f"mcp-knecht: verified {rows:,} rows…")
    count = await db.fetch_one("SELECT COUNT(*) AS n FROM audit_log")
    rows = count["n"] if count else 0
    seconds = time.perf_counter() - started
    rate = round(rows / seconds) if seconds > 0 else rows
    if as_json:
        print(json.dumps({"rows": rows, "ok": not problems, "rows_per_second": rate,
                          "problems": [{"id": p.id, "problem": p.problem} for p in problems]}))
    elif problems:
        for problem in problems:
            print(f"row {problem.id}: {problem.problem}")
    else:
        print(f"Audit chain intact: {rows} rows ({rate:,} rows/s).")
    return EXIT_FAILED if problems else EXIT_OK


async def _audit(args: argparse.Namespace) -> int:
    from mcp_knecht.cli.render import table
    from mcp_knecht.core.keys import load_server_keys
    from mcp_knecht.core.settings import load_settings
    from mcp_knecht.store import open_database
    from mcp_knecht.store.audit_log import AuditChain, recent_entries

    settings = load_settings(db=args.db, config=args.config)
    db = await open_database(settings.database_url)
    try:
        if args.audit_command == "verify":
            return await _verify(db, AuditChain(load_server_keys(settings)), args.json)
        entries = await recent_entries(db, tool=args.tool, subject=args.subject, outcome=args.outcome,
                                       source=args.source, proposal_id=args.proposal, limit=args.limit)
        if args.json:
            print(json.dumps(entries, indent=2, ensure_ascii=False))
        else:
            print(table(["ID", "AT (UTC)", "SOURCE", "SUBJECT", "TOOL", "OUTCOME", "PROPOSAL", "RULE"],
                        [[e["id"], e["at"][:19], e["source"], e["subject"],
                          f"{e['tool']}.{e['action']}" if e["action"] else e["tool"],
                          e["outcome"], e["proposal_id"] or "", e["rule"] or ""] for e in entries]))
        return EXIT_OK
    finally:
        await db.close()


def cmd_audit(args: argparse.Namespace) -> int:
    import anyio

    return anyio.run(_audit, args)


def add_commands(commands: Any, common: Any) -> None:
    policy = commands.add_parser("policy", help="check and explain policies.toml")
    policy_commands = policy.add_subparsers(dest="policy_command", required=True, metavar="COMMAND")
    check = policy_commands.add_parser("check", help="validate the config and print the effective policy table")
    check.add_argument("--json", action="store_true")
    common(check)
    check.set_defaults(handler=cmd_policy_check)
    explain = policy_commands.add_parser(
        "explain", help="the decision for TOOL[.ACTION] (or one concrete call) and the rule that gave it",
        epilog="examples:\n"
               "  mcp-knecht policy explain project_variable.delete\n"
               "  mcp-knecht policy explain rerun_run --args '{\"run_id\": 12}'          # the branch run 12 is on\n"
               "  mcp-knecht policy explain rerun_run --args '{\"branch\": \"release/2.1\"}'\n"
               "  mcp-knecht policy explain cancel_run --args '{\"run_id\": 7}' --as ci-bot",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    explain.add_argument("call", metavar="TOOL[.ACTION]")
    explain.add_argument("--args", dest="arguments", metavar="JSON",
                         help="a concrete call's arguments (validated and frozen against the store, as the gate "
                              "would), or just the values rules test, e.g. '{\"branch\": \"main\"}'")
    explain.add_argument("--as", dest="subject", metavar="SUBJECT", help="the caller's subject, for subject rules")
    explain.add_argument("--client", metavar="NAME", help="the caller's client, for client rules")
    explain.add_argument("--json", action="store_true")
    common(explain)
    explain.set_defaults(handler=cmd_policy_explain)

    audit = commands.add_parser("audit", help="list or verify the audit log")
    audit_commands = audit.add_subparsers(dest="audit_command", required=True, metavar="COMMAND")
    verify = audit_commands.add_parser("verify", help="check the hash chain; exit 1 naming each bad row")
    verify.add_argument("--json", action="store_true")
    common(verify)
    verify.set_defaults(handler=cmd_audit)
    listing = audit_commands.add_parser("list", help="recent entries, newest first")
    for flag in ("--tool", "--subject", "--outcome", "--source"):
        listing.add_argument(flag)
    listing.add_argument("--proposal", type=int, help="entries about one proposal")
    listing.add_argument("--limit", type=int, default=50)
    listing.add_argument("--json", action="store_true")
    common(listing)
    listing.set_defaults(handler=cmd_audit)

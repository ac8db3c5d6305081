"""`mcp-knecht policy …` and `mcp-knecht audit …`: what the admin checks."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from mcp_knecht.cli.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE


def _registry_and_policy(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """Tools and policy exactly as the server would load them; fails as the server would."""
    import anyio

    from mcp_knecht.app import open_app
    from mcp_knecht.core.settings import load_settings

    settings = load_settings(db=args.db, config=args.config)

    async def load():  # type: ignore[no-untyped-def]
        async with open_app(settings, watch_policy=False) as app:
            return settings, app.registry, app.policy()

    return anyio.run(load)


def cmd_policy_check(args: argparse.Namespace) -> int:
    from mcp_knecht.cli.render import table
    from mcp_knecht.core.policy_file import missing_or_empty

    settings, registry, policy = _registry_and_policy(args)
    if (gone := missing_or_empty(settings.policy_file)) is not None:
        print(f"mcp-knecht: warning: {gone}: the built-in defaults apply here, but a running server that loaded "
              "a policy keeps its last good policy until the file is back.", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    for tool in sorted(registry, key=lambda t: t.name):
        for action in tool.actions or (None,):
            decision = policy.decide(tool, action)
            rows.append({"call": f"{tool.name}.{action}" if action else tool.name, "scope": tool.scope,
                         "effect": tool.effect_of(action), "decision": decision.mode, "rule": decision.rule})
    if args.json:
        print(json.dumps({"file": str(settings.policy_file), "rules": rows}, indent=2))
    else:
        print(f"{settings.policy_file}: OK\n")
        print(table(["CALL", "SCOPE", "EFFECT", "DECISION", "RULE"],
                    [[r["call"], r["scope"], r["effect"], r["decision"], r["rule"]] for r in rows]))
    return EXIT_OK


def cmd_policy_explain(args: argparse.Namespace) -> int:
    _, registry, policy = _registry_and_policy(args)
    name, _, action = args.call.partition(".")
    tool = registry.get(name)
    if tool is None:
        print(f"mcp-knecht: no tool named {name!r}.", file=sys.stderr)
        return EXIT_USAGE
    if action and action not in tool.actions:
        print(f"mcp-knecht: {name} has no action {action!r}; actions: {', '.join(tool.actions) or 'none'}.",
              file=sys.stderr)
        return EXIT_USAGE
    calls = [action] if action else list(tool.actions or (None,))
    for each in calls:
        decision = policy.decide(tool, each)
        call = f"{name}.{each}" if each else name
        if args.json:
            print(json.dumps({"call": call, "decision": decision.mode, "rule": decision.rule}))
        else:
            print(f"{call}: {decision.mode}  (rule: {decision.rule})")
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
        "explain", help="the decision for TOOL[.ACTION] and the rule that gave it",
        epilog="example: mcp-knecht policy explain project_variable.delete",
    )
    explain.add_argument("call", metavar="TOOL[.ACTION]")
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

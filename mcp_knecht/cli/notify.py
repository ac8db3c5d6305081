"""`mcp-knecht notify …`: try the channels, look at the outbox.

Exit codes: 0 done (every test message taken) · 1 a channel refused or did not answer ·
2 usage or configuration error (an unknown channel, none configured, a bad [notify]).
"""

from __future__ import annotations

import argparse
import json
import uuid
from typing import Any

from mcp_knecht.cli.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, say

_TEST_EPILOG = """\
examples:
  mcp-knecht notify test                 a test message to every channel and the webhook
  mcp-knecht notify test ops             only to channel 'ops'
  mcp-knecht notify test webhook         only to KNECHT_WEBHOOK_URL
"""


async def _test(args: argparse.Namespace) -> int:
    import httpx

    from mcp_knecht.app import open_app
    from mcp_knecht.core.clock import timestamp
    from mcp_knecht.core.settings import load_settings
    from mcp_knecht.errors import DeliveryError
    from mcp_knecht.notify import notify_config
    from mcp_knecht.notify.channels import destinations
    from mcp_knecht.notify.messages import trial_message

    settings = load_settings(db=args.db, config=args.config)
    async with open_app(settings, watch_policy=False) as app:
        config = notify_config(settings, app.registry)
        app.secrets.add(config.secrets)
        names = config.destinations
        if not names:
            say(f"mcp-knecht: no notification channels: add [notify.channels] to {config.source} "
                 "or set KNECHT_WEBHOOK_URL and KNECHT_WEBHOOK_SECRET.")
            return EXIT_USAGE
        if args.channel is not None:
            if args.channel not in names:
                say(f"mcp-knecht: no channel {args.channel!r}; configured: {', '.join(names)}.")
                return EXIT_USAGE
            names = [args.channel]
        results: list[dict[str, Any]] = []
        async with httpx.AsyncClient(follow_redirects=False) as client:
            targets = destinations(config, client)
            for name in names:
                message = trial_message(f"msg_test_{uuid.uuid4().hex}", timestamp(), name)
                try:
                    await targets[name].send(message)
                    results.append({"channel": name, "ok": True})
                except DeliveryError as exc:
                    results.append({"channel": name, "ok": False, "error": app.secrets(exc.message)})
    if args.json:
        print(json.dumps({"results": results}, indent=2))
    else:
        for result in results:
            print(f"{result['channel']}: sent" if result["ok"] else f"{result['channel']}: FAILED: {result['error']}")
    return EXIT_OK if all(r["ok"] for r in results) else EXIT_FAILED


async def _status(args: argparse.Namespace) -> int:
    from mcp_knecht.cli.render import table
    from mcp_knecht.core.settings import load_settings
    from mcp_knecht.notify import outbox
    from mcp_knecht.store import open_database

    settings = load_settings(db=args.db, config=args.config)
    db = await open_database(settings.database_url)
    try:
        report = await outbox.status(db, limit=args.limit)
    finally:
        await db.close()
    if args.json:
        print(json.dumps(report.as_json(), indent=2, ensure_ascii=False))
        return EXIT_OK
    print(f"Events not yet routed: {report.unrouted}")
    if report.oldest_waiting:
        print(f"Oldest undelivered event: {report.oldest_waiting}")
    if report.counts:
        print()
        print(table(["DESTINATION", "STATUS", "DELIVERIES"], [[r["destination"], r["status"], r["n"]]
                                                             for r in report.counts]))
    else:
        print("No deliveries yet.")
    if report.problems:
        print("\nFailed, or retrying (newest first):")
        print(table(["ID", "DESTINATION", "EVENT", "PROPOSAL", "STATUS", "ATTEMPTS", "NEXT TRY (UTC)", "LAST ERROR"],
                    [[p["id"], p["destination"], p["event"], p["proposal_id"], p["status"], p["attempts"],
                      (p["next_attempt_at"] or "")[:19] if p["status"] != "failed" else "",
                      p["last_error"] or ""] for p in report.problems]))
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    import anyio

    return int(anyio.run(_test if args.notify_command == "test" else _status, args))


def add_commands(commands: Any, common: Any) -> None:
    notify = commands.add_parser("notify", help="notification channels: send a test, show the outbox")
    notify_commands = notify.add_subparsers(dest="notify_command", required=True, metavar="COMMAND")
    test = notify_commands.add_parser(
        "test", help="send a test message to one channel (or all); exit 1 if any refused",
        epilog=_TEST_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    test.add_argument("channel", nargs="?", metavar="CHANNEL",
                      help="a channel of [notify.channels], or 'webhook' (default: every one)")
    test.add_argument("--json", action="store_true")
    common(test)
    test.set_defaults(handler=_run)
    status = notify_commands.add_parser(
        "status", help="the outbox: deliveries per channel and status, failures with their last error")
    status.add_argument("--limit", type=int, default=20, help="failed or retrying deliveries to list (default 20)")
    status.add_argument("--json", action="store_true")
    common(status)
    status.set_defaults(handler=_run)

"""`knecht-approve`: operators review staged calls and approve or reject them.

Exit codes: 0 done · 1 the proposal is not pending any more (lost race, expired, unknown id),
or cannot be decided by you now (your own, hash mismatch, still executing) · 2 usage or
configuration error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import anyio

from mcp_knecht.cli.errors import EXIT_FAILED, EXIT_OK, report, say
from mcp_knecht.cli.event_loop import FAST_LOOP
from mcp_knecht.cli.startup_heap import collect_later
from mcp_knecht.cli.terminal import safe_output
from mcp_knecht.errors import KnechtError

if TYPE_CHECKING:
    from mcp_knecht.cli.decisions import Decisions

EXIT_NOT_PENDING = EXIT_FAILED

_EPILOG = """\
examples:
  knecht-approve list                        pending proposals
  knecht-approve list --status failed --json
  knecht-approve show 12                     arguments, hash, current state, diff
  knecht-approve approve 12 --expect-hash 3f9a1c07
                                             runs it, or records your approval when its
                                             rule needs more operators ("1 of 2 approvals")
  knecht-approve reject 12 --reason "rerun the nightly instead"
  knecht-approve watch                       live view of new pending proposals
  knecht-approve settle 12 --outcome failed --reason "no rerun was created"
                                             an execution whose approver died

operators: with KNECHT_OPERATOR_TOKEN set, you decide as that token's (verified)
subject, directly or through --server URL; without one, and only while
KNECHT_OPERATOR_AUTH is `local`, as `local:NAME` (--as NAME, default your login).

exit codes: 0 done, 1 not pending any more (lost race, expired, unknown) or not
yours to approve, 2 usage error
"""


async def _with_decisions(args: argparse.Namespace) -> int:
    from mcp_knecht.cli.decisions import open_decisions
    from mcp_knecht.cli.startup_heap import serving
    from mcp_knecht.core.settings import load_settings

    settings = load_settings(db=args.db, config=args.config)
    async with open_decisions(settings, server=args.server, as_name=args.operator) as decisions:
        serving()
        result: int = await args.run(args, decisions)
        return result


async def _list(args: argparse.Namespace, decisions: Decisions) -> int:
    from mcp_knecht.cli.render import PROPOSAL_HEADERS, proposal_json, proposal_row, table

    found = await decisions.list(status=args.status, limit=args.limit)
    if args.json:
        print(json.dumps([proposal_json(p) for p in found], indent=2, ensure_ascii=False))
    elif found:
        print(table(PROPOSAL_HEADERS, [proposal_row(p) for p in found]))
    else:
        say(f"No {args.status or ''} proposals.".replace("  ", " "))
    return EXIT_OK


async def _show(args: argparse.Namespace, decisions: Decisions) -> int:
    from mcp_knecht.cli.render import proposal_details, proposal_json

    proposal = await decisions.get(args.id)
    print(json.dumps(proposal_json(proposal), indent=2, ensure_ascii=False) if args.json
          else proposal_details(proposal))
    return EXIT_OK


async def _approve(args: argparse.Namespace, decisions: Decisions) -> int:
    from mcp_knecht.cli.render import proposal_json

    proposal = await decisions.approve(args.id, expect_hash=args.expect_hash)
    if args.json:
        print(json.dumps(proposal_json(proposal), indent=2, ensure_ascii=False))
    elif proposal.status == "pending":
        missing = proposal.approvers - len(proposal.approvals)
        print(f"Recorded your approval of #{proposal.id} ({proposal.call_name}): {proposal.quorum}; "
              f"{missing} more operator{'s' if missing != 1 else ''} must approve before it runs.")
    else:
        print(f"Approved #{proposal.id} ({proposal.call_name}); execution {proposal.status}.")
        if proposal.error:
            print(f"Error: {proposal.error}")
        elif proposal.result is not None:
            print(json.dumps(proposal.result, indent=2, ensure_ascii=False))
    return EXIT_OK


async def _reject(args: argparse.Namespace, decisions: Decisions) -> int:
    from mcp_knecht.cli.render import proposal_json

    proposal = await decisions.reject(args.id, reason=args.reason)
    if args.json:
        print(json.dumps(proposal_json(proposal), indent=2, ensure_ascii=False))
    else:
        print(f"Rejected #{proposal.id} ({proposal.call_name}): {proposal.reason}")
    return EXIT_OK


async def _settle(args: argparse.Namespace, decisions: Decisions) -> int:
    from mcp_knecht.cli.render import proposal_json

    proposal = await decisions.settle(args.id, succeeded=args.outcome == "succeeded", reason=args.reason,
                                      force=args.force)
    if args.json:
        print(json.dumps(proposal_json(proposal), indent=2, ensure_ascii=False))
    else:
        print(f"Settled #{proposal.id} ({proposal.call_name}) as {proposal.status}.")
    return EXIT_OK


async def _watch(args: argparse.Namespace, decisions: Decisions) -> int:
    from mcp_knecht.cli.render import proposal_json, proposal_row

    last_seen = 0
    if not args.all:
        newest = await decisions.list(status=None, limit=1)
        last_seen = newest[0].id if newest else 0
    say(f"Watching for new pending proposals (Ctrl-C to stop){'' if args.all else f' after #{last_seen}'}…")
    with anyio.move_on_after(args.timeout):
        while True:
            fresh = await decisions.list(status="pending", after_id=last_seen, limit=100)
            for proposal in sorted(fresh, key=lambda p: p.id):
                if args.json:
                    print(json.dumps(proposal_json(proposal), ensure_ascii=False), flush=True)
                else:
                    print("  ".join(str(v) for v in proposal_row(proposal)[:7]), flush=True)
                last_seen = max(last_seen, proposal.id)
            await anyio.sleep(args.interval)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="knecht-approve",
        description="Review, approve and reject calls that mcp-knecht staged for a human.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", metavar="URL", help="database URL (default $KNECHT_DATABASE_URL or the data dir)")
    common.add_argument("--config", metavar="DIR", help="config dir with policies.toml and scopes/")
    common.add_argument("--server", metavar="URL",
                        help="decide through this server's API (default $KNECHT_SERVER_URL); needs "
                             "$KNECHT_OPERATOR_TOKEN")
    common.add_argument("--as", dest="operator", default=None, metavar="NAME",
                        help="local mode only: the operator name recorded as decided_by (local:NAME; default: your "
                             "login name); never overrides an operator token")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    listing = commands.add_parser("list", parents=[common], help="list proposals (pending by default)")
    listing.add_argument("--status", default="pending",
                         choices=["pending", "approved", "executing", "succeeded", "failed", "rejected", "expired"])
    listing.add_argument("--limit", type=int, default=100)
    listing.set_defaults(run=_list)

    show = commands.add_parser("show", parents=[common], help="one proposal in full")
    show.add_argument("id", type=int)
    show.set_defaults(run=_show)

    approve = commands.add_parser("approve", parents=[common], help="approve and execute exactly once")
    approve.add_argument("id", type=int)
    approve.add_argument("--expect-hash", metavar="PREFIX",
                         help="refuse unless the frozen arguments' hash starts with PREFIX (from `show`)")
    approve.set_defaults(run=_approve)

    reject = commands.add_parser("reject", parents=[common], help="reject with a reason the agent will see")
    reject.add_argument("id", type=int)
    reject.add_argument("--reason", required=True)
    reject.set_defaults(run=_reject)

    from mcp_knecht.core.approval import SETTLE_AFTER

    minutes = int(SETTLE_AFTER.total_seconds() // 60)
    settle = commands.add_parser(
        "settle", parents=[common],
        help="record the outcome of an execution whose approver stopped (outcome unknown); runs nothing",
    )
    settle.add_argument("id", type=int)
    settle.add_argument("--outcome", required=True, choices=["succeeded", "failed"],
                        help="what you found when you checked the effect by hand")
    settle.add_argument("--reason", required=True, help="what you checked")
    settle.add_argument("--force", action="store_true",
                        help=f"settle although it started less than {minutes} minutes ago")
    settle.set_defaults(run=_settle)

    watch = commands.add_parser("watch", parents=[common], help="print new pending proposals as they arrive")
    watch.add_argument("--interval", type=float, default=1.0, help="seconds between looks (default 1)")
    watch.add_argument("--timeout", type=float, default=None, help="stop after this many seconds")
    watch.add_argument("--all", action="store_true", help="also print those already pending")
    watch.set_defaults(run=_watch)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    with safe_output():  # proposals carry text an agent chose: it must not rewrite the terminal
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    collect_later()
    try:
        return anyio.run(_with_decisions, args, backend_options=FAST_LOOP)
    except KnechtError as exc:
        return report("knecht-approve", exc)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

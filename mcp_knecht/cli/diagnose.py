"""`mcp-knecht diagnose RUN_ID [--json] [--again]`: why a run failed, from the configured model.

Prints the stored diagnosis, or makes one now (the feature `failure-diagnosis`, acting with the
read scopes it needs and audited as `feature:failure-diagnosis`). Exit 0 with a diagnosis, 1 when
none could be made (no model configured, the model failed, the run does not exist or did not fail),
2 on usage errors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
WAIT_FOR_OTHERS = 180.0
"""How long to wait when another process (a server's worker) is diagnosing the same run."""

_EPILOG = """\
examples:
  mcp-knecht diagnose 42                 the cause and most likely fix, and the actions showing it
  mcp-knecht diagnose 42 --json          {"run_id", "status", "summary", "actionIds", "model"}
  mcp-knecht diagnose 42 --again         ask the model again, replacing the stored diagnosis
  KNECHT_MODEL_DEFAULT=anthropic:claude-haiku-4-5 ANTHROPIC_API_KEY=... mcp-knecht diagnose 42
"""


async def _diagnose(args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    import anyio

    from mcp_knecht.ai.diagnosis import DIAGNOSIS_SCOPES
    from mcp_knecht.app import open_app
    from mcp_knecht.core.actor import Actor
    from mcp_knecht.core.settings import load_settings
    from mcp_knecht.errors import ConflictError, NotFoundError

    settings = load_settings(db=args.db, config=args.config)
    actor = Actor(subject=os.environ.get("USER") or "operator", client="mcp-knecht-cli", scopes=DIAGNOSIS_SCOPES)
    async with open_app(settings, watch_policy=False) as app:
        try:
            shown = await app.ai.diagnoses.request(args.run_id, actor, again=args.again)
            with anyio.move_on_after(WAIT_FOR_OTHERS):
                while shown["status"] == "pending":  # another process holds the claim
                    await anyio.sleep(0.5)
                    shown = await app.ai.diagnoses.stored(args.run_id) or shown
        except (NotFoundError, ConflictError) as exc:
            return {"status": "failed", "error": exc.message}, EXIT_FAILED
    return shown, EXIT_OK if shown["status"] == "done" else EXIT_FAILED


def cmd_diagnose(args: argparse.Namespace) -> int:
    import anyio

    if args.run_id < 1:
        print("mcp-knecht: RUN_ID is a positive number, e.g. 42.", file=sys.stderr)
        return EXIT_USAGE
    shown, code = anyio.run(_diagnose, args)
    if args.json:
        out = {"run_id": args.run_id, "status": shown["status"], "summary": shown.get("summary"),
               "actionIds": shown.get("actionIds", []), "model": shown.get("model")}
        if "error" in shown:
            out["error"] = shown["error"]
        print(json.dumps(out, indent=2, ensure_ascii=False))
    elif shown["status"] == "done":
        print(f"Run {args.run_id} ({shown['model']}):\n{shown['summary']}")
        if shown["actionIds"]:
            print(f"Actions showing it: {', '.join(str(i) for i in shown['actionIds'])}")
    else:
        print(f"mcp-knecht: no diagnosis for run {args.run_id} ({shown['status']}): "
              f"{shown.get('error') or shown.get('summary')}", file=sys.stderr)
    return code


def add_command(commands: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    parser = commands.add_parser(
        "diagnose", help="why a failed run failed (AI feature failure-diagnosis)", epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run_id", metavar="RUN_ID", type=int, help="the id of a failed run")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.add_argument("--again", action="store_true", help="diagnose anew even when one is stored")
    common(parser)
    parser.set_defaults(handler=cmd_diagnose)

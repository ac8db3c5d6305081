"""What the chat says that no model writes: the system prompt with seed 000's rules, the fixed reply
when a turn ends with a proposal, and the follow-up message after a decision (seed 004, 3a/3b)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from mcp_knecht.core.proposals import Proposal

MAX_ROUNDS = 5
"""Rounds of tool calls one turn may make; asking for a sixth is an error for the turn."""
FOLLOW_UP_PREFIX = "Update from Knecht on proposal #"
_MAX_RESULT_CHARS = 1_000

SYSTEM_PROMPT = f"""\
You are Knecht's assistant. You help the person you talk with understand and work with the data \
this server gives you tools for (CI projects, workflows, runs and their logs, or an application's records).

Rules you always follow:
- You never create, change or delete data yourself.
- The tools that only read run at once: use them to look things up before you answer. You may use \
tools in at most {MAX_ROUNDS} rounds per message, so ask for what you need together.
- A tool that would change something is never run by you: calling it prepares a proposal, the page \
of that proposal opens for the person, and a human with the right to decide approves or rejects it \
there. Call such a tool only when the person asks for that change, at most one per message, and \
only once you know its exact arguments: your turn ends with that call.
- Never invent tool names, field names or record ids: use only the tools you are given, and only \
ids you read with them or the person gave you. If you cannot find something, say so.
- Answer in the language the person writes in. Be brief and concrete.
- A message that starts with "{FOLLOW_UP_PREFIX}" comes from Knecht, not from the person: it tells you \
how a proposal you prepared was decided and what came of it. Tell the person in one or two sentences, \
then continue where you left off; do not propose the same change again unless the person asks."""

ROUND_LIMIT = (f"The assistant needed more than {MAX_ROUNDS} rounds of looking things up for this message and "
               "stopped; nothing was changed. Ask a narrower question.")
ROUND_LIMIT_RULE = f"chat: at most {MAX_ROUNDS} rounds of tool calls per turn"


def staged_reply(proposal: Proposal, *, created: bool) -> str:
    """The fixed reply of a turn that ended with a proposal: the server's words, not the model's."""
    if not created:
        return (f"This exact change is already waiting for approval as proposal #{proposal.id} "
                f"({proposal.call_name}); nothing new was prepared. Its page is open: nothing changes until "
                "someone approves it, and I will continue here once it is decided.")
    return (f"I've prepared this change as proposal #{proposal.id} ({proposal.call_name}); nothing has changed yet. "
            "Please review it on its page, which is open now: it runs only when someone with the right to decide "
            "approves it, and I will continue here once it is decided.")


def gave_up_reply(error: str) -> str:
    return (f"I could not continue after this decision ({error[:300]}). Write to me to pick up from here.")


def _outcome(data: Any, scrub: Callable[[str], str]) -> str:
    text = scrub(json.dumps(data, ensure_ascii=False, default=str))
    return text if len(text) <= _MAX_RESULT_CHARS else text[:_MAX_RESULT_CHARS] + " …(cut)"


def follow_up_message(proposal: Proposal, scrub: Callable[[str], str]) -> str:
    """Seed 004's follow-up: "your action X was approved and executed, result: Y — carry on", or the
    rejection with its reason, the failure with its error, the expiry."""
    head = f"{FOLLOW_UP_PREFIX}{proposal.id} ({proposal.call_name}): "
    who = f" by {proposal.decided_by}" if proposal.decided_by else ""
    if proposal.status == "succeeded":
        body = f"approved{who} and executed. Result: {_outcome(proposal.result, scrub)}."
    elif proposal.status == "failed":
        body = f"approved{who}, but the execution failed: {scrub(proposal.error or 'no error recorded')}."
    elif proposal.status == "rejected":
        body = f"rejected{who}. Reason: {scrub(proposal.reason or 'none given')}. Nothing was changed."
    elif proposal.status == "expired":
        body = f"expired at {proposal.expires_at} without a decision. Nothing was changed."
    else:
        body = f"{proposal.shown_status}."
    return head + body + " Continue from here."

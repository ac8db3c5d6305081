"""The events: which proposal state change is told, and the facts each event carries.

    status reached      event                 told to
    pending             proposal.pending      the approvers' route (rule → Tool.Action → Tool → default)
    approved, rejected  proposal.decided      the proposer's channels
    (executing)         (the approval that completes a quorum claims and starts in one commit: decided)
    succeeded           proposal.executed     the proposer's channels
    failed              proposal.failed       the proposer's channels
    expired             proposal.expired      the proposer's channels

Every event also goes to the signed webhook when one is configured.

The payload is a snapshot taken inside the transaction of the change, so a message says what
was true then, not what is true when it is delivered. It holds the arguments only as the
masked summary (from `arguments_shown`, never the exact frozen arguments) and passes the
scrubber as a whole.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any, Final

from mcp_knecht.core.proposals import Proposal

PENDING: Final = "proposal.pending"
DECIDED: Final = "proposal.decided"
EXECUTED: Final = "proposal.executed"
FAILED: Final = "proposal.failed"
EXPIRED: Final = "proposal.expired"

EVENTS: tuple[str, ...] = (PENDING, DECIDED, EXECUTED, FAILED, EXPIRED)
PROPOSER_EVENTS: frozenset[str] = frozenset({DECIDED, EXECUTED, FAILED, EXPIRED})

EVENT_FOR_STATUS: Mapping[str, str] = {
    "pending": PENDING,
    "approved": DECIDED,
    "executing": DECIDED,
    "rejected": DECIDED,
    "succeeded": EXECUTED,
    "failed": FAILED,
    "expired": EXPIRED,
}

HASH_PREFIX = 12
MAX_SUMMARY = 300
MAX_VALUE = 60
MAX_TEXT = 500


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@lru_cache(maxsize=256)  # a decision's events (decided, then executed) summarise the same arguments
def summarise_arguments(shown_json: str) -> str:
    """`key=value, …` on one line, each value and the whole bounded: for a message, not a record."""
    try:
        arguments = json.loads(shown_json)
    except ValueError:
        return _clip(shown_json, MAX_SUMMARY)
    if not isinstance(arguments, dict):
        return _clip(json.dumps(arguments, ensure_ascii=False), MAX_SUMMARY)
    parts = [f"{key}={_clip(json.dumps(value, ensure_ascii=False), MAX_VALUE)}"
             for key, value in sorted(arguments.items())]
    return _clip(", ".join(parts), MAX_SUMMARY)


def snapshot(proposal: Proposal, event: str, scrub: Callable[[str], str]) -> str:
    """The facts of `event` about `proposal`, masked, as the JSON text the outbox stores. The exact
    frozen arguments never enter: only `arguments_shown` (the scrubbed form). Every text is scrubbed
    whole before it is cut short, so that no secret can survive as an unrecognisable fragment, and
    the result again; a result the scrubber changed is parsed once more, so that a mask can never
    leave the outbox a row its router cannot read."""
    shown = scrub(proposal.arguments_shown or proposal.arguments_json)
    facts: dict[str, Any] = {
        "id": proposal.id,
        "tool": proposal.tool,
        "action": proposal.action,
        "call": proposal.call_name,
        "status": proposal.status,
        "proposer": {"subject": proposal.proposer_subject, "client": proposal.proposer_client},
        "arguments": summarise_arguments(shown),
        "arguments_hash": proposal.arguments_hash[:HASH_PREFIX],
        "rule": proposal.rule,
        "created_at": proposal.created_at,
        "expires_at": proposal.expires_at,
    }
    if proposal.policy_reason:  # the policy rule's `reason`, shown to the operator
        facts["policy_reason"] = _clip(scrub(proposal.policy_reason), MAX_TEXT)
    if proposal.approvers != 1:
        facts["approvers"] = proposal.approvers
    if event == DECIDED:
        decision = "rejected" if proposal.status == "rejected" else "approved"  # or approved and executing
        facts.update(decision=decision, decided_by=proposal.decided_by, decided_at=proposal.decided_at,
                     reason=_clip(scrub(proposal.reason), MAX_TEXT) if proposal.reason else None)
    elif event in (EXECUTED, FAILED):
        facts.update(decided_by=proposal.decided_by, finished_at=proposal.finished_at)
        if proposal.error:
            facts["error"] = _clip(scrub(proposal.error), MAX_TEXT)
    text = json.dumps(facts, ensure_ascii=False)
    masked = scrub(text)
    return text if masked == text else json.dumps(json.loads(masked), ensure_ascii=False)

"""What a person and what a machine receive for an event: a title and a text, or a JSON body.

Rendered at delivery time from the stored snapshot (the link comes from the delivering server's
configuration), and scrubbed once more on the way out.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Literal

import msgspec

from mcp_knecht.notify.events import DECIDED, EXECUTED, EXPIRED, FAILED, PENDING

Severity = Literal["info", "success", "warning", "failure"]
TEST_EVENT = "notify.test"


class Message(msgspec.Struct, frozen=True):
    """An event rendered for people: a title and a body, with the event's stable id."""
    uid: str
    """The event's stable id: the webhook's `webhook-id`, the same on every retry (receivers dedupe on it)."""
    event: str
    title: str
    body: str
    severity: Severity
    json_body: str
    """The webhook body: `{"type": event, "timestamp": …, "data": {…, "link": …}}`."""


def proposal_link(proposal_id: object, public_url: str | None) -> str:
    """The web page of the proposal, or the command that shows it when there is no public URL."""
    if public_url:
        return f"{public_url.rstrip('/')}/proposals/{proposal_id}"
    return f"knecht-approve show {proposal_id}"


def _who(facts: Mapping[str, Any]) -> str:
    proposer = facts.get("proposer") or {}
    return f"{proposer.get('subject', '?')} ({proposer.get('client', '?')})"


def _text(event: str, facts: Mapping[str, Any], link: str) -> tuple[str, list[str], Severity]:
    ref = f"#{facts['id']} {facts['call']}"
    review = f"Review: {link}" if link.startswith(("http://", "https://")) else f"Review with: {link}"
    details = [f"Arguments: {facts.get('arguments') or '(none)'}", f"Hash: {facts.get('arguments_hash')}…"]
    if event == PENDING:
        why = [f"Why: {facts['policy_reason']}"] if facts.get("policy_reason") else []
        quorum = [f"Needs {facts['approvers']} different operators."] if facts.get("approvers") else []
        return (f"Approval needed: {ref}",
                [f"{_who(facts)} proposes {facts['call']}; it waits for an operator until {facts['expires_at']}.",
                 *why, *quorum, *details, f"Policy rule: {facts.get('rule')}", review], "info")
    if event == DECIDED:
        verdict = "approved" if facts.get("decision") == "approved" else "rejected"
        lines = [f"{ref}, proposed by {_who(facts)}, was {verdict} by {facts.get('decided_by')}."]
        if facts.get("reason"):
            lines.append(f"Reason: {facts['reason']}")
        return f"{ref} {verdict} by {facts.get('decided_by')}", [*lines, *details, f"Details: {link}"], (
            "info" if verdict == "approved" else "warning")
    if event == EXECUTED:
        return (f"{ref} executed", [f"{ref}, approved by {facts.get('decided_by')}, ran and succeeded.",
                                    *details, f"Details: {link}"], "success")
    if event == FAILED:
        return (f"{ref} failed", [f"{ref}, approved by {facts.get('decided_by')}, failed.",
                                  f"Error: {facts.get('error') or '(none recorded)'}", *details,
                                  f"Details: {link}"], "failure")
    if event == EXPIRED:
        return (f"{ref} expired", [f"{ref}, proposed by {_who(facts)}, expired at {facts['expires_at']} "
                                   "without a decision; nothing ran.", *details, f"Details: {link}"], "warning")
    return f"mcp-knecht: {event}", [json.dumps(dict(facts), ensure_ascii=False)], "info"


def render(uid: str, event: str, facts: Mapping[str, Any], created_at: str, *, public_url: str | None,
           scrub: Callable[[str], str]) -> Message:
    link = proposal_link(facts.get("id"), public_url)
    title, lines, severity = _text(event, facts, link)
    body = {"type": event, "timestamp": created_at, "data": {**facts, "link": link}}
    return Message(uid=uid, event=event, title=scrub(title), body=scrub("\n".join(lines)), severity=severity,
                   json_body=scrub(json.dumps(body, ensure_ascii=False, sort_keys=True)))


def trial_message(uid: str, created_at: str, channel: str) -> Message:
    """What `mcp-knecht notify test` sends: no proposal, nothing secret."""
    body = {"type": TEST_EVENT, "timestamp": created_at,
            "data": {"channel": channel, "text": "A test message from mcp-knecht."}}
    return Message(uid=uid, event=TEST_EVENT, title="mcp-knecht: test message",
                   body=f"Channel {channel!r} works: mcp-knecht can reach it.", severity="info",
                   json_body=json.dumps(body, sort_keys=True))

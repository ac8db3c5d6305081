"""Follow-up for agents: what became of the proposals they submitted.

A proposal of another subject answers exactly like one that does not exist.
"""

from __future__ import annotations

from typing import Any

import anyio
from pydantic import Field

from mcp_knecht.core import clock
from mcp_knecht.core.changes import ChangeFeed
from mcp_knecht.core.proposals import DECIDED, OPEN, STATUSES, Proposal, ProposalRepository, Status
from mcp_knecht.core.scrub import Masked
from mcp_knecht.core.toolset import (
    InvalidArgumentsError,
    NotFoundError,
    Tool,
    ToolContext,
    ToolInput,
    Toolset,
    ToolsetContext,
)

MAX_WAIT_SECONDS = 50  # clients time out near 60 s


class GetProposalInput(ToolInput):
    id: int = Field(ge=1, description="The proposal id from 'Submitted for approval (#ID)'.")
    wait_seconds: int = Field(
        default=0, ge=0, le=MAX_WAIT_SECONDS,
        description=f"Wait up to this many seconds (at most {MAX_WAIT_SECONDS}) for a decision and its "
        "outcome before answering; 0 answers at once.",
    )


class ListProposalsInput(ToolInput):
    status: Status | None = Field(
        default=None, description="Only proposals with this status: " + ", ".join(STATUSES) + ".",
    )
    limit: int = Field(default=20, ge=1, le=50, description="How many, newest first (1-50).")
    before: int | None = Field(
        default=None, ge=1, description="Paging: only proposals with an id lower than this (the last id of "
        "the previous page); omit for the newest.")
    unseen: bool = Field(
        default=False,
        description="Only your decided proposals (succeeded, failed, rejected, expired) whose outcome you have "
        "not seen yet, oldest first; each is returned once and then counts as seen. Check this at the start "
        "of a session.",
    )


GET_PROPOSAL = """\
Get one of your proposals (a staged call awaiting human approval) by id: its status (pending, \
approved, executing, succeeded, failed, rejected, expired), who decided and when, the rejection \
reason, and the result or error of its execution. With wait_seconds > 0 it waits (up to 50 s) for a \
decision and the outcome, so call it again if it is still pending. 'executing' that does not change \
means the approver stopped mid-way and the outcome is unknown; it is never re-run by itself."""

LIST_PROPOSALS = """\
List your own proposals, newest first, optionally only those with one status. Use it to find out \
which of your staged calls were approved, rejected or have expired. With unseen=true it is your inbox: \
the decisions you have not seen yet (each returned once) — call it at the start of a session."""


def shown(proposal: Proposal) -> dict[str, Any]:
    """A proposal as its proposer's agent sees it. Its arguments were masked when it was staged
    (secret arguments, and every secret but what the proposer sent itself): masking them again
    now would tell the proposer which of its own values are secrets."""
    public = proposal.public()
    return {**public, "arguments": Masked(public["arguments"])}


def _own(proposal: Proposal | None, subject: str, proposal_id: int) -> Proposal:
    if proposal is None or proposal.proposer_subject != subject:
        raise NotFoundError(f"Proposal #{proposal_id} does not exist.")
    return proposal


def followup_tools(proposals: ProposalRepository, changes: ChangeFeed) -> list[Tool]:
    async def _read(proposal_id: int, subject: str) -> Proposal:
        return _own(await proposals.get(proposal_id), subject, proposal_id)

    async def seen(proposal: Proposal) -> dict[str, Any]:
        """The outcome as the agent sees it now; a decided one leaves the agent's inbox."""
        if proposal.status in DECIDED:
            await proposals.mark_seen(proposal.id)
        return shown(proposal)

    async def get_proposal(args: GetProposalInput, ctx: ToolContext) -> dict[str, Any]:
        proposal = await _read(args.id, ctx.actor.subject)
        if proposal.status not in OPEN or not args.wait_seconds:
            return await seen(proposal)
        with anyio.move_on_after(args.wait_seconds):
            # Subscribe first, then read again: a decision committed in between still wakes us.
            async with changes.watching("proposals", args.id) as wakeups:
                proposal = await _read(args.id, ctx.actor.subject)
                while proposal.status in OPEN:
                    # Nobody announces an expiry: wake when it falls due, to see it expire. (An expiry rewritten
                    # around the store as no moment never falls due: the row reads as pending, its seal refuses it.)
                    due = clock.seconds_until(proposal.expires_at) if proposal.status == "pending" else None
                    await wakeups.wait(max(0.0, min(60.0 if due is None else due + 0.01, MAX_WAIT_SECONDS)))
                    proposal = await _read(args.id, ctx.actor.subject)
        return await seen(proposal)

    async def list_proposals(args: ListProposalsInput, ctx: ToolContext) -> dict[str, Any]:
        if args.unseen:
            if args.status is not None:
                raise InvalidArgumentsError("list_proposals", [
                    {"field": "status", "problem": "give either unseen or status, not both"}])
            return {"proposals": [shown(p) for p in await proposals.take_unseen(ctx.actor.subject, args.limit)]}
        found = await proposals.list(status=args.status, subject=ctx.actor.subject, limit=args.limit,
                                     before_id=args.before)
        return {"proposals": [shown(p) for p in found]}

    return [
        Tool(name="get_proposal", description=GET_PROPOSAL, scope="proposals:read", input_model=GetProposalInput,
             handler=get_proposal, title="Get one of your proposals"),
        Tool(name="list_proposals", description=LIST_PROPOSALS, scope="proposals:read",
             input_model=ListProposalsInput, handler=list_proposals, title="List your proposals"),
    ]


INSTRUCTIONS = (
    "Tools that change something may be staged: the call returns 'Submitted for approval (#ID)' at once and "
    "a human decides later; that is not a failure. Follow up with get_proposal (it can wait for the decision) "
    "or list_proposals when you need the outcome. At the start of a session, call "
    "list_proposals(unseen=true): it returns the decisions on your earlier proposals you have not seen yet."
)


def toolset(context: ToolsetContext) -> Toolset:
    return Toolset(name="proposals", tools=followup_tools(context.proposals, context.changes),
                   instructions=INSTRUCTIONS)

"""Proposals as MCP resources (`knecht://proposals/{id}`), and notifications when one changes.

Clients on 2026-07-28 `subscriptions/listen` for the URI; clients on 2025-11-25
`resources/subscribe` to it. Either way only the proposer may subscribe or read: another
subject's proposal answers exactly like a missing one.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated
from mcp.shared.exceptions import MCPError

from mcp_knecht.core.actor import Actor
from mcp_knecht.core.proposal_watch import ProposalWatcher, StatusChange
from mcp_knecht.core.proposals import Proposal, ProposalRepository

logger = logging.getLogger(__name__)

URI_PREFIX = "knecht://proposals/"
_URI = re.compile(r"^knecht://proposals/([1-9][0-9]{0,17})$")


def proposal_uri(proposal_id: int) -> str:
    return f"{URI_PREFIX}{proposal_id}"


class ProposalFeed:
    def __init__(self, proposals: ProposalRepository, watcher: ProposalWatcher | None) -> None:
        self._proposals = proposals
        self._bus = InMemorySubscriptionBus()
        self._listen = ListenHandler(self._bus)
        self._legacy: dict[str, set[Any]] = {}
        if watcher is not None:
            watcher.subscribe(self.announce)

    async def _own(self, uri: str, actor: Actor | None) -> Proposal:
        match = _URI.match(uri)
        proposal = await self._proposals.get(int(match[1])) if match else None
        if proposal is None or actor is None or proposal.proposer_subject != actor.subject:
            raise MCPError(types.INVALID_PARAMS, f"Unknown resource: {uri[:200]!r}.")
        return proposal

    async def announce(self, change: StatusChange) -> None:
        uri = proposal_uri(change.proposal_id)
        await self._bus.publish(ResourceUpdated(uri=uri))
        for session in list(self._legacy.get(uri, ())):
            try:
                await session.send_resource_updated(uri)
            except Exception:  # the client went away
                self._legacy[uri].discard(session)

    def handlers(self, resolve_actor: Any) -> dict[str, Any]:
        """The `Server(...)` keyword arguments that serve proposals as resources."""

        async def list_templates(
            ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
        ) -> types.ListResourceTemplatesResult:
            return types.ListResourceTemplatesResult(resource_templates=[types.ResourceTemplate(
                name="proposal", uri_template=URI_PREFIX + "{id}", mime_type="application/json",
                description="One of your proposals; subscribe to be told when it is decided and executed.",
            )])

        async def list_resources(
            ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
        ) -> types.ListResourcesResult:
            actor = resolve_actor(ctx)
            mine = await self._proposals.list(subject=actor.subject, limit=50) if actor else []
            return types.ListResourcesResult(resources=[
                types.Resource(name=f"proposal-{p.id}", uri=proposal_uri(p.id), mime_type="application/json",
                               description=f"{p.call_name}: {p.status}") for p in mine
            ])

        async def read(
            ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
        ) -> types.ReadResourceResult:
            proposal = await self._own(str(params.uri), resolve_actor(ctx))
            return types.ReadResourceResult(contents=[types.TextResourceContents(
                uri=str(params.uri), mime_type="application/json",
                text=json.dumps(proposal.public(), ensure_ascii=False),
            )])

        async def subscribe(
            ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams
        ) -> types.EmptyResult:
            uri = str(params.uri)
            await self._own(uri, resolve_actor(ctx))
            self._legacy.setdefault(uri, set()).add(ctx.session)
            return types.EmptyResult()

        async def unsubscribe(
            ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams
        ) -> types.EmptyResult:
            self._legacy.get(str(params.uri), set()).discard(ctx.session)
            return types.EmptyResult()

        async def listen(
            ctx: ServerRequestContext[Any], params: types.SubscriptionsListenRequestParams
        ) -> types.SubscriptionsListenResult:
            actor = resolve_actor(ctx)
            for uri in params.notifications.resource_subscriptions or ():
                await self._own(uri, actor)
            return await self._listen(ctx, params)

        return {
            "on_list_resource_templates": list_templates,
            "on_list_resources": list_resources,
            "on_read_resource": read,
            "on_subscribe_resource": subscribe,
            "on_unsubscribe_resource": unsubscribe,
            "on_subscriptions_listen": listen,
        }

"""Proposals as MCP resources (`knecht://proposals/{id}`), and notifications when one changes.

Clients on 2026-07-28 `subscriptions/listen` for the URI; clients on 2025-11-25
`resources/subscribe` to it. A resource is what `get_proposal` answers, and every read, list and
subscription goes through the gate as `get_proposal` / `list_proposals`: it needs scope
`proposals:read`, is audited, shows the same (effective) status, and another subject's proposal
answers exactly like a missing one.

Legacy subscriptions belong to the client's connection (the SDK builds a new session object for
every request, so that object cannot be the key): `resources/unsubscribe` ends one, subscribing
twice notifies once, and they are dropped when the proposal reaches its final state.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated
from mcp.shared.exceptions import MCPError

from mcp_knecht.core.actor import Actor
from mcp_knecht.core.gate import Gate, GateResult
from mcp_knecht.core.proposal_watch import ProposalWatcher, StatusChange
from mcp_knecht.core.proposals import OPEN
from mcp_knecht.core.settings import DEFAULT_SESSIONS_PER_SUBJECT
from mcp_knecht.core.tools import MCP
from mcp_knecht.core.validation import label

logger = logging.getLogger(__name__)

URI_PREFIX = "knecht://proposals/"
_URI = re.compile(r"^knecht://proposals/([1-9][0-9]{0,17})$")
PAGE_SIZE = 50


def proposal_uri(proposal_id: int) -> str:
    return f"{URI_PREFIX}{proposal_id}"


def _unknown(uri: str) -> MCPError:
    return MCPError(types.INVALID_PARAMS, f"Unknown resource: {label(uri, 200)!r}.")


def _connection(ctx: ServerRequestContext[Any]) -> object:
    """What identifies the client's connection across its requests (the SDK's per-connection
    object behind the per-request session)."""
    return getattr(ctx.session, "_connection", ctx.session)


class ProposalFeed:
    def __init__(self, gate: Gate, watcher: ProposalWatcher | None, *,
                 listens_per_subject: int = DEFAULT_SESSIONS_PER_SUBJECT) -> None:
        self._gate = gate
        self._bus = InMemorySubscriptionBus()
        self._listen = ListenHandler(self._bus)
        self._legacy: dict[str, dict[object, Any]] = {}  # uri → connection → a session to send through
        self._listens: Counter[str] = Counter()
        self._listens_per_subject = listens_per_subject
        if watcher is not None:
            watcher.subscribe(self.announce)

    async def _read(self, uri: str, actor: Actor | None) -> GateResult:
        """The proposal as `get_proposal` shows it to `actor` (through the gate: scope, audit)."""
        match = _URI.match(uri)
        if match is None or actor is None:
            raise _unknown(uri)
        result = await self._gate.call_tool(actor, "get_proposal", {"id": int(match[1])}, source=MCP)
        if result.is_error:
            raise _unknown(uri)
        return result

    async def announce(self, change: StatusChange) -> None:
        uri = proposal_uri(change.proposal_id)
        await self._bus.publish(ResourceUpdated(uri=uri))
        subscribers = self._legacy.get(uri, {})
        for connection, session in list(subscribers.items()):
            try:
                await session.send_resource_updated(uri)
            except Exception:  # the client went away
                subscribers.pop(connection, None)
        if change.status not in OPEN:  # final: nothing more will be announced for it
            self._legacy.pop(uri, None)

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
            cursor = params.cursor if params is not None else None
            if cursor is not None and not (cursor.isascii() and cursor.isdigit() and 0 < len(cursor) <= 18):
                raise MCPError(types.INVALID_PARAMS, "Invalid cursor: pass the nextCursor of the previous page.")
            if actor is None:
                return types.ListResourcesResult(resources=[])
            arguments: dict[str, Any] = {"limit": PAGE_SIZE, **({"before": int(cursor)} if cursor else {})}
            result = await self._gate.call_tool(actor, "list_proposals", arguments, source=MCP)
            mine = (result.data or {}).get("proposals", []) if not result.is_error else []
            return types.ListResourcesResult(
                resources=[types.Resource(
                    name=f"proposal-{p['id']}", uri=proposal_uri(p["id"]), mime_type="application/json",
                    description=f"{p['tool']}{'.' + p['action'] if p.get('action') else ''}: {p['status']}",
                ) for p in mine],
                next_cursor=str(mine[-1]["id"]) if len(mine) == PAGE_SIZE else None,
            )

        async def read(
            ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
        ) -> types.ReadResourceResult:
            result = await self._read(str(params.uri), resolve_actor(ctx))
            return types.ReadResourceResult(contents=[types.TextResourceContents(
                uri=str(params.uri), mime_type="application/json", text=result.text,
            )])

        async def subscribe(
            ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams
        ) -> types.EmptyResult:
            uri = str(params.uri)
            await self._read(uri, resolve_actor(ctx))
            self._legacy.setdefault(uri, {})[_connection(ctx)] = ctx.session
            return types.EmptyResult()

        async def unsubscribe(
            ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams
        ) -> types.EmptyResult:
            uri = str(params.uri)
            subscribers = self._legacy.get(uri)
            if subscribers is not None:
                subscribers.pop(_connection(ctx), None)
                if not subscribers:
                    del self._legacy[uri]
            return types.EmptyResult()

        async def listen(
            ctx: ServerRequestContext[Any], params: types.SubscriptionsListenRequestParams
        ) -> types.SubscriptionsListenResult:
            actor = resolve_actor(ctx)
            if actor is None:
                raise MCPError(types.INVALID_PARAMS, "Not authenticated.")
            for uri in params.notifications.resource_subscriptions or ():
                await self._read(uri, actor)
            subject = actor.subject
            if self._listens[subject] >= self._listens_per_subject:
                raise MCPError(types.INVALID_REQUEST, f"Too many open listen streams for {label(subject)!r} "
                               f"({self._listens_per_subject}); close one first.")
            self._listens[subject] += 1
            try:
                return await self._listen(ctx, params)
            finally:
                self._listens[subject] -= 1
                if not self._listens[subject]:
                    del self._listens[subject]

        return {
            "on_list_resource_templates": list_templates,
            "on_list_resources": list_resources,
            "on_read_resource": read,
            "on_subscribe_resource": subscribe,
            "on_unsubscribe_resource": unsubscribe,
            "on_subscriptions_listen": listen,
        }

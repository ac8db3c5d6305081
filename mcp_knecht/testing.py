"""Test helpers for mcp-knecht and for toolset authors, shipped with the product (as
`structlog.testing` is): a real app over a real store, the MCP SDK's own client in memory, and
operators who decide proposals through the real approval service.

    async with running_app(env) as app:                       # settings from an environment
        async with connect(app, actor("alice", ["runs:read"])) as client:
            result = await client.call_tool("list_runs", {})
        await approve(app, proposal_id, "bob")
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Literal

from mcp import Client

from mcp_knecht.app import App, open_app
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.approval import ApprovalService, Operator
from mcp_knecht.core.proposals import Proposal
from mcp_knecht.core.settings import load_settings
from mcp_knecht.transports.mcp_server import server_for_app

ProtocolMode = Literal["auto", "legacy"]
"""`auto`: the sessionless 2026-07-28 protocol; `legacy`: the `initialize` handshake of 2025-11-25."""


def actor(subject: str = "alice", scopes: Iterable[str] = (), claims: Mapping[str, Any] | None = None,
          client: str = "pytest") -> Actor:
    """A caller as a verified token would make it (claims such as an entities role included)."""
    return Actor(subject, client, frozenset(scopes), {"sub": subject, **(claims or {})})


@asynccontextmanager
async def running_app(env: Mapping[str, str], *, watch: bool = False) -> AsyncIterator[App]:
    """The server's app over the settings in `env` (background watchers only with `watch`)."""
    async with open_app(load_settings(env=env), watch_policy=watch) as app:
        yield app


@asynccontextmanager
async def connect(app: App, caller: Actor, *, mode: ProtocolMode = "auto") -> AsyncIterator[Client]:
    """The MCP SDK's client, in memory, talking to `app` as `caller`."""
    async with Client(server_for_app(app, lambda ctx: caller), mode=mode) as client:
        yield client


def approvals(app: App) -> ApprovalService:
    return app.approvals


async def approve(app: App, proposal_id: int, operator: str = "bob", *, expect_hash: str | None = None) -> Proposal:
    """Approve (and so execute) a proposal as `operator`, a verified operator."""
    return await app.approvals.approve(proposal_id, Operator(operator, verified=True), expect_hash=expect_hash)


async def reject(app: App, proposal_id: int, reason: str, operator: str = "bob") -> Proposal:
    return await app.approvals.reject(proposal_id, Operator(operator, verified=True), reason)

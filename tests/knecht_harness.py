"""A Knecht server for tests: the app over the demo database, a gate with the secret scrubber,
the SDK client in memory, and an approver. (Until `open_app(scrub=…)` exists, the gate is built here.)"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from mcp import Client

from mcp_knecht.app import App, load_toolsets
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.approval import ApprovalService, Operator
from mcp_knecht.core.gate import Gate
from mcp_knecht.core.proposals import Proposal
from mcp_knecht.core.registry import Registry
from mcp_knecht.core.scrub import SecretRegistry
from mcp_knecht.core.staging import ProposalStager
from mcp_knecht.knecht import secret_values, toolset
from mcp_knecht.transports.mcp_server import build_mcp_server

AGENT = (
    "projects:read", "workflows:read", "workflows:write", "runs:read", "runs:write",
    "logs:read", "variables:read", "variables:write", "proposals:read",
)


@dataclass
class Knecht:
    app: App
    gate: Gate
    secrets: SecretRegistry
    approvals: ApprovalService

    @asynccontextmanager
    async def connect(self, subject: str = "alice", scopes: Iterable[str] = AGENT) -> AsyncIterator[Client]:
        actor = Actor(subject, "pytest", frozenset(scopes))
        async with Client(build_mcp_server(self.gate, lambda ctx: actor)) as client:
            yield client

    async def approve(self, proposal_id: int, operator: str = "bob") -> Proposal:
        return await self.approvals.approve(proposal_id, Operator(operator))


async def build(app: App) -> Knecht:
    secrets = SecretRegistry(await secret_values(app.db))
    others = [ts for ts in load_toolsets(app.settings, app.db) if ts.name != "knecht"]
    tools = [*toolset(app.db, secrets=secrets).tools, *(tool for ts in others for tool in ts.tools)]
    gate = Gate(Registry(tools), app.audit, policy=app.policy,
                stager=ProposalStager(app.proposals, scrub=secrets), scrub=secrets)
    return Knecht(app, gate, secrets, ApprovalService(app.proposals, gate, app.audit))


async def call(client: Client, tool: str, /, **arguments: Any) -> Any:
    """Call a tool; return its structured content, asserting that text and structure agree."""
    result = await client.call_tool(tool, arguments)
    assert result.structured_content is not None, result.content[0].text
    if not result.is_error and result.structured_content.get("status") != "pending":
        assert json.loads(result.content[0].text) == result.structured_content
    return result

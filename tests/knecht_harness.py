"""A Knecht server for tests: the app over the demo database (its gate scrubs with the app's
secret registry), the SDK client in memory, and an approver."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from mcp import Client

from mcp_knecht import testing
from mcp_knecht.app import App
from mcp_knecht.core.approval import ApprovalService
from mcp_knecht.core.gate import Gate
from mcp_knecht.core.proposals import Proposal
from mcp_knecht.core.scrub import SecretRegistry

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
        async with testing.connect(self.app, testing.actor(subject, scopes)) as client:
            yield client

    async def approve(self, proposal_id: int, operator: str = "bob") -> Proposal:
        return await testing.approve(self.app, proposal_id, operator)


async def build(app: App) -> Knecht:
    return Knecht(app, app.gate, app.secrets, testing.approvals(app))


async def call(client: Client, tool: str, /, **arguments: Any) -> Any:
    """Call a tool; return its structured content, asserting that text and structure agree."""
    result = await client.call_tool(tool, arguments)
    assert result.structured_content is not None, result.content[0].text
    if not result.is_error and result.structured_content.get("status") != "pending":
        assert json.loads(result.content[0].text) == result.structured_content
    return result

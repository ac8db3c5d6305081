"""Pages read through the gate, as the session's actor: the same tools, scope checks, scrubbing and
audit rows (source `web`) as any MCP client — a page shows nothing a token with the same scopes
could not read.

    data = await read(app, actor, "get_run", {"run_id": 7})      # or raises PageError
"""

from __future__ import annotations

from typing import Any

from mcp_knecht.app import App
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.tools import WEB

_STATUS_OF_CODE = {"not_found": 404, "invalid_arguments": 400, "denied": 403, "missing_scope": 403,
                   "unknown_tool": 403, "conflict": 409, "store_busy": 503}


class PageError(Exception):
    """What a page shows instead of its content: a status and a sentence for a person."""

    def __init__(self, status: int, message: str, *, title: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message = status, message
        self.title = title or {400: "Bad request", 403: "Not allowed", 404: "Not found",
                               409: "Conflict"}.get(status, "Something went wrong")


def needs_scope(actor: Actor, scope: str, what: str) -> None:
    if not actor.holds(scope):
        raise PageError(403, f"{what} needs the scope {scope}, which your session does not hold. "
                             "Ask an admin for a sign-in link with it.")


async def read(app: App, actor: Actor, tool_name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Run a read tool through the gate as `actor`; its (scrubbed) structured result."""
    tool = app.gate.registry.get(tool_name)
    if tool is None:
        raise PageError(404, f"This server does not serve {tool_name}.")
    needs_scope(actor, tool.scope, f"Reading this ({tool_name})")
    # A page never stages a call: a read the policy sends for approval is shown as refused instead.
    if app.gate.policy().decide(tool, None).mode == "approve":
        raise PageError(403, f"The policy sends every {tool_name} call for approval; pages only show what runs "
                             "at once. Ask an admin to let this read run (policies.toml).")
    result = await app.gate.call_tool(actor, tool_name, arguments, source=WEB)
    if result.is_error:
        raise PageError(_STATUS_OF_CODE.get(result.error_code or "", 500), result.text)
    return result.data or {}

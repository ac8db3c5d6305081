"""The MCP face of the gate: a low-level SDK server whose tool list is computed per caller."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from mcp_knecht import __version__
from mcp_knecht.app import App
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.gate import Gate, GateResult
from mcp_knecht.core.policy import Policy
from mcp_knecht.core.prompts import Prompt
from mcp_knecht.core.tools import MCP, Tool
from mcp_knecht.errors import KnechtError
from mcp_knecht.transports.proposal_feed import ProposalFeed

logger = logging.getLogger(__name__)

ActorResolver = Callable[[ServerRequestContext[Any]], Actor | None]


_STAGED = ("submits a proposal for human approval and returns 'Submitted for approval (#ID)' immediately; "
           "it does not run until an operator approves it.")


def _names(actions: list[str]) -> str:
    return actions[0] if len(actions) == 1 else ", ".join(actions[:-1]) + " and " + actions[-1]


def policy_note(tool: Tool, policy: Policy) -> str:
    """What the policy does to calls of `tool`, for the model: which actions are staged, which run at
    once, which are denied — exactly, per action."""
    if not tool.actions:
        return f"This tool is staged: calling it {_STAGED}" if policy.decide(tool, None).mode == "approve" else ""
    modes: dict[str, list[str]] = {"auto": [], "approve": [], "deny": []}
    for action in tool.actions:
        modes[policy.decide(tool, action).mode].append(action)
    if not modes["approve"]:
        notes = []
    elif not modes["auto"] and not modes["deny"]:
        notes = [f"This tool is staged (every action): calling it {_STAGED}"]
    else:
        plural = len(modes["approve"]) > 1
        notes = [f"Action{'s' if plural else ''} {_names(modes['approve'])} {'are' if plural else 'is'} staged: "
                 f"such a call {_STAGED}"]
        if modes["auto"]:
            notes.append(f"{_names(modes['auto'])} run{'s' if len(modes['auto']) == 1 else ''} at once.")
    if modes["deny"]:
        notes.append(f"{_names(modes['deny'])} {'is' if len(modes['deny']) == 1 else 'are'} denied by policy.")
    return " ".join(notes)


def _mcp_tool(tool: Tool, note: str) -> types.Tool:
    description = tool.description + (f"\n\n{note}" if note else "")
    annotations = tool.annotations()
    return types.Tool(
        name=tool.name,
        title=tool.title,
        description=description,
        input_schema=tool.input_schema,
        output_schema=tool.output_schema,
        annotations=types.ToolAnnotations(
            title=annotations.get("title"),  # type: ignore[arg-type]
            read_only_hint=bool(annotations["readOnlyHint"]),
            destructive_hint=bool(annotations["destructiveHint"]),
            idempotent_hint=bool(annotations["idempotentHint"]),
            open_world_hint=False,
        ),
    )


def _call_result(result: GateResult) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=result.text)],
        structured_content=result.data,
        is_error=result.is_error,
    )


_INTERNAL_ERROR = types.CallToolResult(
    content=[types.TextContent(type="text", text="Internal error; the server log has details.")],
    is_error=True,
)

_NOT_AUTHENTICATED = types.CallToolResult(
    content=[types.TextContent(type="text", text=(
        "Not authenticated: this request carries no valid token, or the session's token has expired. Mint a new "
        "one (mcp-knecht token mint --sub NAME --profile claude-code) and reconnect with it."))],
    is_error=True,
)


def _mcp_prompt(prompt: Prompt) -> types.Prompt:
    return types.Prompt(
        name=prompt.name,
        title=prompt.title,
        description=prompt.description,
        arguments=[types.PromptArgument(name=a.name, description=a.description, required=a.required)
                   for a in prompt.arguments],
    )


def build_mcp_server(
    gate: Gate,
    resolve_actor: ActorResolver,
    prompts: Sequence[Prompt] = (),
    feed: ProposalFeed | None = None,
    instructions: str | None = None,
) -> Server[Any]:
    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        actor = resolve_actor(ctx)
        if actor is None:
            return types.ListToolsResult(tools=[])
        policy = gate.policy()
        tools = [_mcp_tool(tool, policy_note(tool, policy)) for tool in gate.visible_tools(actor)]
        return types.ListToolsResult(tools=tools)

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        actor = resolve_actor(ctx)
        if actor is None:
            return _NOT_AUTHENTICATED
        try:
            result = await gate.call_tool(actor, params.name, params.arguments, source=MCP)
        except Exception:  # the gate answers every tool failure itself; this is the last line
            logger.exception("The gate failed on %s", params.name[:200])
            return _INTERNAL_ERROR
        return _call_result(result)

    def prompts_for(actor: Actor | None) -> dict[str, Prompt]:
        """The prompts `actor` can follow: its scopes hold the prompt's, and it may call every tool named."""
        if actor is None or not prompts:
            return {}
        callable_tools = {tool.name for tool in gate.visible_tools(actor)}
        return {p.name: p for p in prompts if actor.holds(p.scope) and callable_tools.issuperset(p.tools)}

    async def list_prompts(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[_mcp_prompt(p) for p in prompts_for(resolve_actor(ctx)).values()])

    async def get_prompt(ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams) -> types.GetPromptResult:
        prompt = prompts_for(resolve_actor(ctx)).get(params.name)
        if prompt is None:  # unknown and out of scope look the same, as with tools
            raise MCPError(types.INVALID_PARAMS, f"Unknown prompt: {params.name!r}.")
        missing = [a.name for a in prompt.arguments if a.required and not (params.arguments or {}).get(a.name)]
        if missing:
            raise MCPError(types.INVALID_PARAMS, f"Prompt {prompt.name} needs: {', '.join(missing)}.")
        try:
            text = await prompt.render(dict(params.arguments or {}))
        except KnechtError as exc:
            raise MCPError(types.INVALID_PARAMS, exc.message) from None
        return types.GetPromptResult(
            description=prompt.description,
            messages=[types.PromptMessage(role="user", content=types.TextContent(type="text", text=text))],
        )

    handlers: dict[str, Any] = {"on_list_prompts": list_prompts, "on_get_prompt": get_prompt} if prompts else {}
    if feed is not None:
        handlers.update(feed.handlers(resolve_actor))
    return Server(
        "mcp-knecht",
        version=__version__,
        instructions=instructions,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        **handlers,
    )


def server_for_app(app: App, resolve_actor: ActorResolver) -> Server[Any]:
    """The MCP server of an assembled app: its gate, prompts and proposal notifications."""
    return build_mcp_server(app.gate, resolve_actor, app.prompts, ProposalFeed(app.proposals, app.watcher),
                            instructions=app.instructions)

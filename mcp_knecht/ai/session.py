"""What every exchange with a model over the gate does, shared by the feature loop (`loop.py`) and
the chat (`mcp_knecht.chat`):

    session = ModelSession(actor, gate=gate, model=model, source=CHAT, stage_writes=True, …)
    session.messages.append(ModelRequest(parts=[UserPromptPart("…")], instructions="…"))
    with deadline(session.model_name, timeout, requests=6):
        response = await session.request(params)        # provider errors become ModelCallError
        result, part = await session.call_tool(1, call)  # through the gate, as the actor; recorded

Every tool call the model makes goes to `Gate.call_tool`, whatever its name: the gate refuses (and
audits) what the actor may not call, and the model sees the refusal as the tool's result.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
from pydantic_ai.direct import model_request
from pydantic_ai.exceptions import AgentRunError, ModelAPIError, UnexpectedModelBehavior, UserError
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.tools import ToolDefinition

from mcp_knecht.ai.errors import ModelCallError
from mcp_knecht.ai.feature import ToolCallRecord, Usage
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.gate import Gate, GateResult
from mcp_knecht.core.tools import Source, Tool


def tool_definitions(tools: Iterable[Tool]) -> list[ToolDefinition]:
    """Tools described to a model exactly as to an MCP client."""
    return [ToolDefinition(name=tool.name, description=tool.description, parameters_json_schema=tool.input_schema)
            for tool in tools]


def cost(response: ModelResponse) -> float | None:
    try:
        return float(response.cost().total_price)
    except Exception:  # prices are unknown for many models (local ones, gateways)
        return None


def response_text(response: ModelResponse) -> str:
    return "".join(part.content for part in response.parts if isinstance(part, TextPart)).strip()


@contextmanager
def deadline(model_name: str, timeout: float, requests: int) -> Iterator[None]:
    """Bound an exchange of up to `requests` model requests by `timeout` seconds each, altogether
    (each HTTP attempt is bounded by the provider SDK's own timeout too)."""
    budget = timeout * requests
    try:
        with anyio.fail_after(budget):
            yield
    except TimeoutError as exc:
        raise ModelCallError(f"The model {model_name} did not answer within {timeout:g} s a request "
                             f"({budget:g} s for the run).") from exc


class ModelSession:
    """One exchange with a model: the messages so far, the usage, and every tool call with its gate
    outcome. `allowed` is the caller's own allowlist (a feature's tools; None: whatever the actor's
    token allows); `stage_writes` stages writes the policy would run at once (the chat)."""

    def __init__(self, actor: Actor, *, gate: Gate, model: Model, model_name: str, settings: dict[str, Any],
                 timeout: float, scrub: Callable[[str], str], source: Source,
                 allowed: Collection[str] | None = None, stage_writes: bool = False) -> None:
        self.actor, self.gate, self.model, self.model_name = actor, gate, model, model_name
        self.timeout, self.scrub, self.source = timeout, scrub, source
        self.allowed, self.stage_writes = allowed, stage_writes
        self.settings = {"timeout": timeout, **settings}
        self.messages: list[ModelMessage] = []
        self.usage = Usage()
        self.calls: list[ToolCallRecord] = []

    async def request(self, params: ModelRequestParameters) -> ModelResponse:
        """One model request, appended to the messages; bounded by the SDK's HTTP timeout (`timeout`
        in the settings, per attempt) and by the caller's `deadline`."""
        try:
            response = await model_request(self.model, self.messages, model_settings=self.settings,  # type: ignore[arg-type]
                                           model_request_parameters=params)
        except (ModelAPIError, UnexpectedModelBehavior, AgentRunError, UserError) as exc:
            raise ModelCallError(f"The model {self.model_name} failed: {self.scrub(str(exc))[:500]}") from exc
        self.messages.append(response)
        self.usage = self.usage.plus(response.usage.input_tokens, response.usage.output_tokens, cost(response))
        return response

    async def call_tool(self, step: int, call: ToolCallPart) -> tuple[GateResult, ToolReturnPart]:
        """Run one call the model made through the gate, as the actor; its result as the model sees it."""
        try:
            arguments: object = call.args_as_dict()
        except ValueError:  # not JSON: the gate reports it as invalid arguments
            arguments = call.args
        result = await self.gate.call_tool(self.actor, call.tool_name, arguments, source=self.source,
                                           allowed=self.allowed, stage_writes=self.stage_writes)
        self.calls.append(ToolCallRecord(step, call.tool_name, result.outcome))
        # The gate scrubs what a tool returns, as for MCP clients; its refusals may quote arguments.
        shown = self.scrub(result.text) if result.is_error else result.text
        return result, ToolReturnPart(call.tool_name, shown, tool_call_id=call.tool_call_id)

    def skip(self, step: int, call: ToolCallPart, why: str) -> ToolReturnPart:
        """A call that is not run; the model is told why."""
        self.calls.append(ToolCallRecord(step, call.tool_name, "skipped"))
        return ToolReturnPart(call.tool_name, why, tool_call_id=call.tool_call_id)

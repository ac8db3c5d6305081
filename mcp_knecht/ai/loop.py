"""The agentic loop, `runAiFeature` of seed 002: every tool call through the gate.

    step 1..max_steps      the model gets the prompt, the history and the feature's tools (those of
                           them the actor may see); each tool call it makes runs through
                           `gate.call_tool(actor, name, args, source="feature:<id>", allowed=tools)`
                           — scopes, validation, policy, staging, scrubbing and audit all apply, and a
                           name outside the allowlist is refused and audited like an unknown tool
    last step              no tools, only the answer channel (`final_result`): the model must answer
    answer                 validated against the feature's output model; one repair request with the
                           validation errors, then FeatureOutputError

The model layer is pydantic-ai's (one `Model` per provider, each on the provider's official SDK);
the loop is ours, so that no library answers a tool call in the gate's place (see README, "AI
features": pydantic-ai's Agent answers calls to unknown tools itself, unaudited).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, Generic

from pydantic import BaseModel, ValidationError
from pydantic_ai.messages import (
    InstructionPart,
    ModelRequest,
    ModelResponse,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.tools import ToolDefinition

from mcp_knecht.ai.errors import FeatureOutputError
from mcp_knecht.ai.feature import Feature, FeatureResult, Output
from mcp_knecht.ai.session import ModelSession, deadline, response_text, tool_definitions
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.gate import Gate

OUTPUT_TOOL = "final_result"
Feedback = ToolReturnPart | UserPromptPart
"""What the model is told about an unusable answer: the answer call's result, or a user message."""
_LAST_STEP = "This is your last step: no more tools. Answer now by calling final_result."


def _tool_definitions(gate: Gate, feature: Feature[Any], actor: Actor) -> list[ToolDefinition]:
    """The feature's tools that this actor may see, described as for an MCP client."""
    visible = {tool.name: tool for tool in gate.visible_tools(actor)}
    return tool_definitions(visible[name] for name in feature.tools if name in visible)


_SCHEMAS: dict[type[BaseModel], dict[str, Any]] = {}


def _output_schema(output: type[BaseModel]) -> dict[str, Any]:
    """Once per output model: making a schema costs more than a step of the loop."""
    if (schema := _SCHEMAS.get(output)) is None:
        schema = _SCHEMAS[output] = output.model_json_schema()
    return schema


def _output_definition(feature: Feature[Any]) -> ToolDefinition:
    return ToolDefinition(
        name=OUTPUT_TOOL, kind="output", parameters_json_schema=_output_schema(feature.output),
        description="Give your final answer. Call this exactly once, when you are done.",
    )


def _text_answer(response: ModelResponse) -> str | None:
    text = response_text(response)
    if text.startswith("```"):
        text = text.strip("`").removeprefix("json").strip()
    return text or None


class _Run(ModelSession, Generic[Output]):
    """One feature run: the conversation, the usage, and the calls made so far."""

    def __init__(self, feature: Feature[Output], prompt: str, actor: Actor, *, gate: Gate, model: Model,
                 model_name: str, settings: dict[str, Any], timeout: float, scrub: Callable[[str], str]) -> None:
        super().__init__(actor, gate=gate, model=model, model_name=model_name, settings=settings, timeout=timeout,
                         scrub=scrub, source=feature.source, allowed=feature.tools)
        self.feature = feature
        self.messages.append(ModelRequest(parts=[UserPromptPart(prompt)], instructions=feature.instructions))
        # Built once per run: with the feature's tools, and with none (the last step, the repair).
        output, instructions = [_output_definition(feature)], [InstructionPart(content=feature.instructions)]
        self.with_tools, self.answer_only = (
            ModelRequestParameters(function_tools=tools, output_mode="tool", output_tools=output,
                                   allow_text_output=False, instruction_parts=instructions)
            for tools in (_tool_definitions(gate, feature, actor), [])
        )

    def answer(self, response: ModelResponse) -> tuple[Output | None, Feedback | None]:
        """The validated answer in `response`, or what to tell the model about a broken one (or neither)."""
        calls = response.tool_calls  # computed on each access
        call = next((c for c in calls if c.tool_name == OUTPUT_TOOL), None)
        raw: object
        if call is not None:
            try:
                raw = call.args_as_dict()
            except ValueError:
                raw = call.args
        elif not calls and (text := _text_answer(response)) is not None:
            try:
                raw = json.loads(text)
            except ValueError:
                return None, UserPromptPart(f"Answer by calling {OUTPUT_TOOL}, not in text.")
        else:
            return None, None
        try:
            return self.feature.output.model_validate(raw), None
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'answer'}: {e['msg']}" for e in exc.errors())
            if call is None:
                return None, UserPromptPart(f"Your answer does not fit: {problems}. Answer by calling {OUTPUT_TOOL}.")
            return None, ToolReturnPart(OUTPUT_TOOL, f"Your answer does not fit: {problems}. Call {OUTPUT_TOOL} again.",
                                        tool_call_id=call.tool_call_id, outcome="retried")

    async def run_tools(self, step: int, calls: list[ToolCallPart], *, allowed: bool) -> None:
        parts = [(await self.call_tool(step, call))[1] if allowed else self.skip(step, call, _LAST_STEP)
                 for call in calls]
        self.messages.append(ModelRequest(parts=parts))

    def reply(self, step: int, problem: Feedback, unanswered: list[ToolCallPart]) -> None:
        """Tell the model what was wrong with its answer; calls made beside it are not run."""
        skipped = [self.skip(step, call, "Not run: answer first.") for call in unanswered]
        self.messages.append(ModelRequest(parts=[*skipped, problem]))

    def result(self, output: Output, steps: int) -> FeatureResult[Output]:
        return FeatureResult(self.feature.id, output, self.model_name, steps, self.usage, tuple(self.calls))


async def run_feature(
    feature: Feature[Output],
    prompt: str,
    actor: Actor,
    *,
    gate: Gate,
    model: Model,
    model_name: str | None = None,
    settings: dict[str, Any] | None = None,
    timeout: float = 60.0,
    scrub: Callable[[str], str] = lambda text: text,
) -> FeatureResult[Output]:
    """Run `feature` for `actor` on `prompt` until the model answers; see the module docstring.

    Every model call is bounded: by `timeout` per HTTP attempt (the provider SDK's), and all of them
    together by a deadline of `timeout` per request the run may make (its steps and the repair)."""
    with deadline(model_name or model.model_name, timeout, feature.max_steps + 1):
        return await _run_feature(feature, prompt, actor, gate=gate, model=model, model_name=model_name,
                                  settings=settings, timeout=timeout, scrub=scrub)


async def _run_feature(
    feature: Feature[Output],
    prompt: str,
    actor: Actor,
    *,
    gate: Gate,
    model: Model,
    model_name: str | None,
    settings: dict[str, Any] | None,
    timeout: float,
    scrub: Callable[[str], str],
) -> FeatureResult[Output]:
    run = _Run(feature, prompt, actor, gate=gate, model=model, model_name=model_name or model.model_name,
               settings=settings or {}, timeout=timeout, scrub=scrub)
    started = time.perf_counter()
    for step in range(1, feature.max_steps + 1):
        last = step == feature.max_steps
        response = await run.request(run.answer_only if last else run.with_tools)
        output, problem = run.answer(response)
        if output is not None:
            return run.result(output, step)
        calls = [call for call in response.tool_calls if call.tool_name != OUTPUT_TOOL]
        if problem is not None:
            run.reply(step, problem, calls)
            break
        if not calls:
            run.reply(step, UserPromptPart(f"Answer by calling {OUTPUT_TOOL}."), [])
            break
        await run.run_tools(step, calls, allowed=not last)
        if last:
            break
    # One repair request, offering only the answer channel, after being told what was wrong.
    response = await run.request(run.answer_only)
    output, problem = run.answer(response)
    if output is None:
        why = problem.content if problem is not None and isinstance(problem.content, str) else "no answer"
        raise FeatureOutputError(
            f"{feature.id}: the model gave no valid answer after a repair attempt ({why[:300]}); "
            f"{time.perf_counter() - started:.1f} s, {run.usage.requests} requests."
        )
    return run.result(output, feature.max_steps)

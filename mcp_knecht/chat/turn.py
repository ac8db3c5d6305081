"""One chat turn: the history and a new message → the model → read tools through the gate → a text
reply, or a proposal that ends the turn (seed 000, "Ablauf eines Gesprächszugs").

    history        only user and assistant messages: tool calls of earlier turns are never sent again
    round 1..5     the model gets the system prompt, the history, the message and every tool the
                   caller's token allows; each call it makes runs through `gate.call_tool(actor, …,
                   source="chat", stage_writes=True)` — scopes, validation, policy, scrubbing, audit
    a proposal     the first call the gate stages (every write: in chat a write is staged even where
                   the policy says `auto`) ends the turn at once; calls after it are not run
    text           an answer without tool calls is the reply
    round 6        asking for tools once more is an error for the turn (`RoundLimitError`); the calls
                   it asked for are refused, and audited as `denied` by the chat's rule

The exchange with the model is `ModelSession`, shared with the feature loop (`ai/loop.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from pydantic_ai.messages import (
    InstructionPart,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model, ModelRequestParameters

from mcp_knecht.ai.errors import FeatureOutputError
from mcp_knecht.ai.feature import ToolCallRecord, Usage
from mcp_knecht.ai.session import ModelSession, deadline, response_text, tool_definitions
from mcp_knecht.chat.errors import RoundLimitError
from mcp_knecht.chat.store import Message
from mcp_knecht.chat.texts import MAX_ROUNDS, ROUND_LIMIT, ROUND_LIMIT_RULE, SYSTEM_PROMPT
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.audit import AuditEntry, AuditSink
from mcp_knecht.core.gate import Gate, GateResult
from mcp_knecht.core.tools import CHAT

_NOT_RUN = "Not run: the proposal before it ended the turn."


class TurnOutcome(msgspec.Struct, frozen=True):
    reply: str | None
    """The model's answer; None when a proposal ended the turn (the reply is then the server's)."""
    staged: GateResult | None
    model: str
    rounds: int
    usage: Usage
    calls: tuple[ToolCallRecord, ...]


def history_messages(history: Sequence[Message]) -> list[ModelMessage]:
    """The stored conversation as model messages, starting with the person (a cut may begin mid-way)."""
    shown = list(history)
    while shown and shown[0].role != "user":
        shown.pop(0)
    return [ModelRequest(parts=[UserPromptPart(m.content)]) if m.role == "user"
            else ModelResponse(parts=[TextPart(m.content)]) for m in shown]


def _refuse(audit: AuditSink, actor: Actor, calls: list[ToolCallPart]) -> None:
    for call in calls:
        audit.record(AuditEntry(source=str(CHAT), subject=actor.subject, client=actor.client, tool=call.tool_name[:200],
                                outcome="denied", rule=ROUND_LIMIT_RULE, detail={"error": "round_limit"}))


async def run_turn(history: Sequence[Message], message: str, actor: Actor, *, gate: Gate, audit: AuditSink,
                   model: Model, model_name: str, settings: dict[str, Any], timeout: float,
                   scrub: Callable[[str], str]) -> TurnOutcome:
    """One turn for `actor`; see the module docstring. Bounded by `timeout` per model request, and
    altogether by `timeout` times the requests a turn may make."""
    with deadline(model_name, timeout, MAX_ROUNDS + 1):
        return await _turn(history, message, actor, gate=gate, audit=audit, model=model, model_name=model_name,
                           settings=settings, timeout=timeout, scrub=scrub)


async def _turn(history: Sequence[Message], message: str, actor: Actor, *, gate: Gate, audit: AuditSink,
                model: Model, model_name: str, settings: dict[str, Any], timeout: float,
                scrub: Callable[[str], str]) -> TurnOutcome:
    session = ModelSession(actor, gate=gate, model=model, model_name=model_name, settings=settings, timeout=timeout,
                           scrub=scrub, source=CHAT, stage_writes=True)
    session.messages += history_messages(history)
    session.messages.append(ModelRequest(parts=[UserPromptPart(message)], instructions=SYSTEM_PROMPT))
    params = ModelRequestParameters(function_tools=tool_definitions(gate.visible_tools(actor)), output_mode="text",
                                    allow_text_output=True, instruction_parts=[InstructionPart(SYSTEM_PROMPT)])

    def outcome(reply: str | None, staged: GateResult | None, rounds: int) -> TurnOutcome:
        return TurnOutcome(reply, staged, model_name, rounds, session.usage, tuple(session.calls))

    for round_ in range(1, MAX_ROUNDS + 2):
        response = await session.request(params)
        calls = response.tool_calls
        if not calls:
            if not (text := response_text(response)):
                raise FeatureOutputError(f"The model {model_name} gave an empty answer.")
            return outcome(text, None, round_ - 1)
        if round_ > MAX_ROUNDS:
            _refuse(audit, actor, calls)
            raise RoundLimitError(ROUND_LIMIT)
        parts: list[ToolReturnPart] = []
        for index, call in enumerate(calls):
            result, part = await session.call_tool(round_, call)
            if result.outcome == "staged":  # one action per turn: the first proposal ends it
                for later in calls[index + 1:]:
                    session.skip(round_, later, _NOT_RUN)
                return outcome(None, result, round_)
            parts.append(part)
        session.messages.append(ModelRequest(parts=parts))
    raise AssertionError("unreachable: the last round either answers or raises")

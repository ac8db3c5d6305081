"""Shared pieces of the chat's tests: a scripted assistant, a chat service over a test app.

    assistant = Assistant({"rerun": [call("record_effect", label="x"), text("never asked")]})
    chat = scripted_chat(app, assistant)
    reply = await chat.send(actor, "rerun it please")

`Assistant` is pydantic-ai's `FunctionModel` answering each turn by the first rule whose key occurs in
the message that began the turn: its steps in order, one per model request of that turn. A follow-up
from Knecht gets `text("Noted: …")` unless a rule says otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from mcp_knecht.ai.models import ModelResolver
from mcp_knecht.ai.settings import AiSettings, ModelSpec
from mcp_knecht.app import App
from mcp_knecht.chat import ChatService
from mcp_knecht.chat.texts import FOLLOW_UP_PREFIX
from mcp_knecht.core.actor import Actor
from tests.ai_scripted import Step, call, text

SETTINGS = AiSettings(default=ModelSpec("anthropic", "claude-haiku-4-5", "test"))
CHATTER = ("projects:read", "workflows:read", "runs:read", "runs:write", "logs:read", "proposals:read", "ai:chat")
OPERATOR = ("proposals:decide", "proposals:read", "projects:read", "runs:read")

__all__ = ["CHATTER", "OPERATOR", "SETTINGS", "Assistant", "call", "chatter", "prompts_of", "scripted_chat", "text"]


def chatter(subject: str = "alice", scopes: Iterable[str] = CHATTER, **claims: Any) -> Actor:
    return Actor(subject, "pytest", frozenset(scopes), claims=dict(claims))


def prompts_of(messages: Sequence[ModelMessage]) -> list[str]:
    return [str(part.content) for message in messages if isinstance(message, ModelRequest)
            for part in message.parts if isinstance(part, UserPromptPart)]


@dataclass
class Assistant:
    rules: Mapping[str, Sequence[Step]] = field(default_factory=dict)
    default: Sequence[Step] = (text("Hello."),)
    requests: list[list[ModelMessage]] = field(default_factory=list)
    offered: list[list[str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.model = FunctionModel(self._respond, model_name="scripted-assistant")

    def _respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.requests.append(list(messages))
        self.offered.append([tool.name for tool in info.function_tools])
        asked = prompts_of(messages)[-1]
        # The requests of this turn: one per response since the message that began it.
        start = max(i for i, m in enumerate(messages) if isinstance(m, ModelRequest)
                    and any(isinstance(p, UserPromptPart) for p in m.parts))
        step = sum(1 for m in messages[start:] if isinstance(m, ModelResponse))
        steps = next((s for key, s in self.rules.items() if key in asked), None)
        if steps is None:
            steps = [text(f"Noted: {asked[:80]}")] if asked.startswith(FOLLOW_UP_PREFIX) else self.default
        return ModelResponse(parts=list(steps[min(step, len(steps) - 1)]))

    @property
    def follow_ups(self) -> list[str]:
        """The follow-ups the assistant was asked to continue from: the first request of each such turn."""
        firsts = [prompts_of(r[-1:]) for r in self.requests]
        return [first[0] for first in firsts if first and first[0].startswith(FOLLOW_UP_PREFIX)]

    def tool_results(self, request: int = -1) -> list[str]:
        return [str(p.content) for m in self.requests[request] if isinstance(m, ModelRequest)
                for p in m.parts if isinstance(p, ToolReturnPart)]

    def sent_parts(self, request: int = -1) -> list[type]:
        return [type(p) for m in self.requests[request] for p in m.parts]


def scripted_chat(app: App, assistant: Assistant | FunctionModel, *, retry_after: timedelta = timedelta(0),
                  **worker_options: Any) -> ChatService:
    """The app's chat with a scripted model in place of a provider (failed follow-ups retried at once)."""
    model = assistant.model if isinstance(assistant, Assistant) else assistant
    return ChatService(db=app.db, gate=app.gate, audit=app.audit, proposals=app.proposals, changes=app.changes,
                       models=ModelResolver(SETTINGS, fixed=model), keys=app.keys, scrub=app.secrets,
                       retry_after=retry_after,
                       worker_options={"interval": 0.05, **worker_options})


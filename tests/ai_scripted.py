"""A scripted model for the loop's rules: pydantic-ai's `FunctionModel`, answering from a list of
steps and recording what it was offered and what it was told.

    model = Scripted(call("get_run", run_id=7), answer(summary="…", actionIds=[3]))
    await run_feature(feature, prompt, actor, gate=app.gate, model=model.model)
    model.offered[0]        # the tool names of step 1;  model.results  # the tool results it saw
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

Step = list[ToolCallPart | TextPart]


def call(name: str, /, **arguments: Any) -> Step:
    return [ToolCallPart(name, arguments)]


def answer(**output: Any) -> Step:
    return [ToolCallPart("final_result", output)]


def text(content: str) -> Step:
    return [TextPart(content)]


@dataclass
class Scripted:
    steps: list[Step]
    offered: list[list[str]] = field(default_factory=list)
    """Per request: the function tools offered (the answer tool is never among them)."""
    answer_tools: list[list[str]] = field(default_factory=list)
    seen: list[list[ModelMessage]] = field(default_factory=list)

    def __init__(self, *steps: Step) -> None:
        self.steps, self.offered, self.answer_tools, self.seen = list(steps), [], [], []
        self.model = FunctionModel(self._respond, model_name="scripted")

    def _respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.offered.append([tool.name for tool in info.function_tools])
        self.answer_tools.append([tool.name for tool in info.output_tools])
        self.seen.append(list(messages))
        index = len(self.offered) - 1
        parts = self.steps[index] if index < len(self.steps) else self.steps[-1]
        return ModelResponse(parts=list(parts))

    @property
    def results(self) -> list[str]:
        """Every tool result the model was sent, in order."""
        last = self.seen[-1] if self.seen else []
        return [str(part.content) for message in last if isinstance(message, ModelRequest)
                for part in message.parts if isinstance(part, ToolReturnPart)]

    @property
    def retries(self) -> list[str]:
        """What the model was told about unusable answers."""
        last = self.seen[-1] if self.seen else []
        return [str(part.content) for message in last[1:] if isinstance(message, ModelRequest)
                for part in message.parts
                if isinstance(part, UserPromptPart) or (isinstance(part, ToolReturnPart) and part.outcome == "retried")]

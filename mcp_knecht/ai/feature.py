"""AI features, declared in code: what a model may do for one task, and what it must answer.

    FAILURE_DIAGNOSIS = Feature(
        id="failure-diagnosis", role="fast", instructions="You explain why a run of Knecht failed. …",
        tools=("get_run", "get_action_log", "get_run_log", "get_workflow"),
        output=DiagnosisOutput, max_steps=4,
    )

`tools` is a fixed allowlist: the gate refuses (and audits) any other name the model asks for,
as "unknown tool". The model role names a configured model ("default" or "fast"), never a
concrete one, so the model can change without touching code.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import msgspec
from pydantic import BaseModel

from mcp_knecht.ai.settings import Role
from mcp_knecht.core.tools import Source, feature_source

Output = TypeVar("Output", bound=BaseModel)


class Feature(msgspec.Struct, Generic[Output], frozen=True):
    id: str
    role: Role
    instructions: str
    tools: tuple[str, ...]
    output: type[Output]
    max_steps: int = 4
    """Model requests with tools; the last one offers none, so the model always answers."""

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError(f"Feature {self.id}: max_steps must be at least 1")
        if not self.id or not all(c.isalnum() or c == "-" for c in self.id):
            raise ValueError(f"Feature id {self.id!r}: use letters, digits and '-'")

    @property
    def source(self) -> Source:
        """The source of every tool call this feature makes (`feature:<id>` in the audit log)."""
        return feature_source(self.id)


class ToolCallRecord(msgspec.Struct, frozen=True):
    step: int
    tool: str
    outcome: str
    """The gate's outcome (ran, failed, invalid, denied, staged, forbidden), or `skipped`."""


class Usage(msgspec.Struct, frozen=True):
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    """Known when the provider's prices are (genai-prices); None otherwise."""

    def plus(self, input_tokens: int, output_tokens: int, cost: float | None) -> Usage:
        known = None if cost is None or (self.requests and self.cost_usd is None) else (self.cost_usd or 0) + cost
        return Usage(self.requests + 1, self.input_tokens + input_tokens, self.output_tokens + output_tokens, known)


class FeatureResult(msgspec.Struct, Generic[Output], frozen=True):
    feature: str
    output: Output
    model: str
    steps: int
    usage: Usage
    calls: tuple[ToolCallRecord, ...] = msgspec.field(default_factory=tuple)
    record_id: int | None = None
    """The run's row in `ai_feature_runs`, once recorded."""

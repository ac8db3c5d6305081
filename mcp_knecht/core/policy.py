"""Policy decisions: `auto`, `approve` or `deny` per `Tool.Action`, `Tool`, or default.

Decisions are data with a reason: each names the rule that produced it, so `policy explain`
and the audit log can say why a call ran, was staged, or was refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from mcp_knecht.core.tools import Effect, Tool

Mode = Literal["auto", "approve", "deny"]
MODES: tuple[Mode, ...] = ("auto", "approve", "deny")

BUILT_IN: Mapping[Effect, Mode] = {"read": "auto", "write": "approve"}


@dataclass(frozen=True, slots=True)
class Decision:
    mode: Mode
    rule: str
    """Where the decision came from, e.g. `policies.toml: rerun_run` or `built-in: write effects`."""


@dataclass(frozen=True)
class Policy:
    rules: Mapping[str, Mode] = field(default_factory=dict)
    """Keys are `Tool` or `Tool.Action`."""
    default: Mode | None = None
    origin: str = "policies.toml"

    def decide(self, tool: Tool, action: str | None) -> Decision:
        if action is not None and (mode := self.rules.get(f"{tool.name}.{action}")):
            return Decision(mode, f"{self.origin}: {tool.name}.{action}")
        if mode := self.rules.get(tool.name):
            return Decision(mode, f"{self.origin}: {tool.name}")
        if self.default is not None:
            return Decision(self.default, f"{self.origin}: default")
        effect = tool.effect_of(action)
        return Decision(BUILT_IN[effect], f"built-in: {effect} effects are {BUILT_IN[effect]}")

    def hides(self, tool: Tool) -> bool:
        """A tool is hidden when every way of calling it is denied."""
        actions: tuple[str | None, ...] = tool.actions or (None,)
        return all(self.decide(tool, action).mode == "deny" for action in actions)

"""Policy decisions: `auto`, `approve` or `deny` for a concrete call.

    1. the first `[[rules]]` entry that matches the call (tool, action, arguments, caller), in file order
    2. `Tool.Action` in `[tools]`
    3. `Tool` in `[tools]`
    4. `[policy] default`
    5. built-in: read effects `auto`, write effects `approve`

Decisions are data with a reason: each names the rule that produced it, so `policy explain` and
the audit log can say why a call ran, was staged, or was refused. Rules are indexed by call (tool
and action) on first use, so a decision looks only at the rules of its own tool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mcp_knecht.core.actor import Actor
from mcp_knecht.core.policy_rules import MODES, Mode, Rule, compile_glob, is_glob
from mcp_knecht.core.tools import Effect, Tool

__all__ = ["BUILT_IN", "MODES", "Case", "Decision", "Mode", "Policy"]

BUILT_IN: Mapping[Effect, Mode] = {"read": "auto", "write": "approve"}


@dataclass(frozen=True, slots=True)
class Decision:
    mode: Mode
    rule: str
    """Where the decision came from, e.g. `policies.toml rule 2: rerun_run where branch = "main"`,
    `policies.toml: rerun_run` or `built-in: write effects are approve`."""
    approvers: int = 1
    """For `approve`: how many distinct operators must approve."""
    reason: str | None = None
    """The rule's reason, for the agent (on deny) and the operator (on approve)."""


@dataclass(frozen=True, slots=True)
class Case:
    """One way a call may be decided: a rule that may match (None: the fallback) and its decision."""

    rule: Rule | None
    decision: Decision
    certain: bool
    """True when it applies to every call that reaches it (no `when`, the caller known to match)."""


@dataclass(frozen=True, slots=True)
class _Entry:
    """What the index holds for one call (tool and action)."""

    rules: tuple[tuple[Rule, Decision], ...]
    fallback: Decision
    names: frozenset[str]


@dataclass(frozen=True)
class Policy:
    rules: Mapping[str, Mode] = field(default_factory=dict)
    """The `[tools]` table: keys are `Tool` or `Tool.Action`."""
    default: Mode | None = None
    origin: str = "policies.toml"
    rule_list: Sequence[Rule] = ()
    """The `[[rules]]`, in file order."""
    _index: dict[tuple[str, str | None], _Entry] = field(default_factory=dict, init=False, repr=False, compare=False)

    # --- deciding ---------------------------------------------------------------------------------

    def decide(self, tool: Tool, action: str | None, values: Mapping[str, Any] | None = None,
               caller: Actor | None = None) -> Decision:
        """The decision for a call whose rule-visible `values` (arguments as frozen, and facts) and
        caller are given. Without values a rule testing any matches nothing; without a caller a
        rule on subject or client matches nothing."""
        entry = self._entry(tool, action)
        if entry.rules:
            given = values if values is not None else {}
            subject, client = (caller.subject, caller.client) if caller is not None else (None, None)
            for rule, decision in entry.rules:
                if rule.matches(given, subject, client):
                    return decision
        return entry.fallback

    def settled(self, tool: Tool, action: str | None, caller: Actor | None) -> Decision | None:
        """The decision when it cannot depend on the arguments (no rule that tests any could match
        first); None when it may. The gate decides a settled call before freezing it."""
        for rule, decision in self._entry(tool, action).rules:
            if caller is not None and not rule.matches_caller(caller.subject, caller.client):
                continue
            if rule.when or (caller is None and (rule.subject or rule.client)):
                return None
            return decision
        return self._entry(tool, action).fallback

    def names(self, tool: Tool, action: str | None) -> frozenset[str]:
        """Every argument or fact a rule for this call tests."""
        return self._entry(tool, action).names

    def cases(self, tool: Tool, action: str | None, caller: Actor | None = None) -> list[Case]:
        """The rules that may decide a call of `caller` (any caller if None), in order, up to and
        including the first that surely does, then the fallback if it may still be reached."""
        found: list[Case] = []
        for rule, decision in self._entry(tool, action).rules:
            if caller is not None and not rule.matches_caller(caller.subject, caller.client):
                continue
            certain = not rule.when and (caller is not None or not (rule.subject or rule.client))
            found.append(Case(rule, decision, certain))
            if certain:
                return found
        return [*found, Case(None, self._entry(tool, action).fallback, True)]

    def hides(self, tool: Tool, caller: Actor | None = None) -> bool:
        """A tool is hidden when every way `caller` (anyone, if None) could call it is denied."""
        actions: tuple[str | None, ...] = tool.actions or (None,)
        return all(case.decision.mode == "deny" for action in actions for case in self.cases(tool, action, caller))

    # --- the index --------------------------------------------------------------------------------

    def _entry(self, tool: Tool, action: str | None) -> _Entry:
        key = (tool.name, action)
        entry = self._index.get(key)
        if entry is None:
            rules = tuple((rule, self._from_rule(rule)) for rule in self.rule_list
                          if _applies(rule, tool.name, action))
            entry = _Entry(rules, self._fallback(tool, action), frozenset().union(*(r.names for r, _ in rules)))
            self._index[key] = entry
        return entry

    def _from_rule(self, rule: Rule) -> Decision:
        label = f"{self.origin} rule {rule.number}: {rule.condition_text()}"
        return Decision(rule.decision, label, rule.approvers, rule.reason)

    def _fallback(self, tool: Tool, action: str | None) -> Decision:
        if action is not None and (mode := self.rules.get(f"{tool.name}.{action}")):
            return Decision(mode, f"{self.origin}: {tool.name}.{action}")
        if mode := self.rules.get(tool.name):
            return Decision(mode, f"{self.origin}: {tool.name}")
        if self.default is not None:
            return Decision(self.default, f"{self.origin}: default")
        effect = tool.effect_of(action)
        return Decision(BUILT_IN[effect], f"built-in: {effect} effects are {BUILT_IN[effect]}")


def _applies(rule: Rule, tool: str, action: str | None) -> bool:
    if rule.action is not None and rule.action != action:
        return False
    return compile_glob(rule.tool).fullmatch(tool) is not None if is_glob(rule.tool) else rule.tool == tool

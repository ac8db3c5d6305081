"""Policy decisions: `auto`, `approve` or `deny` for a concrete call.

    1. the first `[[rules]]` entry that matches the call (tool, action, arguments, caller), in file order
    2. `Tool.Action` in `[tools]`
    3. `Tool` in `[tools]`
    4. `[policy] default`
    5. built-in: read effects `auto`, write effects `approve`

Decisions are data with a reason: each names the rule that produced it, so `policy explain` and
the audit log can say why a call ran, was staged, or was refused. Rules are indexed by call (tool
and action) on first use, so a decision looks only at the rules of its own tool — and there at
bit masks per argument value, not at each rule (`_Entry`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

import msgspec

from mcp_knecht.core.actor import Actor
from mcp_knecht.core.policy_rules import MODES, Mode, Rule, compile_glob, is_glob
from mcp_knecht.core.tools import Effect, Tool

__all__ = ["BUILT_IN", "MODES", "Case", "Decision", "Mode", "Policy"]

BUILT_IN: Mapping[Effect, Mode] = {"read": "auto", "write": "approve"}


class Decision(msgspec.Struct, frozen=True):
    """What the policy decided for one call (`auto`, `approve` or `deny`), and why."""
    mode: Mode
    rule: str
    """Where the decision came from, e.g. `policies.toml rule 2: rerun_run where branch = "main"`,
    `policies.toml: rerun_run` or `built-in: write effects are approve`."""
    approvers: int = 1
    """For `approve`: how many distinct operators must approve."""
    reason: str | None = None
    """The rule's reason, for the agent (on deny) and the operator (on approve)."""


class Case(msgspec.Struct, frozen=True):
    """One way a call may be decided: a rule that may match (None: the fallback) and its decision."""

    rule: Rule | None
    decision: Decision
    certain: bool
    """True when it applies to every call that reaches it (no `when`, the caller known to match)."""


Pair = tuple[Rule, Decision]
_CACHED = 4096
"""Per call and argument, how many distinct values keep their match masks (then the cache restarts)."""


class _Values:
    """For one argument (or fact) of one call: which rules accept a value of it, as a bit mask."""

    __slots__ = ("_cache", "_exact", "_globs", "_lengths", "untested")

    def __init__(self, name: str, rules: tuple[Pair, ...]) -> None:
        every = (1 << len(rules)) - 1
        tested = 0
        self._exact: dict[tuple[str, object], int] = {}
        self._globs: dict[str, list[tuple[int, re.Pattern[str]]]] = {}
        for i, (rule, _) in enumerate(rules):
            for condition in rule.when:
                if condition.name != name:
                    continue
                tested |= 1 << i
                for value in condition.values:
                    if isinstance(value, str) and "*" in value:
                        prefix = value.split("*", 1)[0]
                        self._globs.setdefault(prefix, []).append((1 << i, compile_glob(value)))
                    elif (typed := _typed(value)) is not None:
                        self._exact[typed] = self._exact.get(typed, 0) | 1 << i
        self.untested = every & ~tested
        self._lengths = sorted({len(prefix) for prefix in self._globs})
        self._cache: dict[tuple[str, object], int] = {}

    def accepting(self, value: object) -> int:
        """The rules that accept `value`, and those that do not test this argument at all."""
        typed = _typed(value)
        if typed is None:  # missing, null or not a scalar: no rule testing it matches
            return self.untested
        found = self._cache.get(typed)
        if found is None:
            found = self.untested | self._exact.get(typed, 0)
            if isinstance(value, str):
                # A glob can only match a value that starts with its literal prefix.
                for length in self._lengths:
                    for bit, pattern in self._globs.get(value[:length], ()) if length <= len(value) else ():
                        if not found & bit and pattern.fullmatch(value):
                            found |= bit
            if len(self._cache) >= _CACHED:
                self._cache.clear()
            self._cache[typed] = found
        return found


class _Entry:
    """What the index holds for one call (tool and action): its rules in file order, and what
    finds the first that matches without trying them one by one.

    Rule i is bit i of a mask. Per argument the rules test, a value's mask holds the rules whose
    condition on it accepts the value (exact values by a dictionary, globs only where the value
    starts with their literal prefix), and the rules with no condition on it; per caller, the rules
    whose subject and client globs accept it. The rules that match a call are the AND of its masks,
    and the first of them is the lowest bit. Masks of values and callers once seen are kept, so a
    decision costs a few dictionary look-ups and ANDs, however many rules there are."""

    __slots__ = ("_callers", "_values", "fallback", "names", "rules", "settled")

    def __init__(self, rules: tuple[Pair, ...], fallback: Decision) -> None:
        self.rules = rules
        self.fallback = fallback
        self.names: frozenset[str] = frozenset().union(*(rule.names for rule, _ in rules))
        self._values = tuple((name, _Values(name, rules)) for name in sorted(self.names))
        self._callers: dict[tuple[str | None, str | None], int] = {}
        self.settled: dict[tuple[str, str] | None, Decision | None] = {}
        """`Policy.settled` per caller, once worked out."""

    def first(self, values: Mapping[str, Any], subject: str | None, client: str | None) -> Decision | None:
        mask = self._callers.get((subject, client))
        if mask is None:
            mask = self._caller_mask(subject, client)
        for name, index in self._values:
            if not mask:
                return None
            mask &= index.accepting(values.get(name))
        return self.rules[(mask & -mask).bit_length() - 1][1] if mask else None

    def _caller_mask(self, subject: str | None, client: str | None) -> int:
        mask = 0
        for i, (rule, _) in enumerate(self.rules):
            if rule.matches_caller(subject, client):
                mask |= 1 << i
        if len(self._callers) >= _CACHED:
            self._callers.clear()
        self._callers[(subject, client)] = mask
        return mask


class Policy(msgspec.Struct, frozen=True, dict=True):  # a __dict__ for the caches below
    """The loaded `policies.toml`: a mode per `Tool` or `Tool.Action`, a default and the rules."""
    rules: Mapping[str, Mode] = msgspec.field(default_factory=dict)
    """The `[tools]` table: keys are `Tool` or `Tool.Action`."""
    default: Mode | None = None
    origin: str = "policies.toml"
    rule_list: Sequence[Rule] = ()
    """The `[[rules]]`, in file order."""

    @cached_property
    def _index(self) -> dict[tuple[str, str | None], _Entry]:
        return {}

    @cached_property
    def _hidden(self) -> dict[tuple[str, tuple[str, str] | None], bool]:
        return {}

    # --- deciding ---------------------------------------------------------------------------------

    def decide(self, tool: Tool, action: str | None, values: Mapping[str, Any] | None = None,
               caller: Actor | None = None) -> Decision:
        """The decision for a call whose rule-visible `values` (arguments as frozen, and facts) and
        caller are given. Without values a rule testing any matches nothing; without a caller a
        rule on subject or client matches nothing."""
        entry = self._entry(tool, action)
        if entry.rules:
            subject, client = (caller.subject, caller.client) if caller is not None else (None, None)
            if (decision := entry.first(values if values is not None else {}, subject, client)) is not None:
                return decision
        return entry.fallback

    def settled(self, tool: Tool, action: str | None, caller: Actor | None) -> Decision | None:
        """The decision when it cannot depend on the arguments (no rule that tests any could match
        first); None when it may. The gate decides a settled call before freezing it."""
        entry = self._entry(tool, action)
        if not entry.rules:
            return entry.fallback
        key = (caller.subject, caller.client) if caller is not None else None
        if key in entry.settled:
            return entry.settled[key]
        found: Decision | None = entry.fallback
        for rule, decision in entry.rules:
            if caller is not None and not rule.matches_caller(caller.subject, caller.client):
                continue
            found = None if rule.when or (caller is None and (rule.subject or rule.client)) else decision
            break
        if len(entry.settled) >= _CACHED:
            entry.settled.clear()
        entry.settled[key] = found
        return found

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
        key = (tool.name, (caller.subject, caller.client) if caller is not None else None)
        hidden = self._hidden.get(key)
        if hidden is None:
            actions: tuple[str | None, ...] = tool.actions or (None,)
            hidden = all(case.decision.mode == "deny" for action in actions
                         for case in self.cases(tool, action, caller))
            if len(self._hidden) >= _CACHED:
                self._hidden.clear()
            self._hidden[key] = hidden
        return hidden

    # --- the index --------------------------------------------------------------------------------

    def _entry(self, tool: Tool, action: str | None) -> _Entry:
        key = (tool.name, action)
        entry = self._index.get(key)
        if entry is None:
            rules = tuple((rule, self._from_rule(rule)) for rule in self.rule_list
                          if _applies(rule, tool.name, action))
            entry = _Entry(rules, self._fallback(tool, action))
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


def _typed(value: object) -> tuple[str, object] | None:
    """A value as a key that keeps `true` apart from `1` (and `1` together with `1.0`)."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return ("number", value)
    return ("text", value) if isinstance(value, str) else None


def _applies(rule: Rule, tool: str, action: str | None) -> bool:
    if rule.action is not None and rule.action != action:
        return False
    return compile_glob(rule.tool).fullmatch(tool) is not None if is_glob(rule.tool) else rule.tool == tool

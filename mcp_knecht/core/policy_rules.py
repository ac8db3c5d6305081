"""Policy rules: `[[rules]]` of `policies.toml`, each a condition on a call and a decision.

    [[rules]]
    tool = "rerun_run"                          # required (a glob such as "delete_*" is allowed)
    action = "delete"                           # optional
    when = { branch = ["main", "release/*"] }   # argument → value | any-of list | glob string
    subject = "ci-*"                            # optional globs on the verified caller
    client = "claude-code"
    decision = "approve"                        # auto | approve | deny
    approvers = 2                               # approve only: distinct operators needed
    reason = "protected branch"                 # shown to the agent and to the operator

A rule matches a call when every condition holds: the tool (and action, if given), each `when`
entry, the caller's subject and client. Globs know one wildcard, `*` (any run of characters,
`/` included); everything else is literal and case matters. A string without `*` is an exact
value. A value that is missing or null matches nothing. Numbers compare as numbers, `true` only
with `true` (never with 1).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import cached_property
from typing import Any, Literal

import msgspec

Mode = Literal["auto", "approve", "deny"]
MODES: tuple[Mode, ...] = ("auto", "approve", "deny")

Scalar = str | int | float | bool


def is_glob(value: object) -> bool:
    return isinstance(value, str) and "*" in value


def compile_glob(pattern: str) -> re.Pattern[str]:
    """`*` is any run of characters; nothing else is special."""
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")), re.DOTALL)


def glob_covers(wide: str, narrow: str) -> bool:
    """True when every string `narrow` (a glob or a literal) matches also matches `wide`.

    Sound, not complete: `wide`'s literal characters can only match `narrow`'s literal ones, so a
    `*` of `narrow` is always absorbed by a `*` of `wide`."""
    return compile_glob(wide).fullmatch(narrow) is not None


class Condition(msgspec.Struct, frozen=True, dict=True):  # a __dict__ for the value sets, made once
    """`name` must be one of `values`: exact scalars, or globs (strings with `*`)."""

    name: str
    values: tuple[Scalar, ...]

    @cached_property
    def _strings(self) -> frozenset[str]:
        return frozenset(v for v in self.values if isinstance(v, str) and "*" not in v)

    @cached_property
    def _numbers(self) -> frozenset[int | float]:
        return frozenset(v for v in self.values if isinstance(v, int | float) and not isinstance(v, bool))

    @cached_property
    def _flags(self) -> frozenset[bool]:
        return frozenset(v for v in self.values if isinstance(v, bool))

    @cached_property
    def _pattern(self) -> re.Pattern[str] | None:
        globs = [v for v in self.values if isinstance(v, str) and "*" in v]
        return re.compile("|".join(f"(?:{compile_glob(g).pattern})" for g in globs), re.DOTALL) if globs else None

    def matches(self, value: object) -> bool:
        if isinstance(value, str):
            return value in self._strings or (self._pattern is not None and self._pattern.fullmatch(value) is not None)
        if isinstance(value, bool):
            return value in self._flags
        if isinstance(value, int | float):
            return value in self._numbers
        return False

    def covers(self, other: Condition) -> bool:
        """Every value `other` accepts, this accepts too."""
        return all(any(_value_covers(mine, theirs) for mine in self.values) for theirs in other.values)

    def shown(self) -> str:
        values = self.values[0] if len(self.values) == 1 else list(self.values)
        return f"{self.name} = {json.dumps(values, ensure_ascii=False)}"


def _value_covers(wide: Scalar, narrow: Scalar) -> bool:
    if isinstance(wide, bool) or isinstance(narrow, bool):
        return isinstance(wide, bool) and isinstance(narrow, bool) and wide == narrow
    if isinstance(wide, str) and isinstance(narrow, str):
        return glob_covers(wide, narrow) if is_glob(wide) else wide == narrow
    if isinstance(wide, str) or isinstance(narrow, str):
        return False
    return wide == narrow


class CallerGlob(msgspec.Struct, frozen=True, dict=True):  # a __dict__ for the compiled pattern
    """A glob over callers (`subject` or `client`) in a rule's `when`, compiled once."""
    pattern: str

    @cached_property
    def _compiled(self) -> re.Pattern[str]:
        return compile_glob(self.pattern)

    def matches(self, value: str) -> bool:
        return self._compiled.fullmatch(value) is not None

    def covers(self, other: CallerGlob) -> bool:
        return glob_covers(self.pattern, other.pattern)


class Rule(msgspec.Struct, frozen=True):
    """One `[[rules]]` entry of `policies.toml`: for which calls it decides, and what."""
    number: int
    """Its position among the file's `[[rules]]`, counted from 1."""
    tool: str
    """As written: a tool name or a glob over tool names."""
    decision: Mode
    action: str | None = None
    when: tuple[Condition, ...] = ()
    subject: CallerGlob | None = None
    client: CallerGlob | None = None
    approvers: int = 1
    reason: str | None = None

    @property
    def names(self) -> frozenset[str]:
        """The arguments and facts this rule tests."""
        return frozenset(c.name for c in self.when)

    def matches_caller(self, subject: str | None, client: str | None) -> bool:
        if self.subject is not None and (subject is None or not self.subject.matches(subject)):
            return False
        return self.client is None or (client is not None and self.client.matches(client))

    def matches(self, values: Mapping[str, Any], subject: str | None, client: str | None) -> bool:
        """Whether this rule matches a call of its tool (and action) with these rule-visible values,
        by this caller. (`Policy.decide` finds the first match by bit masks; this is the definition.)"""
        return self.matches_caller(subject, client) and all(
            condition.matches(values.get(condition.name)) for condition in self.when)

    def covers(self, later: Rule) -> bool:
        """True when this rule matches every call `later` matches (for calls of `later`'s tool):
        `later` can then never decide anything."""
        if self.action is not None and self.action != later.action:
            return False
        for mine, theirs in ((self.subject, later.subject), (self.client, later.client)):
            if mine is not None and (theirs is None or not mine.covers(theirs)):
                return False
        theirs_by_name = {c.name: c for c in later.when}
        return all(c.name in theirs_by_name and c.covers(theirs_by_name[c.name]) for c in self.when)

    def condition_text(self) -> str:
        """What the rule matches, in one line: `rerun_run where branch = ["main", "release/*"]`."""
        call = f"{self.tool}.{self.action}" if self.action else self.tool
        parts = [c.shown() for c in self.when]
        parts += [f"{name} = {json.dumps(glob.pattern)}" for name, glob in (("subject", self.subject),
                                                                           ("client", self.client)) if glob]
        return f"{call} where {', '.join(parts)}" if parts else call

    def outcome_text(self) -> str:
        quorum = f" ({self.approvers} approvers)" if self.approvers > 1 else ""
        return f"{self.decision}{quorum}" + (f": {self.reason}" if self.reason else "")

    def summary(self) -> str:
        """The rule in one line, for `policy check`, `policy explain` and the audit log."""
        return f"rule {self.number}: {self.condition_text()} → {self.outcome_text()}"

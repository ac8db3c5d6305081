"""The policy in words: for a model (the staged note of a tool's description), for an admin
(`policy check` warnings, `policy explain`), and what a rule on each tool can test."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from mcp_knecht.core.actor import Actor
from mcp_knecht.core.policy import Case, Decision, Policy
from mcp_knecht.core.policy_rules import Rule, compile_glob, glob_covers, is_glob
from mcp_knecht.core.tools import Tool

_STAGED = ("submits a proposal for human approval and returns 'Submitted for approval (#ID)' immediately; "
           "it does not run until an operator approves it.")
SOMETIMES_STAGED = f"A staged call {_STAGED}"


def outcome(decision: Decision) -> str:
    """What a decision does, for a model: `staged for human approval by 2 different operators (why)`."""
    if decision.mode == "auto":
        return "runs at once"
    text = "refused by policy" if decision.mode == "deny" else "staged for human approval"
    if decision.mode == "approve" and decision.approvers > 1:
        text += f" by {decision.approvers} different operators"
    return text + (f" ({decision.reason})" if decision.reason else "")


def _names(actions: list[str]) -> str:
    return actions[0] if len(actions) == 1 else ", ".join(actions[:-1]) + " and " + actions[-1]


def policy_note(tool: Tool, policy: Policy, caller: Actor | None = None) -> str:
    """What the policy does to calls of `tool` by `caller`, for the model's tool description: which
    actions are staged, which run at once, which are denied — exactly, per action; and where rules
    make that depend on the call, which arguments do (in order, the first case that applies)."""
    cases = {action: policy.cases(tool, action, caller) for action in (tool.actions or (None,))}
    if any(len(listed) > 1 for listed in cases.values()):
        return _conditional(tool, cases)
    modes = {action: listed[0].decision.mode for action, listed in cases.items()}
    if not tool.actions:
        return f"This tool is staged: calling it {_STAGED}" if modes[None] == "approve" else ""
    by_mode: dict[str, list[str]] = {"auto": [], "approve": [], "deny": []}
    for action, mode in modes.items():
        by_mode[mode].append(str(action))
    if not by_mode["approve"]:
        notes = []
    elif not by_mode["auto"] and not by_mode["deny"]:
        notes = [f"This tool is staged (every action): calling it {_STAGED}"]
    else:
        plural = len(by_mode["approve"]) > 1
        notes = [f"Action{'s' if plural else ''} {_names(by_mode['approve'])} {'are' if plural else 'is'} staged: "
                 f"such a call {_STAGED}"]
        if by_mode["auto"]:
            notes.append(f"{_names(by_mode['auto'])} run{'s' if len(by_mode['auto']) == 1 else ''} at once.")
    if by_mode["deny"]:
        notes.append(f"{_names(by_mode['deny'])} {'is' if len(by_mode['deny']) == 1 else 'are'} denied by policy.")
    return " ".join(notes)


def _condition(rule: Rule | None) -> str:
    if rule is None or not rule.when:
        return "any other call"
    return "where " + " and ".join(condition.shown() for condition in rule.when)


def _conditional(tool: Tool, cases: dict[str | None, list[Case]]) -> str:
    if all(case.decision.mode == "auto" for listed in cases.values() for case in listed):
        return ""
    lines = ["Whether a call is staged depends on it; the first case that applies decides:"]
    facts: set[str] = set()
    for action, listed in cases.items():
        prefix = f"action {action!r}" if action is not None else ""
        for case in listed:
            if case.rule is not None:
                facts |= case.rule.names & set(tool.fact_fields)
            where = _condition(case.rule)
            if prefix:
                where = prefix if where == "any other call" else f"{prefix} {where}"
            lines.append(f"- {where}: {outcome(case.decision)}")
    lines += [f"({name} is {tool.fact_fields[name].description}.)" for name in sorted(facts)]
    return "\n".join([*lines, SOMETIMES_STAGED])


# --- for admins -----------------------------------------------------------------------------------


class RuleWarning(msgspec.Struct, frozen=True):
    """A rule that can never decide anything, and why."""
    rule: Rule
    message: str
    shadowed: bool = True
    """False for a glob that matches no tool served now: it may once entities are declared."""


def rule_warnings(policy: Policy, tools: Iterable[Tool]) -> list[RuleWarning]:
    """Rules that can never decide anything: shadowed by an earlier rule that matches every call
    they match, or (a glob) naming no tool this server serves."""
    served = [tool.name for tool in tools]
    found: list[RuleWarning] = []
    for position, rule in enumerate(policy.rule_list):
        if is_glob(rule.tool) and not any(compile_glob(rule.tool).fullmatch(name) for name in served):
            found.append(RuleWarning(rule, f"rule {rule.number} ({rule.tool}) matches no tool this server serves "
                                           "now.", shadowed=False))
            continue
        for earlier in policy.rule_list[:position]:
            if _tool_covers(earlier.tool, rule.tool) and earlier.covers(rule):
                found.append(RuleWarning(rule, f"rule {rule.number} can never match: rule {earlier.number} before it "
                                           f"matches every call it does ({earlier.condition_text()})."))
                break
    return found


def _tool_covers(wide: str, narrow: str) -> bool:
    return glob_covers(wide, narrow) if is_glob(wide) else wide == narrow


def rule_names(tool: Tool) -> list[str]:
    """What a rule on `tool` can test, one line each: its arguments (as validated and frozen) and
    its facts."""
    lines = []
    for name in tool.input_model.model_fields:
        if name in tool.fact_fields:
            continue
        frozen = " (frozen: filled in when the call is proposed)" if name in tool.frozen_fields else ""
        lines.append(f"{name}{frozen}")
    lines += [f"{name} (fact: {fact.description})" for name, fact in tool.fact_fields.items()]
    return lines


def shown_values(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{name} = {json.dumps(value, ensure_ascii=False, default=str)}"
                     for name, value in values.items())


def case_line(case: Case) -> str:
    if case.rule is None:
        return f"otherwise: {case.decision.mode}  ({case.decision.rule})"
    return case.rule.summary()

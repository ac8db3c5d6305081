"""`policies.toml`: parsed strictly against the registry, reloaded when it changes.

    [policy]
    default = "approve"                 # optional; otherwise built-in: read auto, write approve

    [tools]
    rerun_run = "auto"                  # a whole tool
    "project_variable.delete" = "deny"  # one action of a tool

    [[rules]]                           # first match wins, before [tools] (core/policy_rules.py)
    tool = "rerun_run"
    when = { branch = ["main", "release/*"] }
    decision = "approve"
    approvers = 2
    reason = "protected branch"

Parsing fails closed: a syntax error, an unknown tool or action, an unknown value, an unknown
argument in `when` (checked against the tool's input model and facts), a `when` value of a type the
argument cannot have, `approvers` on a rule that does not approve — each is a `ConfigError` naming
the file, the key (for a rule: its number, from 1, and the key) and the problem. At start that
stops the server; on reload the last good policy stays in force and the error is logged loudly. A
file that was there and disappears, becomes empty or unreadable is such an error too: deleting the
file must not drop its deny rules. (To clear every rule on purpose, leave a file holding only a
comment.)
"""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path
from typing import Any, cast

import anyio
import msgspec
from pydantic import TypeAdapter, ValidationError

from mcp_knecht.core.policy import MODES, Mode, Policy
from mcp_knecht.core.policy_rules import CallerGlob, Condition, Rule, Scalar, compile_glob, is_glob
from mcp_knecht.core.registry import Registry
from mcp_knecht.core.tools import Tool
from mcp_knecht.errors import ConfigError

logger = logging.getLogger(__name__)

_TOP_LEVEL = {"policy", "tools", "rules"}
_RULE_KEYS = ("tool", "action", "when", "subject", "client", "decision", "approvers", "reason")
MAX_REASON = 300


def _mode(path: Path, key: str, value: Any) -> Mode:
    if value not in MODES:
        raise ConfigError(f"{path}: {key} = {value!r}: unknown value; use one of {', '.join(MODES)}.")
    return cast(Mode, value)


def parse_policy(text: str, path: Path, registry: Registry) -> Policy:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: syntax error: {exc}") from None
    if unknown := sorted(set(raw) - _TOP_LEVEL):
        raise ConfigError(f"{path}: unknown key {unknown[0]!r}; the file has a [policy] and a [tools] table "
                          "and [[rules]].")
    section = raw.get("policy", {})
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: policy must be a table: [policy]")
    if extra := sorted(set(section) - {"default"}):
        raise ConfigError(f"{path}: policy.{extra[0]}: unknown key; [policy] only knows 'default'.")
    default = _mode(path, "policy.default", section["default"]) if "default" in section else None
    tools = raw.get("tools", {})
    if not isinstance(tools, dict):
        raise ConfigError(f"{path}: tools must be a table: [tools]")
    rules: dict[str, Mode] = {}
    for key, value in tools.items():
        if isinstance(value, dict):
            raise ConfigError(
                f"{path}: tools.{key}: expected a value such as \"approve\"; write an action as "
                f"\"{key}.ACTION\" = \"…\" (quoted)."
            )
        tool_name, _, action = key.partition(".")
        tool = registry.get(tool_name)
        if tool is None:
            raise ConfigError(f"{path}: tools.{key}: unknown tool {tool_name!r}.")
        if action and action not in tool.actions:
            known = ", ".join(tool.actions) or "none (it has no action argument)"
            raise ConfigError(f"{path}: tools.{key}: {tool_name} has no action {action!r}; actions: {known}.")
        rules[key] = _mode(path, f"tools.{key}", value)
    listed = raw.get("rules", [])
    if not isinstance(listed, list) or not all(isinstance(item, dict) for item in listed):
        raise ConfigError(f"{path}: rules must be a list of tables, each written as [[rules]].")
    parsed = tuple(_rule(path, number, item, registry) for number, item in enumerate(listed, start=1))
    return Policy(rules=rules, default=default, origin=path.name, rule_list=parsed)


# --- [[rules]] -------------------------------------------------------------------------------------


def _rule(path: Path, number: int, raw: dict[str, Any], registry: Registry) -> Rule:
    def refuse(key: str, problem: str) -> ConfigError:
        return ConfigError(f"{path}: rule {number}, {key}: {problem}")

    if unknown := sorted(set(raw) - set(_RULE_KEYS)):
        raise refuse(unknown[0], f"unknown key; a rule knows {', '.join(_RULE_KEYS)}.")
    for key in ("tool", "decision"):
        if key not in raw:
            raise ConfigError(f"{path}: rule {number}: `{key}` is missing; every rule names one.")
    for key in ("tool", "action", "subject", "client", "reason"):
        if key in raw and (not isinstance(raw[key], str) or not raw[key].strip()):
            raise refuse(key, "expected a non-empty string.")
    pattern: str = raw["tool"]
    tools = _tools(pattern, registry)
    if not tools and not is_glob(pattern):
        raise refuse("tool", f"unknown tool {pattern!r}.")
    action: str | None = raw.get("action")
    for tool in tools:
        if action is not None and action not in tool.actions:
            known = ", ".join(tool.actions) or "none (it has no action argument)"
            raise refuse("action", f"{tool.name} has no action {action!r}; actions: {known}.")
    decision = raw["decision"]
    if decision not in MODES:
        raise refuse("decision", f"{decision!r} is not a decision; use one of {', '.join(MODES)}.")
    approvers = raw.get("approvers", 1)
    if "approvers" in raw and decision != "approve":
        raise refuse("approvers", f"only an `approve` rule needs approvers; this one is {decision!r}.")
    if not isinstance(approvers, int) or isinstance(approvers, bool) or approvers < 1:
        raise refuse("approvers", f"expected a whole number of at least 1 (got {approvers!r}).")
    reason: str | None = raw.get("reason")
    if reason is not None and len(reason) > MAX_REASON:
        raise refuse("reason", f"at most {MAX_REASON} characters: it is shown in one line.")
    when = raw.get("when", {})
    if not isinstance(when, dict):
        raise refuse("when", "expected a table: when = { argument = value, … }.")
    conditions = tuple(_condition(refuse, name, value, tools) for name, value in when.items())
    return Rule(number=number, tool=pattern, action=action, decision=cast(Mode, decision), when=conditions,
                subject=CallerGlob(raw["subject"]) if "subject" in raw else None,
                client=CallerGlob(raw["client"]) if "client" in raw else None, approvers=approvers,
                reason=reason.strip() if reason else None)


def _tools(pattern: str, registry: Registry) -> list[Tool]:
    if is_glob(pattern):
        compiled = compile_glob(pattern)
        return [tool for tool in registry if compiled.fullmatch(tool.name)]
    tool = registry.get(pattern)
    return [tool] if tool is not None else []


def _condition(refuse: Any, name: str, value: Any, tools: list[Tool]) -> Condition:
    key = f"when.{name}"
    values = value if isinstance(value, list) else [value]
    if not values:
        raise refuse(key, "an empty list matches nothing; give at least one value.")
    for item in values:
        if isinstance(item, dict | list) or not isinstance(item, str | int | float | bool):
            raise refuse(key, f"{item!r}: a rule compares text, numbers and true/false, nothing else.")
    for tool in tools:
        fields = tool.rule_fields
        if name not in fields:
            raise refuse(key, f"{tool.name} has no argument {name!r}; a rule on it can test: "
                              f"{', '.join(sorted(fields))}.")
        for item in values:
            if (problem := _value_problem(fields[name], item)) is not None:
                raise refuse(key, f"{item!r} can never be the value of {tool.name}'s {name}: {problem}.")
    return Condition(name, tuple(cast(Scalar, item) for item in values))


def _value_problem(annotation: Any, value: Scalar) -> str | None:
    if is_glob(value):
        return None if _accepts_text(annotation) else "a glob (with *) needs a text argument"
    try:
        TypeAdapter(annotation).validate_python(value, strict=True)
    except ValidationError as exc:
        return str(exc.errors()[0]["msg"]).lower()
    return None


def _accepts_text(annotation: Any) -> bool:
    import typing

    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _accepts_text(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        return any(isinstance(choice, str) for choice in typing.get_args(annotation))
    if origin is not None and typing.get_args(annotation) and origin not in (dict, list, tuple, set):
        return any(_accepts_text(arg) for arg in typing.get_args(annotation))
    return isinstance(annotation, type) and issubclass(annotation, str)


def load_policy(path: Path, registry: Registry) -> Policy:
    """The file's policy; a missing file means the built-in defaults."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Policy(origin=path.name)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    return parse_policy(text, path, registry)


class _Stamp(msgspec.Struct, frozen=True):
    """A file's modification time and size: what the policy watcher compares."""
    mtime_ns: int
    size: int


def _stamp(path: Path) -> _Stamp | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return _Stamp(stat.st_mtime_ns, stat.st_size)


def missing_or_empty(path: Path) -> str | None:
    """Why `path` holds no policy (missing, empty), or None when it holds text."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return f"{path} is missing"
    except OSError as exc:
        return f"{path} cannot be read: {exc.strerror}"
    return f"{path} is empty" if not text.strip() else None


class PolicySource:
    """The policy in force; `watch()` reloads it when the file changes."""

    def __init__(self, path: Path, registry: Registry) -> None:
        self.path = path
        self._registry = registry
        self._stamp = _stamp(path)
        self._policy = load_policy(path, registry)  # fail closed at start
        self.last_error: str | None = None

    def __call__(self) -> Policy:
        return self._policy

    def reload_if_changed(self) -> bool:
        """Reload on change; True when a new policy took effect."""
        stamp = _stamp(self.path)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            if (gone := missing_or_empty(self.path)) is not None:
                raise ConfigError(f"{gone}; it must hold the policy (a comment-only file clears every rule)")
            self._policy = load_policy(self.path, self._registry)
        except ConfigError as exc:
            self.last_error = exc.message
            logger.error("POLICY NOT RELOADED — keeping the last good policy. %s", exc.message)
            return False
        self.last_error = None
        logger.warning("Policy reloaded from %s", self.path)
        return True

    async def watch(self, interval: float = 1.0) -> None:
        while True:
            await anyio.sleep(interval)
            self.reload_if_changed()

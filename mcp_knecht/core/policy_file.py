"""`policies.toml`: parsed strictly against the registry, reloaded when it changes.

    [policy]
    default = "approve"                 # optional; otherwise built-in: read auto, write approve

    [tools]
    rerun_run = "auto"                  # a whole tool
    "project_variable.delete" = "deny"  # one action of a tool

Parsing fails closed: a syntax error, an unknown tool or action, or an unknown value is a
`ConfigError` naming the file, the key and the problem. At start that stops the server; on
reload the last good policy stays in force and the error is logged loudly. A file that was there
and disappears, becomes empty or unreadable is such an error too: deleting the file must not drop
its deny rules. (To clear every rule on purpose, leave a file holding only a comment.)
"""

from __future__ import annotations

import logging
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import anyio

from mcp_knecht.core.policy import MODES, Mode, Policy
from mcp_knecht.core.registry import Registry
from mcp_knecht.errors import ConfigError

logger = logging.getLogger(__name__)

_TOP_LEVEL = {"policy", "tools"}


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
        raise ConfigError(f"{path}: unknown key {unknown[0]!r}; the file has a [policy] and a [tools] table.")
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
    return Policy(rules=rules, default=default, origin=path.name)


def load_policy(path: Path, registry: Registry) -> Policy:
    """The file's policy; a missing file means the built-in defaults."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Policy(origin=path.name)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    return parse_policy(text, path, registry)


@dataclass(frozen=True)
class _Stamp:
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

"""Workflow definitions as text: the actions a run of one has, cheap structural checks of a new
one, and the check of dispatch inputs against the inputs a version declares. No database here."""

from __future__ import annotations

import re
from typing import Any

from mcp_knecht.errors import InvalidArgumentsError

_ACTION_NAME = re.compile(r"^\s*-\s*name:\s*['\"]?([A-Za-z0-9_.\-]+)", re.MULTILINE)


def action_names(definition: str) -> list[str]:
    """The action names of a definition, in order: every run first parses its workflow."""
    section = definition.split("\nactions:", 1)
    names = _ACTION_NAME.findall(section[1]) if len(section) == 2 else []
    return ["parse-workflow", *names]


def check_definition(definition: str) -> list[str]:
    """Cheap structural checks of a new definition; an empty list means it looks sound."""
    problems = []
    if "\t" in definition:
        problems.append("tabs are not allowed in YAML indentation")
    if not re.search(r"^name:\s*\S", definition, re.MULTILINE):
        problems.append("a top-level 'name:' is missing")
    if not re.search(r"^actions:\s*$", definition, re.MULTILINE):
        problems.append("a top-level 'actions:' list is missing")
    elif len(action_names(definition)) < 2:
        problems.append("'actions:' declares no action ('- name: …')")
    for number, line in enumerate(definition.splitlines(), start=1):
        # The classic mistake of the demo data: a second ': ' inside an unquoted scalar.
        stripped = line.strip()
        if stripped.startswith(("run:", "- run:")) and ": " in stripped.split(":", 1)[1]:
            value = stripped.split(":", 1)[1].strip()
            if not value.startswith(("'", '"', "|", ">")):
                problems.append(f"line {number}: mapping values are not allowed here; quote the command")
    return problems


def resolve_inputs(declared: dict[str, dict[str, Any]], given: dict[str, Any]) -> dict[str, Any]:
    """Check dispatch inputs against the declared ones; return the full set with defaults."""
    problems: list[dict[str, str]] = []
    for name in sorted(set(given) - set(declared)):
        expected = ", ".join(sorted(declared)) or "none"
        problems.append({"field": f"inputs.{name}", "problem": f"not a declared input; declared: {expected}"})
    resolved: dict[str, Any] = {}
    for name, spec in declared.items():
        if name not in given:
            if spec.get("required") and spec.get("default") is None:
                problems.append({"field": f"inputs.{name}", "problem": "required input is missing"})
            resolved[name] = spec.get("default")
            continue
        value = given[name]
        kind = spec.get("type", "string")
        if not _fits(kind, value, spec.get("options") or []):
            wanted = f"one of {spec.get('options')}" if kind == "choice" else f"a {kind}"
            problems.append({"field": f"inputs.{name}", "problem": f"expected {wanted} (got {value!r})"})
        resolved[name] = value
    if problems:
        raise InvalidArgumentsError("dispatch_workflow", problems)
    return resolved


def _fits(kind: str, value: Any, options: list[str]) -> bool:
    return {
        "boolean": isinstance(value, bool),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
        "string": isinstance(value, str),
        "choice": isinstance(value, str) and value in options,
    }.get(kind, False)

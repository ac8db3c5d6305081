"""Validate a call's arguments, and turn what is wrong into problems a model can fix: field and
expectation.

Before the input model sees them, arguments pass checks that hold for every tool, because
hostile values must never reach a handler, a database or the audit log:

- strings cannot contain NUL (U+0000; a database cuts text there) or lone UTF-16 surrogates
  (`"\\ud800"`: they cannot be encoded, so they could be neither stored nor hashed);
- strings are at most `MAX_STRING_LENGTH` characters, integers fit in 64 bits, numbers are
  finite, and nesting is at most `MAX_DEPTH` deep.

Every string a problem echoes is bounded and printable: an error never repeats a huge or
hostile argument back.
"""

from __future__ import annotations

import json
import math
import re
import reprlib
from typing import Any

from pydantic import BaseModel, ValidationError

from mcp_knecht.errors import InvalidArgumentsError

MAX_STRING_LENGTH = 100_000
MAX_DEPTH = 32
MIN_INT, MAX_INT = -(2**63), 2**63 - 1
MAX_PROBLEMS = 20
_MAX_SHOWN_INPUT = 60
_MAX_SHOWN_FIELD = 60
_UNENCODABLE = re.compile("[\ud800-\udfff]")


def label(value: object, limit: int = _MAX_SHOWN_FIELD) -> str:
    """`value` as text that is safe to echo: bounded, encodable, without NUL."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text.replace("\x00", "\\x00")


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = _MAX_SHOWN_INPUT


def _shown(value: Any) -> str:
    """The value as the caller sent it — JSON (`null`, `true`, `"text"`), not Python (`None`,
    `True`) — bounded and printable."""
    if isinstance(value, str) and len(value) > 4 * _MAX_SHOWN_INPUT:
        value = value[: 4 * _MAX_SHOWN_INPUT]
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        text = _REPR.repr(value)
    return label(text, _MAX_SHOWN_INPUT)


def _field(loc: tuple[Any, ...]) -> str:
    return ".".join(label(part) for part in loc) or "(arguments)"


def _string_problem(text: str) -> str | None:
    if len(text) > MAX_STRING_LENGTH:
        return f"text longer than {MAX_STRING_LENGTH} characters ({len(text)})"
    if "\x00" in text:
        return "text must not contain NUL (U+0000)"
    if not text.isascii() and _UNENCODABLE.search(text):
        return "text contains a lone UTF-16 surrogate, which cannot be encoded (send valid Unicode)"
    return None


def hostile_values(arguments: dict[str, Any]) -> list[dict[str, str]]:
    """Problems with values no tool may receive, whatever its input model (see the module doc)."""
    problems: list[dict[str, str]] = []
    stack: list[tuple[tuple[Any, ...], Any, int]] = [((), arguments, 0)]
    while stack and len(problems) < MAX_PROBLEMS:
        loc, value, depth = stack.pop()
        problem: str | None = None
        if isinstance(value, str):
            problem = _string_problem(value)
        elif isinstance(value, bool) or value is None:
            pass
        elif isinstance(value, int):
            if not MIN_INT <= value <= MAX_INT:
                problem = f"integer out of range ({MIN_INT} to {MAX_INT})"
        elif isinstance(value, float):
            if not math.isfinite(value):
                problem = "number must be finite"
        elif isinstance(value, dict | list):
            if depth >= MAX_DEPTH:
                problem = f"nested deeper than {MAX_DEPTH} levels"
            elif isinstance(value, dict):
                for key, item in value.items():
                    key_problem = _string_problem(key) if isinstance(key, str) else "keys must be strings"
                    if key_problem:
                        problems.append({"field": _field((*loc, key)), "problem": f"field name: {key_problem}"})
                    else:
                        stack.append(((*loc, key), item, depth + 1))
            else:
                stack.extend(((*loc, index), item, depth + 1) for index, item in enumerate(value))
        else:
            problem = f"not a JSON value ({type(value).__name__})"
        if problem:
            problems.append({"field": _field(loc), "problem": problem})
    return sorted(problems, key=lambda p: p["field"])


def _problem(error: Any, model: type[BaseModel]) -> dict[str, str]:
    loc = _field(tuple(error["loc"]))
    kind = error["type"]
    if kind == "extra_forbidden":
        expected = ", ".join(sorted(model.model_fields)) or "no arguments"
        return {"field": loc, "problem": f"unknown field; expected one of: {expected}"}
    if kind == "missing":
        return {"field": loc, "problem": "required field is missing"}
    message = label(error["msg"], 300)
    if "input" in error and kind not in {"model_type", "dict_type"}:
        message = f"{message} (got {_shown(error['input'])})"
    return {"field": loc, "problem": message}


def _bounded(problems: list[dict[str, str]]) -> list[dict[str, str]]:
    if len(problems) <= MAX_PROBLEMS:
        return problems
    more = len(problems) - MAX_PROBLEMS
    return [*problems[:MAX_PROBLEMS], {"field": "(arguments)", "problem": f"and {more} more problems"}]


def validate_arguments(tool_name: str, model: type[BaseModel], arguments: object) -> BaseModel:
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise InvalidArgumentsError(
            tool_name, [{"field": "(arguments)", "problem": "arguments must be a JSON object"}]
        )
    if problems := hostile_values(arguments):
        raise InvalidArgumentsError(tool_name, _bounded(problems))
    try:
        return model.model_validate(arguments)
    except ValidationError as exc:
        raise InvalidArgumentsError(tool_name, _bounded([_problem(e, model) for e in exc.errors()])) from None
    except RecursionError:
        raise InvalidArgumentsError(
            tool_name, [{"field": "(arguments)", "problem": f"nested deeper than {MAX_DEPTH} levels"}]) from None

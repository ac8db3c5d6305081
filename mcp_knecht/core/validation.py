"""Turn pydantic's validation errors into problems a model can fix: field and expectation."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ValidationError

from mcp_knecht.errors import InvalidArgumentsError

_MAX_SHOWN_INPUT = 60


def _shown(value: Any) -> str:
    """The value as the caller sent it: JSON (`null`, `true`, `"text"`), not Python (`None`, `True`)."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= _MAX_SHOWN_INPUT else text[: _MAX_SHOWN_INPUT - 1] + "…"


def _problem(error: Any, model: type[BaseModel]) -> dict[str, str]:
    loc = ".".join(str(part) for part in error["loc"]) or "(arguments)"
    kind = error["type"]
    if kind == "extra_forbidden":
        expected = ", ".join(sorted(model.model_fields)) or "no arguments"
        return {"field": loc, "problem": f"unknown field; expected one of: {expected}"}
    if kind == "missing":
        return {"field": loc, "problem": "required field is missing"}
    message = error["msg"]
    if "input" in error and kind not in {"model_type", "dict_type"}:
        message = f"{message} (got {_shown(error['input'])})"
    return {"field": loc, "problem": message}


def validate_arguments(tool_name: str, model: type[BaseModel], arguments: object) -> BaseModel:
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise InvalidArgumentsError(
            tool_name, [{"field": "(arguments)", "problem": "arguments must be a JSON object"}]
        )
    try:
        return model.model_validate(arguments)
    except ValidationError as exc:
        raise InvalidArgumentsError(tool_name, [_problem(e, model) for e in exc.errors()]) from None

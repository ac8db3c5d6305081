"""The page a turn that staged a proposal opens: seed 000's frontend action, pointed at the proposal.

    {"path": "/proposals/12",
     "queryParams": {"aiAction": "create" | "edit" | "delete",
                     "aiId": "<the record changed or deleted>",
                     "aiPrefill": "<JSON: the values proposed>",
                     "aiPreview": "<JSON: the record as it is, as the proposer may read it>"}}

Deliberate change from seed 000: the "form" a person completes is the proposal's review page — they
approve or reject the frozen call there; an edit is a new proposal. `aiPrefill` holds only what the
caller could write: the arguments the tool's input lets a caller set (never the values the server
froze in, such as a role, a row fingerprint or a resolved commit), with secrets masked as the
proposal shows them; an entity's `fields` are those its input declares (the gate has already refused
any its role may not write). Values too long for a URL are left out: the page shows the proposal.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from mcp_knecht.core.proposals import Proposal
from mcp_knecht.core.tools import Tool

AiAction = Literal["create", "edit", "delete"]
MAX_PARAM_CHARS = 2_000
"""Longest JSON value put into the URL (the proposal page shows at most this much of `aiPreview`)."""
_CREATES = ("create_", "dispatch_", "rerun_", "add_", "new_", "start_")
_ID_NAMES = ("id", "workflow", "project", "name")


def ai_action(tool: str, action: str | None) -> AiAction:
    """What the call does to a record, as the page names it."""
    if action == "delete" or tool.startswith("delete_"):
        return "delete"
    if action in ("create", "add") or tool.startswith(_CREATES):
        return "create"
    return "edit"


def record_id(arguments: dict[str, Any]) -> str | None:
    """The record an edit or delete addresses: `id`, else an `…_id`, else a workflow, project or name."""
    if arguments.get("id") is not None:
        return str(arguments["id"])
    for key, value in arguments.items():
        if key.endswith("_id") and value is not None:
            return str(value)
    return next((str(arguments[key]) for key in _ID_NAMES[1:] if arguments.get(key) is not None), None)


def _declared(tool: Tool, name: str) -> set[str] | None:
    """The keys a nested object argument declares (an entity's `fields`), or None when open."""
    schema = tool.input_schema
    node = schema.get("properties", {}).get(name, {})
    if "$ref" in node:
        node = schema.get("$defs", {}).get(node["$ref"].rsplit("/", 1)[-1], {})
    properties = node.get("properties")
    return set(properties) if isinstance(properties, dict) else None


def prefill(arguments: dict[str, Any], tool: Tool | None) -> dict[str, Any]:
    """The proposed values the caller may write (see the module docstring)."""
    if tool is None:
        return {}
    settable = set(tool.input_model.model_fields) - set(tool.frozen_fields) - {"action"}
    values = {key: value for key, value in arguments.items() if key in settable and value is not None}
    if isinstance(values.get("fields"), dict) and (declared := _declared(tool, "fields")) is not None:
        values["fields"] = {key: value for key, value in values["fields"].items() if key in declared}
    return values


def _json_param(value: Any) -> str | None:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return text if len(text) <= MAX_PARAM_CHARS else None


def action_for(proposal: Proposal, tool: Tool | None) -> dict[str, Any]:
    """The page to open for a proposal the turn staged."""
    kind = ai_action(proposal.tool, proposal.action)
    arguments = proposal.shown_arguments  # secrets masked, as people see the proposal
    params: dict[str, str] = {"aiAction": kind}
    if kind != "create" and (record := record_id(arguments)) is not None:
        params["aiId"] = record
    if kind != "delete" and (values := prefill(arguments, tool)) and (text := _json_param(values)):
        params["aiPrefill"] = text
    if kind != "create" and proposal.preview and (text := _json_param(proposal.preview)):
        params["aiPreview"] = text
    return {"path": f"/proposals/{proposal.id}", "queryParams": params}

"""Input models and descriptions of the generated tools, built per entity from its declaration.

Field names are `Literal`s of the declared fields, so an unknown name (or an injection attempt
in one) is refused by validation with the field named, and the schema lists the names a model may
use. `as_role` and `row_version` are filled in by the server when a call is staged (`freeze`) and
are left out of the schema.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, create_model
from pydantic.json_schema import SkipJsonSchema

from mcp_knecht.core.tools import ToolInput
from mcp_knecht.entities.declaration import EntitySpec
from mcp_knecht.entities.schema import Table

DEFAULT_LIMIT = 20
MAX_LIMIT = 50
MAX_TEXT = 10_000

Value = Annotated[str, Field(max_length=MAX_TEXT)] | int | float | bool | None

_AS_ROLE = (SkipJsonSchema[str | None], Field(default=None, max_length=200))  # type: ignore[misc]
_ROW_VERSION = (SkipJsonSchema[str | None], Field(default=None, pattern="^[0-9a-f]{64}$"))  # type: ignore[misc]


def _names(fields: tuple[str, ...]) -> Any:
    return Literal[fields]


def _model(name: str, **fields: Any) -> type[BaseModel]:
    model = create_model(name, __base__=ToolInput, **fields)
    model.model_rebuild(force=True)  # made from the configuration: built now, so a mistake fails the start
    return model


def _title(entity: EntitySpec) -> str:
    return "".join(part.capitalize() for part in entity.name.split("_"))


def _key(entity: EntitySpec, table: Table) -> Any:
    kind = table.kind(entity.primary_key)
    key = {"integer": int, "text": str, "other": str}.get(kind, str | int)
    return (key, Field(description=f"The {entity.primary_key} of the {entity.name} record."))


def query_model(entity: EntitySpec) -> type[BaseModel]:
    readable = _names(entity.list)
    return _model(
        f"Query{_title(entity)}Input",
        fields=(list[readable] | None, Field(  # type: ignore[valid-type]
            default=None, min_length=1,
            description="Fields to return (default: every field you may read). The primary key is always returned.")),
        filters=(dict[readable, Value], Field(  # type: ignore[valid-type]
            default_factory=dict,
            description="Exact matches, by field name (null matches an empty value). No ranges, no patterns.")),
        limit=(int, Field(default=DEFAULT_LIMIT, ge=1, le=MAX_LIMIT,
                          description=f"At most this many rows (1-{MAX_LIMIT}, default {DEFAULT_LIMIT}).")),
        as_role=_AS_ROLE,
    )


def create_model_for(entity: EntitySpec) -> type[BaseModel]:
    return _model(
        f"Create{_title(entity)}Input",
        fields=(dict[_names(entity.persist), Value], Field(  # type: ignore[misc]
            min_length=1, description="Values of the new record, by field name.")),
        as_role=_AS_ROLE,
    )


def update_model(entity: EntitySpec, table: Table) -> type[BaseModel]:
    return _model(
        f"Update{_title(entity)}Input",
        id=_key(entity, table),
        fields=(dict[_names(entity.persist), Value], Field(  # type: ignore[misc]
            min_length=1, description="New values, by field name; fields not named stay as they are.")),
        as_role=_AS_ROLE,
        row_version=_ROW_VERSION,
    )


def delete_model(entity: EntitySpec, table: Table) -> type[BaseModel]:
    return _model(f"Delete{_title(entity)}Input", id=_key(entity, table), as_role=_AS_ROLE,
                  row_version=_ROW_VERSION)


def _about(entity: EntitySpec) -> str:
    return f" ({entity.description.rstrip('.')})" if entity.description else ""


def query_description(entity: EntitySpec) -> str:
    return (
        f"Read {entity.name} records{_about(entity)}. Fields: {', '.join(entity.list)}; the primary key "
        f"{entity.primary_key} is always returned. Your role may read fewer: a field you may not read is left "
        "out of the rows, and filtering on it is an error; a field not listed here is an error. `filters` "
        "match exact values only: there are no ranges, no pattern or full-text search and no sorting (rows "
        f"come in {entity.primary_key} order). `limit` defaults to {DEFAULT_LIMIT}, at most {MAX_LIMIT}; "
        "`more` says whether further rows match. Never changes data."
    )


_STAGED = "Staged: an operator approves it before anything is written."


def create_description(entity: EntitySpec) -> str:
    return (
        f"Propose a new {entity.name} record{_about(entity)} with values for some of: "
        f"{', '.join(entity.persist)}. Your role may propose only some of these; a value for any other field "
        f"is refused with the field named. {_STAGED}"
    )


def update_description(entity: EntitySpec) -> str:
    return (
        f"Propose new values for fields of one {entity.name} record, by {entity.primary_key}: some of "
        f"{', '.join(entity.persist)} (your role may propose only some; others are refused with the field "
        f"named). The approver sees the record as you may read it. If the record changes before approval, "
        f"the update is refused instead of overwriting that change: read it again and propose anew. {_STAGED}"
    )


def delete_description(entity: EntitySpec) -> str:
    return (
        f"Propose to delete one {entity.name} record, by {entity.primary_key}. The approver sees the record "
        "as you may read it. If the record changes before approval, the delete is refused. " + _STAGED
    )

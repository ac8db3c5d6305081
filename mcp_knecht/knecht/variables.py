"""Project variables: the `project_variable` tool (`list` and `get` read, `set` and `delete` are
staged). A secret variable's value never leaves this module: not in a list, not in a get, not in a
preview, not in the result of a set. Its values feed the scrubber instead."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from mcp_knecht.core import clock
from mcp_knecht.core.database import Database, Row
from mcp_knecht.core.scrub import SecretRegistry
from mcp_knecht.core.tools import Fact, Tool, ToolContext, ToolInput
from mcp_knecht.errors import ConflictError, InvalidArgumentsError, NotFoundError
from mcp_knecht.knecht.refs import find_project

HIDDEN = "(secret: the value is never shown)"

# --- Input ---------------------------------------------------------------------------------------


class ProjectVariableInput(ToolInput):
    action: Literal["list", "get", "set", "delete"] = Field(
        description="list: names of all variables (values of non-secret ones); get: one variable; "
        "set: create or change one (staged); delete: remove one (staged)."
    )
    project: int | str = Field(description="The project: numeric id or slug.")
    name: str | None = Field(
        default=None,
        pattern=r"^[A-Z][A-Z0-9_]{0,63}$",
        description="The variable name (UPPER_SNAKE_CASE); required for get, set and delete.",
    )
    value: str | None = Field(
        default=None, max_length=4_000, description="For set: the new value (never shown back if secret)."
    )
    secret: bool | None = Field(
        default=None,
        description="For set: whether the value is secret (never returned by any tool). A new variable "
        "defaults to not secret; an existing secret cannot be made non-secret.",
    )
    previous: str | None = Field(
        default=None,
        max_length=64,
        description="Leave empty: for set and delete, the variable's state when the call is proposed ('absent', "
        "or when it last changed) is filled in; execution refuses if it changed since.",
    )


# --- Description ---------------------------------------------------------------------------------

PROJECT_VARIABLE = """\
Project variables (configuration and secrets the workflows use). action 'list': every variable of the \
project with name, whether it is secret, value (null for secrets), who changed it when; 'get': one \
variable; 'set': create or change one (needs `name` and `value`; `secret` true for credentials); \
'delete': remove one. 'set' and 'delete' need scope variables:write and are staged for approval. A \
secret's value is never returned by any tool, preview or result, not even to whoever set it."""

VARIABLE_FACTS = {
    "project": Fact(str, "the project's slug, however the call named it"),
    "secret": Fact(bool, "whether the variable is secret: for set, as it will be stored; for get and "
                         "delete, as it is now (false for a variable that does not exist)"),
    "exists": Fact(bool, "whether the variable exists now"),
}
"""What policy rules on project_variable may test besides the arguments: so a rule on deleting
secret variables holds although `secret` is not an argument of a delete."""

# --- Tool ----------------------------------------------------------------------------------------


class VariableTools:
    """The `project_variable` tool, bound to one store. `secrets` (if given) learns every secret
    value before it is written, and is refreshed after every change."""

    def __init__(self, db: Database, secrets: SecretRegistry | None = None) -> None:
        self.db = db
        self.secrets = secrets

    async def freeze(self, args: ProjectVariableInput, ctx: ToolContext) -> ProjectVariableInput:
        if args.action in ("list", "get"):
            return args  # reads depend on nothing that could change before they run
        name = _name(args)
        project = await find_project(self.db, args.project)
        existing = await get_variable(self.db, project["id"], name)
        if args.action == "set":
            value = _value(args)
            if check_secrecy(existing, args.secret):
                # From now on the pending proposal itself (get_proposal, previews) masks the value.
                self._mask(value)
        elif existing is None:
            await require_variable(self.db, project["id"], project["slug"], name)
        state = _state(existing)
        if args.previous is not None and args.previous != state:
            raise ConflictError(f"{name} changed since you read it; leave `previous` empty.")
        return args.model_copy(update={"project": project["slug"], "previous": state})

    async def preview(self, args: ProjectVariableInput, ctx: ToolContext) -> dict[str, Any]:
        project = await find_project(self.db, args.project)
        existing = await get_variable(self.db, project["id"], _name(args))
        preview: dict[str, Any] = {"project": project["slug"], "name": args.name, "action": args.action,
                                   "current": shown(existing) if existing else None}
        if args.action == "set":
            secret = check_secrecy(existing, args.secret)
            preview["new"] = {"secret": secret, "value": HIDDEN if secret else args.value}
        return preview

    async def project_variable(self, args: ProjectVariableInput, ctx: ToolContext) -> dict[str, Any]:
        project = await find_project(self.db, args.project)
        if args.action == "list":
            return {"project": project["slug"], "variables": await list_variables(self.db, project["id"])}
        name = _name(args)
        if args.action == "get":
            row = await require_variable(self.db, project["id"], project["slug"], name)
            return {"project": project["slug"], "variable": shown(row)}
        if args.action == "set":
            value = _value(args)
            if args.secret is not False:
                self._mask(value)  # masked before the write can show up anywhere
            result = await set_variable(self.db, project["id"], name, value, args.secret, ctx.actor.subject,
                                        previous=args.previous)
        else:
            result = await delete_variable(self.db, project["id"], name, previous=args.previous)
        if self.secrets is not None:
            self.secrets.update(await secret_values(self.db))
        return {"project": project["slug"], **result}

    async def facts(self, args: ProjectVariableInput, ctx: ToolContext) -> dict[str, Any]:
        """What policy rules on project_variable see (VARIABLE_FACTS)."""
        project = await find_project(self.db, args.project)
        facts: dict[str, Any] = {"project": project["slug"]}
        if args.name is not None:
            existing = await get_variable(self.db, project["id"], args.name)
            facts["exists"] = existing is not None
            if args.action == "set":
                facts["secret"] = check_secrecy(existing, args.secret)
            else:
                facts["secret"] = bool(existing["secret"]) if existing is not None else False
        return facts

    def _mask(self, value: str) -> None:
        if self.secrets is not None:
            self.secrets.add([value])

    def tools(self) -> list[Tool]:
        return [
            Tool(name="project_variable", description=PROJECT_VARIABLE, scope="variables:read",
                 input_model=ProjectVariableInput, handler=self.project_variable,
                 action_effects={"list": "read", "get": "read", "set": "write", "delete": "write"},
                 action_scopes={"set": "variables:write", "delete": "variables:write"},
                 preview=self.preview, freeze=self.freeze, frozen_fields=("previous",), facts=self.facts,
                 fact_fields=VARIABLE_FACTS, title="Project variables"),
        ]


def _state(row: Row | None) -> str:
    """What a set or delete was proposed against: 'absent', or when the variable last changed."""
    return "absent" if row is None else str(row["updated_at"])


def _refuse_if_changed(name: str, row: Row | None, previous: str | None) -> None:
    if previous is not None and _state(row) != previous:
        raise ConflictError(
            f"Variable {name} changed since it was proposed (it was {previous}, it is {_state(row)} now); nothing "
            "was changed. Read it again and propose again.",
            details={"name": name, "proposed_against": previous, "now": _state(row)})


def _name(args: ProjectVariableInput) -> str:
    if args.name is None:
        raise _missing("name", f"required for action {args.action!r}")
    return args.name


def _value(args: ProjectVariableInput) -> str:
    if args.value is None:
        raise _missing("value", "required for action 'set'")
    return args.value


def _missing(field: str, why: str) -> InvalidArgumentsError:
    return InvalidArgumentsError("project_variable", [{"field": field, "problem": why}])


# --- Queries -------------------------------------------------------------------------------------


def shown(row: Row) -> dict[str, Any]:
    secret = bool(row["secret"])
    return {
        "name": row["name"],
        "secret": secret,
        "value": None if secret else row["value"],
        **({"note": HIDDEN} if secret else {}),
        "updated_at": row["updated_at"],
        "updated_by": row["updated_by"],
    }


async def secret_values(db: Database) -> set[str]:
    """Every secret variable's value, of every project: the literal values the scrubber masks."""
    rows = await db.fetch_all("SELECT value FROM project_variables WHERE secret = 1")
    return {row["value"] for row in rows if row["value"]}


async def list_variables(db: Database, project_id: int) -> list[dict[str, Any]]:
    rows = await db.fetch_all(
        "SELECT * FROM project_variables WHERE project_id = ? ORDER BY name", (project_id,)
    )
    return [shown(row) for row in rows]


async def get_variable(db: Database, project_id: int, name: str) -> Row | None:
    return await db.fetch_one(
        "SELECT * FROM project_variables WHERE project_id = ? AND name = ?", (project_id, name)
    )


async def require_variable(db: Database, project_id: int, slug: str, name: str) -> Row:
    row = await get_variable(db, project_id, name)
    if row is None:
        raise NotFoundError(
            f"Project {slug!r} has no variable {name!r}. project_variable with action 'list' shows its variables."
        )
    return row


def check_secrecy(existing: Row | None, secret: bool | None) -> bool:
    """The secrecy a set will store; a secret never silently becomes readable."""
    if existing is None:
        return bool(secret)
    if existing["secret"] and secret is False:
        raise ConflictError(
            f"{existing['name']} is secret and cannot be made non-secret (its value would become readable). "
            "Delete it and create a new non-secret variable instead."
        )
    return bool(existing["secret"]) if secret is None else secret


async def set_variable(
    db: Database, project_id: int, name: str, value: str, secret: bool | None, actor: str, *,
    previous: str | None = None,
) -> dict[str, Any]:
    """Create or change a variable; with `previous`, only if it is still in that state (no lost update)."""
    now = clock.timestamp()
    async with db.transaction() as tx:
        existing = await tx.fetch_one(
            "SELECT * FROM project_variables WHERE project_id = ? AND name = ?", (project_id, name)
        )
        _refuse_if_changed(name, existing, previous)
        keep_secret = check_secrecy(existing, secret)
        if existing is None:
            await tx.execute(
                "INSERT INTO project_variables (project_id, name, value, secret, updated_at, updated_by)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (project_id, name, value, int(keep_secret), now, actor),
            )
        else:
            await tx.execute(
                "UPDATE project_variables SET value = ?, secret = ?, updated_at = ?, updated_by = ?"
                " WHERE project_id = ? AND name = ?",
                (value, int(keep_secret), now, actor, project_id, name),
            )
        row = await tx.fetch_one(
            "SELECT * FROM project_variables WHERE project_id = ? AND name = ?", (project_id, name)
        )
    assert row is not None
    return {"created": existing is None, "variable": shown(row)}


async def delete_variable(db: Database, project_id: int, name: str, *, previous: str | None = None) -> dict[str, Any]:
    async with db.transaction() as tx:
        existing = await tx.fetch_one(
            "SELECT * FROM project_variables WHERE project_id = ? AND name = ?", (project_id, name)
        )
        _refuse_if_changed(name, existing, previous)
        deleted = await tx.execute(
            "DELETE FROM project_variables WHERE project_id = ? AND name = ?", (project_id, name)
        )
    if deleted != 1:
        raise NotFoundError(f"Variable {name!r} does not exist (any more); nothing was deleted.")
    return {"deleted": name}

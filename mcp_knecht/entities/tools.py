"""The generated tools of one entity: `query_`, and the staged `create_`, `update_`, `delete_`.

    freeze   at proposal time: the caller's role (`as_role`) and, for an update or delete, the
             fingerprint of the row as it is now (`row_version`) go into the frozen arguments
    preview  at proposal time: the row as the proposer may read it ({} if missing or unreadable)
    handler  at execution: exactly the frozen values, as the frozen role; an update or delete
             refuses if the row's fingerprint changed (no lost update)

The gate freezes every call before it runs or is staged, so handlers and previews always read the
role from the frozen arguments — where `freeze` checked it against the caller's token. (At execution
after approval the actor carries no token claims at all.)
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from pydantic import BaseModel

from mcp_knecht.core.database import Database
from mcp_knecht.core.scrub import Scrubber, SecretRegistry
from mcp_knecht.core.tools import Tool, ToolContext
from mcp_knecht.entities import models
from mcp_knecht.entities.declaration import Declaration, EntitySpec
from mcp_knecht.entities.fingerprint import fingerprint
from mcp_knecht.entities.masks import Access, access, role_of
from mcp_knecht.entities.schema import Table
from mcp_knecht.entities.sql import Scalar, Statements, json_value
from mcp_knecht.errors import (
    ConflictError,
    InvalidArgumentsError,
    NotFoundError,
    PolicyDeniedError,
    StoreError,
)

_EXPECTED = {"integer": "an integer", "number": "a number", "boolean": "true or false", "text": "a string",
             "other": "a string"}


def _fits(kind: str, value: Scalar) -> bool:
    if value is None or kind == "any":
        return True
    if isinstance(value, bool):
        return kind == "boolean"
    if kind == "integer":
        return isinstance(value, int)
    if kind == "number":
        return isinstance(value, int | float)
    return isinstance(value, str) if kind in ("text", "other") else False


class EntityTools:
    """One entity's tools, bound to its database."""

    def __init__(self, entity: EntitySpec, table: Table, db: Database, declaration: Declaration,
                 key: bytes, *, scrub: Scrubber | SecretRegistry | None = None) -> None:
        self.entity = entity
        self.scrub = scrub if scrub is not None else Scrubber()
        self.table = table
        self.db = db
        self.claim = declaration.role_claim
        self.declaration = declaration
        self.key = key
        self.sql = Statements(entity, table, db.dialect)

    # --- who, and what they may do --------------------------------------------------------------

    def _access_now(self, tool: str, args: Any, ctx: ToolContext) -> Access:
        """The caller's access by its token's role (at freeze time); a role in the arguments must match."""
        role = role_of(ctx.actor, self.declaration)
        if args.as_role is not None and args.as_role != role:
            raise InvalidArgumentsError(tool, [{"field": "as_role",
                                                "problem": "set by the server from your token; leave it out"}])
        return access(self.entity, role, self.claim)

    def _access(self, args: Any) -> Access:
        """The access of the role frozen into the arguments."""
        return access(self.entity, args.as_role, self.claim)

    def _check_values(self, tool: str, prefix: str, values: Mapping[str, Scalar]) -> None:
        problems = [
            {"field": f"{prefix}.{name}",
             "problem": f"expected {_EXPECTED[self.table.kind(name)]} or null (got {type(value).__name__})"}
            for name, value in values.items() if not _fits(self.table.kind(name), value)
        ]
        if problems:
            raise InvalidArgumentsError(tool, problems)

    def _check_writable(self, tool: str, granted: Access, fields: Mapping[str, Scalar], *, update: bool) -> None:
        problems = []
        for name in fields:
            if update and name == self.entity.primary_key:
                problems.append({"field": f"fields.{name}", "problem": "the primary key cannot be changed"})
            elif name not in granted.write:
                problems.append({"field": f"fields.{name}",
                                 "problem": f"role {granted.role!r} may not propose a value for this field"})
        if problems:
            raise InvalidArgumentsError(tool, problems)
        self._check_values(tool, "fields", fields)

    def _visible(self, granted: Access, row: Mapping[str, Any] | None,
                 columns: tuple[str, ...] | None = None) -> dict[str, Any]:
        if row is None:
            return {}
        return {name: json_value(row[name]) for name in (columns or granted.read)}

    def _refused(self, exc: StoreError) -> ConflictError:
        return ConflictError(f"The database refused the change to {self.entity.name}: {exc.message}")

    async def _current(self, row_id: Scalar) -> Mapping[str, Any] | None:
        return await self.db.fetch_one(self.sql.row(), [self.sql.key(row_id)])

    async def _version(self, row_id: Scalar) -> str:
        return fingerprint(self.key, self.entity.name, row_id, await self._current(row_id))

    # --- query -------------------------------------------------------------------------------------

    async def query(self, args: Any, ctx: ToolContext) -> dict[str, Any]:
        tool = f"query_{self.entity.name}"
        granted = self._access(args)
        if not granted.read:
            raise PolicyDeniedError(f"Role {granted.role!r} may read no field of {self.entity.name}.")
        hidden = [name for name in args.filters if name not in granted.read]
        if hidden:
            raise InvalidArgumentsError(tool, [
                {"field": f"filters.{name}", "problem": "you may not read this field, so you cannot filter on it"}
                for name in hidden])
        self._check_values(tool, "filters", args.filters)
        if self.scrub.data(dict(args.filters)) != dict(args.filters):
            # A filter compares with what the caller may see: a value that is shown masked matches
            # nothing — else an exact filter would confirm a guessed secret by the rows it finds.
            return {"entity": self.entity.name, "rows": [], "more": False}
        wanted = dict.fromkeys(args.fields or self.entity.list)
        columns = tuple(name for name in granted.read if name in wanted or name == self.entity.primary_key)
        sql, params = self.sql.query(columns, args.filters, args.limit + 1)
        try:
            rows = await self.db.fetch_all(sql, params)
        except StoreError as exc:
            if str(exc.details.get("sqlstate", "")).startswith("22"):  # a value the column's type rejects
                raise InvalidArgumentsError(tool, [{"field": "filters", "problem": exc.message}]) from None
            raise
        return {"entity": self.entity.name, "rows": [self._visible(granted, r, columns) for r in rows[:args.limit]],
                "more": len(rows) > args.limit}

    # --- freeze and preview (at proposal time) ------------------------------------------------------

    async def freeze(self, verb: str, args: Any, ctx: ToolContext) -> BaseModel:
        tool = f"{verb}_{self.entity.name}"
        granted = self._access_now(tool, args, ctx)
        update: dict[str, Any] = {"as_role": granted.role}
        if verb in ("create", "update"):
            self._check_writable(tool, granted, args.fields, update=verb == "update")
        if verb == "delete" and not granted.delete:
            raise PolicyDeniedError(f"Role {granted.role!r} may not delete {self.entity.name} records.")
        if verb in ("update", "delete"):
            version = await self._version(args.id)
            if args.row_version is not None and args.row_version != version:
                raise ConflictError(f"{self.entity.name} {args.id} changed since you read it; read it again.")
            update["row_version"] = version
        frozen: BaseModel = args.model_copy(update=update)
        return frozen

    async def preview(self, args: Any, ctx: ToolContext) -> dict[str, Any]:
        granted = self._access(args)
        shown: dict[str, Any] = {"entity": self.entity.name}
        if "id" in type(args).model_fields:
            shown["id"] = args.id
            shown["current"] = self._visible(granted, await self._current(args.id))
        if "fields" in type(args).model_fields:
            shown["proposed"] = dict(args.fields)
        else:
            shown["delete"] = True
        return shown

    # --- execution ---------------------------------------------------------------------------------

    async def create(self, args: Any, ctx: ToolContext) -> dict[str, Any]:
        granted = self._access(args)
        self._check_writable(f"create_{self.entity.name}", granted, args.fields, update=False)
        sql, params = self.sql.insert(args.fields)
        try:
            async with self.db.transaction() as tx:
                key = (await tx.fetch_one(sql, params) or {})[self.entity.primary_key]
                row = await tx.fetch_one(self.sql.row(), [self.sql.key(json_value(key))])
        except StoreError as exc:
            raise self._refused(exc) from None
        return {"entity": self.entity.name, "created": self._visible(granted, row)}

    async def _change(self, args: Any, ctx: ToolContext, verb: str) -> tuple[Access, dict[str, Any] | None]:
        granted = self._access(args)
        if verb == "update":
            self._check_writable(f"update_{self.entity.name}", granted, args.fields, update=True)
        elif not granted.delete:
            raise PolicyDeniedError(f"Role {granted.role!r} may not delete {self.entity.name} records.")
        key = self.sql.key(args.id)
        try:
            async with self.db.transaction() as tx:
                row = await tx.fetch_one(self.sql.row(lock=True), [key])
                if fingerprint(self.key, self.entity.name, args.id, row) != args.row_version:
                    raise ConflictError(
                        f"{self.entity.name} {args.id} changed since the change was proposed; nothing was "
                        "written. Read it again and propose anew.")
                if row is None:
                    raise NotFoundError(f"{self.entity.name} {args.id} does not exist.")
                if verb == "delete":
                    await tx.execute(self.sql.delete(), [key])
                    return granted, None
                sql, params = self.sql.update(args.id, args.fields)
                await tx.execute(sql, params)
                return granted, await tx.fetch_one(self.sql.row(), [key])
        except StoreError as exc:
            raise self._refused(exc) from None

    async def update(self, args: Any, ctx: ToolContext) -> dict[str, Any]:
        granted, row = await self._change(args, ctx, "update")
        return {"entity": self.entity.name, "id": args.id, "updated": self._visible(granted, row)}

    async def delete(self, args: Any, ctx: ToolContext) -> dict[str, Any]:
        await self._change(args, ctx, "delete")
        return {"entity": self.entity.name, "id": args.id, "deleted": True}

    # --- the tools -----------------------------------------------------------------------------------

    def tools(self) -> list[Tool]:
        e = self.entity
        made = [Tool(name=f"query_{e.name}", description=models.query_description(e), scope=e.read_scope,
                     input_model=models.query_model(e), handler=self.query, title=f"Query {e.name}",
                     freeze=partial(self.freeze, "query"), frozen_fields=("as_role",))]
        if e.persist:
            made += [
                Tool(name=f"create_{e.name}", description=models.create_description(e), scope=e.write_scope,
                     input_model=models.create_model_for(e), handler=self.create, effect="write",
                     title=f"Create a {e.name} record", preview=self.preview, freeze=partial(self.freeze, "create"),
                     frozen_fields=("as_role",)),
                Tool(name=f"update_{e.name}", description=models.update_description(e), scope=e.write_scope,
                     input_model=models.update_model(e, self.table), handler=self.update, effect="write",
                     title=f"Update a {e.name} record", preview=self.preview, freeze=partial(self.freeze, "update"),
                     frozen_fields=("as_role", "row_version")),
            ]
        if any(mask.delete for mask in e.roles.values()):
            made.append(Tool(name=f"delete_{e.name}", description=models.delete_description(e), scope=e.write_scope,
                             input_model=models.delete_model(e, self.table), handler=self.delete, effect="write",
                             title=f"Delete a {e.name} record", preview=self.preview,
                             freeze=partial(self.freeze, "delete"), frozen_fields=("as_role", "row_version")))
        return made

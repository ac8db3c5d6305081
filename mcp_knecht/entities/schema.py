"""The real tables behind the declaration: columns introspected at start, the declaration checked
against them, and the kind of value each column takes.

SQLite: `pragma_table_info(?)`. PostgreSQL: `pg_attribute` of `to_regclass(?)`, which resolves
the table through the connection's `search_path` (or the declared `schema`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import msgspec

from mcp_knecht.core.database import Database
from mcp_knecht.entities.declaration import EntitySpec
from mcp_knecht.errors import ConfigError


def quote(identifier: str) -> str:
    """A quoted SQL identifier (the same syntax on SQLite and PostgreSQL)."""
    return '"' + identifier.replace('"', '""') + '"'

Kind = Literal["integer", "number", "boolean", "text", "other", "any"]
"""What a value must be before it is bound: `other` (dates, uuids, enums, JSON on PostgreSQL) is
written as text and cast by the database; `any` (SQLite columns without a type) takes any scalar."""


class Column(msgspec.Struct, frozen=True):
    name: str
    kind: Kind
    cast: str | None = None
    """PostgreSQL: the column's type without modifiers, to cast a text parameter to."""


class Table(msgspec.Struct, frozen=True):
    columns: Mapping[str, Column]

    def kind(self, name: str) -> Kind:
        return self.columns[name].kind


def _sqlite_kind(declared: str) -> Kind:
    """SQLite's type affinity rules (https://sqlite.org/datatype3.html#affinity_name_examples)."""
    t = declared.upper()
    if "INT" in t:
        return "integer"
    if any(part in t for part in ("CHAR", "CLOB", "TEXT")):
        return "text"
    if not t or "BLOB" in t:
        return "any"
    if any(part in t for part in ("REAL", "FLOA", "DOUB")):
        return "number"
    if "BOOL" in t:
        return "boolean"
    return "any"  # NUMERIC affinity (DATE, DECIMAL, …): SQLite stores what it is given


def _pg_kind(category: str, type_name: str) -> Kind:
    if type_name in ("int2", "int4", "int8"):
        return "integer"
    if category == "N":
        return "number"
    if category == "B":
        return "boolean"
    if category == "S":
        return "text"
    return "other"


_PG_COLUMNS = (
    "SELECT a.attname AS name, format_type(a.atttypid, NULL) AS cast_to, t.typcategory AS category,"
    " t.typname AS type_name"
    " FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid"
    " WHERE a.attrelid = to_regclass(?) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum"
)


async def introspect(db: Database, entity: EntitySpec) -> Table | None:
    """The table's columns, or None when there is no such table."""
    if db.dialect == "sqlite":
        rows = await db.fetch_all("SELECT name, type FROM pragma_table_info(?)", (entity.table,))
        columns = [Column(r["name"], _sqlite_kind(r["type"] or "")) for r in rows]
    else:
        qualified = f"{quote(entity.schema)}.{quote(entity.table)}" if entity.schema else quote(entity.table)
        rows = await db.fetch_all(_PG_COLUMNS, (qualified,))
        columns = [Column(r["name"], _pg_kind(r["category"], r["type_name"]), r["cast_to"]) for r in rows]
    return Table({c.name: c for c in columns}) if columns else None


def check(entity: EntitySpec, table: Table | None, path: Path) -> Table:
    """Every column the declaration names exists; otherwise the server does not start."""
    where = f"{path}: entities.{entity.name}"
    if table is None:
        schema = f" in schema {entity.schema!r}" if entity.schema else ""
        raise ConfigError(f"{where}.table: no table {entity.table!r}{schema} in the entity's database.")
    known = ", ".join(table.columns)
    named = [("primary_key", [entity.primary_key]), ("list", entity.list), ("persist", entity.persist)]
    for role, mask in entity.roles.items():
        named += [(f"roles.{role}.read", sorted(mask.read)), (f"roles.{role}.write", sorted(mask.write))]
    for key, columns in named:
        for column in columns:
            if column not in table.columns:
                raise ConfigError(
                    f"{where}.{key}: table {entity.table!r} has no column {column!r}; its columns are: {known}."
                )
    return table

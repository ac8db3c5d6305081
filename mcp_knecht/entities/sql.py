"""SQL for entities, written in one place: identifiers only from the validated declaration (and
always quoted), values only as parameters.

The one dialect difference: PostgreSQL gets every value as text and casts it to the column's type
(`CAST(?::text AS type)`), so dates, uuids, enums and numerics all bind the same way; SQLite binds
the value itself and applies the column's affinity.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from mcp_knecht.entities.schema import Table, quote

if TYPE_CHECKING:
    from mcp_knecht.entities.declaration import EntitySpec

Scalar = str | int | float | bool | None


def json_value(value: Any) -> Any:
    """A column value as JSON: dates as ISO text, decimals and uuids as text, bytes as base64."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dt.date | dt.time):  # datetime is a date
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    return str(value)


class Statements(msgspec.Struct, frozen=True):
    entity: EntitySpec
    table: Table
    dialect: str

    @property
    def _from(self) -> str:
        name = quote(self.entity.table)
        return f"{quote(self.entity.schema)}.{name}" if self.entity.schema else name

    @property
    def _pk(self) -> str:
        return quote(self.entity.primary_key)

    def _param(self, column: str) -> str:
        if self.dialect == "sqlite":
            return "?"
        return f"CAST(?::text AS {self.table.columns[column].cast})"

    def _bind(self, value: Scalar) -> Any:
        if self.dialect == "sqlite" or value is None:
            return value
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    def _select_list(self, columns: Sequence[str]) -> str:
        return ", ".join(quote(c) for c in columns)

    def query(self, columns: Sequence[str], filters: Mapping[str, Scalar], limit: int) -> tuple[str, list[Any]]:
        conditions, params = [], []
        for column, value in filters.items():
            if value is None:
                conditions.append(f"{quote(column)} IS NULL")
            else:
                conditions.append(f"{quote(column)} = {self._param(column)}")
                params.append(self._bind(value))
        where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
        sql = f"SELECT {self._select_list(columns)} FROM {self._from}{where} ORDER BY {self._pk} LIMIT ?"
        return sql, [*params, limit]

    def row(self, *, lock: bool = False) -> str:
        """Every column of one row (for fingerprints and previews); locked inside a transaction."""
        sql = f"SELECT {self._select_list(list(self.table.columns))} FROM {self._from} WHERE {self._pk} = "
        sql += self._param(self.entity.primary_key)
        return sql + (" FOR UPDATE" if lock and self.dialect != "sqlite" else "")

    def key(self, value: Scalar) -> Any:
        return self._bind(value)

    def insert(self, values: Mapping[str, Scalar]) -> tuple[str, list[Any]]:
        columns = list(values)
        placeholders = ", ".join(self._param(c) for c in columns)
        sql = (f"INSERT INTO {self._from} ({self._select_list(columns)}) VALUES ({placeholders})"
               f" RETURNING {self._pk}")
        return sql, [self._bind(values[c]) for c in columns]

    def update(self, key: Scalar, values: Mapping[str, Scalar]) -> tuple[str, list[Any]]:
        assignments = ", ".join(f"{quote(c)} = {self._param(c)}" for c in values)
        sql = f"UPDATE {self._from} SET {assignments} WHERE {self._pk} = {self._param(self.entity.primary_key)}"
        return sql, [*(self._bind(v) for v in values.values()), self._bind(key)]

    def delete(self) -> str:
        return f"DELETE FROM {self._from} WHERE {self._pk} = {self._param(self.entity.primary_key)}"

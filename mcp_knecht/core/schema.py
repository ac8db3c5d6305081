"""Schema migrations as a component declares them: a namespace and a folder of SQL files.

    Migrations("knecht", "mcp_knecht.knecht")   →  mcp_knecht/knecht/sql/<dialect>/NNNN_name.sql

The store owns its own tables (namespace `store`); each toolset ships and declares its own. The
store applies them in order at start, each file once, recorded per namespace.
"""

from __future__ import annotations

import re
from importlib import resources

import msgspec

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_NAMESPACE = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


class Migration(msgspec.Struct, frozen=True):
    """One numbered SQL file of a namespace's schema, applied once, in order."""
    namespace: str
    version: int
    name: str
    sql: str

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.version:04d}_{self.name}"


class Migrations(msgspec.Struct, frozen=True):
    """Where a namespace keeps its migration files, one folder per SQL dialect."""
    namespace: str
    package: str
    """An importable package whose folder `folder/<dialect>/` holds `NNNN_name.sql` files."""
    folder: str = "sql"

    def __post_init__(self) -> None:
        if not _NAMESPACE.match(self.namespace):
            raise ValueError(f"Migration namespace {self.namespace!r}: use a lower-case identifier")

    def available(self, dialect: str) -> list[Migration]:
        directory = resources.files(self.package) / self.folder / dialect
        if not directory.is_dir():
            return []
        found = []
        for entry in directory.iterdir():
            if match := _NAME.match(entry.name):
                found.append(Migration(self.namespace, int(match[1]), match[2], entry.read_text(encoding="utf-8")))
        return sorted(found, key=lambda m: m.version)

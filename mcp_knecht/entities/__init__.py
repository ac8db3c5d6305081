"""Entities: the tables of any SQLite or PostgreSQL database as field-masked tools (seed 000).

    KNECHT_TOOLSETS=mcp_knecht.knecht:toolset,mcp_knecht.entities:toolset

reads `<config_dir>/entities.toml` (format: `declaration.py` and the README, "Entities"), opens each
entity's database (one connection per distinct URL; the server's own store is reused when it is
the same URL), checks the declaration against the real tables, and serves per entity
`query_<entity>` (scope `<entity>:read`) and the staged `create_/update_/delete_<entity>`
(scope `<entity>:write`). Those scopes must be in `scopes/catalogue.toml`.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from mcp_knecht.core.toolset import Database, Toolset, ToolsetContext
from mcp_knecht.entities.declaration import ENTITIES_FILE, Declaration, EntitySpec, load_declaration
from mcp_knecht.entities.fingerprint import load_key
from mcp_knecht.entities.schema import check, introspect
from mcp_knecht.entities.tools import EntityTools
from mcp_knecht.errors import ConfigError, StoreError
from mcp_knecht.store import open_database


class _Databases:
    """One open database per distinct URL, closed together."""

    def __init__(self, store: Database) -> None:
        self._store = store
        self._opened: dict[str, Database] = {}

    async def get(self, entity: EntitySpec, declaration: Declaration) -> Database:
        url = entity.database_url
        if url == self._store.url:
            return self._store
        if url not in self._opened:
            try:
                self._opened[url] = await open_database(url, migrate=False)
            except StoreError as exc:
                raise ConfigError(f"{declaration.path}: entities.{entity.name}.database: {exc.message}") from None
        return self._opened[url]

    async def close(self) -> None:
        for db in self._opened.values():
            await db.close()
        self._opened.clear()


async def toolset(context: ToolsetContext) -> Toolset:
    declaration = load_declaration(context.config_dir, context.env)
    if declaration is None:
        raise ConfigError(f"The entities toolset is enabled, but {context.config_dir / ENTITIES_FILE} is missing.")
    key = load_key(context.settings)
    databases = _Databases(context.store)
    tools = []
    try:
        for entity in declaration.entities.values():
            db = await databases.get(entity, declaration)
            try:
                table = await introspect(db, entity)
            except StoreError as exc:
                raise ConfigError(f"{declaration.path}: entities.{entity.name}: {exc.message}") from None
            tools += EntityTools(entity, check(entity, table, declaration.path), db, declaration, key,
                                 scrub=context.scrubber).tools()
    except BaseException:
        await databases.close()
        raise
    passwords = {urlsplit(e.database_url).password for e in declaration.entities.values()}
    context.scrubber.add(p for p in passwords if p)
    return Toolset(name="entities", tools=tools, close=databases.close, instructions=_instructions(declaration))


def _instructions(declaration: Declaration) -> str:
    names = ", ".join(sorted(declaration.entities)) or "none"
    return (
        f"The query_<entity> tools read records of an application's database (entities: {names}); you see "
        "only the fields your role may read, and filters match exactly. create_/update_/delete_<entity> never "
        "write by themselves: they submit a proposal that a human approves or rejects. Never invent field "
        "names or record ids: read them first."
    )


__all__ = ["toolset"]

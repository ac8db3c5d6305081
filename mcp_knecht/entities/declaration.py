"""The declaration of exposed entities: `<config_dir>/entities.toml`, parsed strictly.

    role_claim   = "knecht_role"        # the token claim that names the caller's role (default)
    default_role = "viewer"             # optional: the role of a token without that claim

    [entities.users]
    database     = "sqlite:///app.db"   # or database_env = "APP_DATABASE_URL"
    table        = "users"              # optional, defaults to the entity name
    schema       = "public"             # optional, PostgreSQL only
    primary_key  = "id"                 # optional, defaults to "id"
    description  = "People who can sign in to the shop."
    list         = ["username", "email", "role"]      # what the agent may ever read (+ primary key)
    persist      = ["username", "email", "role"]      # what the agent may ever propose to write

    [entities.users.roles.admin]
    read   = ["id", "username", "email", "role"]
    write  = ["username", "email", "role"]
    delete = true                       # optional, default false

Every problem stops the server with a `ConfigError` that names the file, the key and the problem;
the columns are checked against the real table later (`schema.py`).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from mcp_knecht.core.database_url import dialect_of, normalise, sqlite_path
from mcp_knecht.errors import ConfigError

ENTITIES_FILE = "entities.toml"
DEFAULT_ROLE_CLAIM = "knecht_role"
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
_TOP_KEYS = {"role_claim", "default_role", "entities"}
_ENTITY_KEYS = {"database", "database_env", "table", "schema", "primary_key", "description", "list",
                "persist", "roles"}
_ROLE_KEYS = {"read", "write", "delete"}


class RoleMask(msgspec.Struct, frozen=True):
    read: frozenset[str]
    write: frozenset[str]
    delete: bool = False


class EntitySpec(msgspec.Struct, frozen=True):
    name: str
    database_url: str
    table: str
    schema: str | None
    primary_key: str
    description: str
    list: tuple[str, ...]
    """Readable fields in declaration order; always starts with the primary key."""
    persist: tuple[str, ...]
    roles: Mapping[str, RoleMask]

    @property
    def fields(self) -> tuple[str, ...]:
        """Every column the declaration names (list, then the rest of persist)."""
        return (*self.list, *(f for f in self.persist if f not in self.list))

    @property
    def read_scope(self) -> str:
        return f"{self.name}:read"

    @property
    def write_scope(self) -> str:
        return f"{self.name}:write"


class Declaration(msgspec.Struct, frozen=True):
    path: Path
    role_claim: str
    default_role: str | None
    entities: Mapping[str, EntitySpec]


class _Reader:
    """Checks with messages that say where: `entities.toml: entities.users.list: …`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, where: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.path}: {where}: {problem}")

    def table(self, raw: object, where: str, allowed: set[str]) -> dict[str, Any]:
        if not isinstance(raw, dict):
            raise self.fail(where, "expected a table")
        if unknown := sorted(set(raw) - allowed):
            raise self.fail(where, f"unknown key(s) {', '.join(unknown)}; expected: {', '.join(sorted(allowed))}")
        return raw

    def text(self, raw: object, where: str) -> str:
        if not isinstance(raw, str) or not raw.strip():
            raise self.fail(where, "expected a non-empty string")
        return raw

    def names(self, raw: object, where: str) -> tuple[str, ...]:
        if not isinstance(raw, list) or not all(isinstance(v, str) and v for v in raw):
            raise self.fail(where, "expected a list of column names")
        if len(set(raw)) != len(raw):
            raise self.fail(where, "a column is named twice")
        return tuple(raw)


def load_declaration(config_dir: Path, env: Mapping[str, str]) -> Declaration | None:
    """The declaration in `config_dir`, or None when there is no entities.toml."""
    path = config_dir / ENTITIES_FILE
    if not path.is_file():
        return None
    try:
        with path.open("rb") as handle:
            raw = tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: syntax error: {exc}") from None
    read = _Reader(path)
    top = read.table(raw, "(top level)", _TOP_KEYS)
    role_claim = read.text(top.get("role_claim", DEFAULT_ROLE_CLAIM), "role_claim")
    default_role = read.text(top["default_role"], "default_role") if "default_role" in top else None
    bodies = read.table(top.get("entities", {}), "entities", set(top.get("entities", {})))
    if not bodies:
        raise read.fail("entities", "declares no entity; add [entities.NAME] tables or remove the file")
    entities = {name: _entity(read, name, body, config_dir, env) for name, body in bodies.items()}
    if default_role is not None and not any(default_role in e.roles for e in entities.values()):
        raise read.fail("default_role", f"{default_role!r} is not a role of any entity")
    return Declaration(path, role_claim, default_role, entities)


def _database_url(read: _Reader, where: str, body: dict[str, Any], config_dir: Path,
                  env: Mapping[str, str]) -> str:
    if ("database" in body) == ("database_env" in body):
        raise read.fail(where, "give exactly one of database (a URL) or database_env (a variable holding it)")
    if "database" in body:
        url = read.text(body["database"], f"{where}.database")
    else:
        variable = read.text(body["database_env"], f"{where}.database_env")
        url = env.get(variable, "")
        if not url:
            raise read.fail(f"{where}.database_env", f"the environment variable {variable} is not set")
    try:
        if dialect_of(url) == "sqlite":
            path = sqlite_path(url)
            if not path.is_absolute():
                path = config_dir / path  # relative to the config dir, not to the working directory
            if not path.is_file():
                raise read.fail(f"{where}.database", f"no SQLite database at {path}")
            return normalise(str(path))
    except ConfigError as exc:
        if str(read.path) in exc.message:
            raise
        raise read.fail(f"{where}.database", exc.message) from None
    return url


def _entity(read: _Reader, name: str, raw: object, config_dir: Path, env: Mapping[str, str]) -> EntitySpec:
    where = f"entities.{name}"
    if not _NAME.match(name):
        raise read.fail(where, "entity names are lower-case identifiers (a-z, 0-9, _), at most 40 characters, "
                               "since they form tool names such as query_<entity>")
    body = read.table(raw, where, _ENTITY_KEYS)
    pk = read.text(body.get("primary_key", "id"), f"{where}.primary_key")
    listed = read.names(body.get("list", []), f"{where}.list")
    persist = read.names(body.get("persist", []), f"{where}.persist")
    roles_raw = read.table(body.get("roles", {}), f"{where}.roles", set(body.get("roles", {})))
    roles: dict[str, RoleMask] = {}
    for role, mask_raw in roles_raw.items():
        role_where = f"{where}.roles.{role}"
        mask = read.table(mask_raw, role_where, _ROLE_KEYS)
        role_read = read.names(mask.get("read", []), f"{role_where}.read")
        role_write = read.names(mask.get("write", []), f"{role_where}.write")
        deletes = mask.get("delete", False)
        if not isinstance(deletes, bool):
            raise read.fail(f"{role_where}.delete", "expected true or false")
        roles[role] = RoleMask(frozenset(role_read), frozenset(role_write), deletes)
    if not roles:
        raise read.fail(f"{where}.roles", "declares no role; without one nobody can use the entity")
    return EntitySpec(
        name=name,
        database_url=_database_url(read, where, body, config_dir, env),
        table=read.text(body.get("table", name), f"{where}.table"),
        schema=read.text(body["schema"], f"{where}.schema") if "schema" in body else None,
        primary_key=pk,
        description=str(body.get("description", "")).strip(),
        list=(pk, *(f for f in listed if f != pk)),
        persist=persist,
        roles=roles,
    )

"""The entities declaration: a misspelt table, column or key stops the server with a message
naming the file, the entity and the name; roles come from a configurable claim or a default."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mcp_knecht.errors import ConfigError, ScopeCatalogueError
from tests.test_entities_support import (
    EXAMPLE,
    actor,
    approve,
    call,
    client_for,
    entity_app,
    entity_env,
    make_app_database,
    make_config,
    rows,
)

pytestmark = pytest.mark.anyio

MINIMAL = """
[entities.orders]
database = "app.db"
list     = ["status", "note"]
persist  = ["note"]

[entities.orders.roles.clerk]
read  = ["id", "status", "note"]
write = ["note"]
"""


@pytest.fixture
async def app_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    await make_app_database(url)
    return url


async def start_fails(env: dict[str, str], config: Path) -> str:
    with pytest.raises(ConfigError) as failure:
        async with entity_app(entity_env(env, config)):
            pass
    return failure.value.message


@pytest.mark.parametrize(("change", "names"), [
    (("database = \"app.db\"", "database = \"app.db\"\ntable = \"ordrs\""), ["entities.orders.table", "'ordrs'"]),
    (('list     = ["status", "note"]', 'list = ["status", "nots"]'), ["entities.orders.list", "'nots'"]),
    (('persist  = ["note"]', 'persist = ["notes"]'), ["entities.orders.persist", "'notes'"]),
    (('read  = ["id", "status", "note"]', 'read = ["id", "stauts"]'), ["roles.clerk.read", "'stauts'"]),
    (('write = ["note"]', 'write = ["nope"]'), ["roles.clerk.write", "'nope'"]),
    (("database = \"app.db\"", "database = \"app.db\"\nprimary_key = \"order_id\""), ["primary_key", "'order_id'"]),
    (("list     =", "lists    ="), ["entities.orders", "unknown key(s) lists"]),
    (('read  = ["id", "status", "note"]', 'read = ["id"]\nupdate = true'), ["roles.clerk", "unknown key(s) update"]),
    (("[entities.orders]", "[entities.Orders-2]"), ["entities.Orders-2", "lower-case"]),
    (("database = \"app.db\"", "database = \"missing.db\""), ["entities.orders.database", "missing.db"]),
    (("database = \"app.db\"", "database = \"mysql://x/y\""), ["entities.orders.database", "mysql"]),
    (("database = \"app.db\"", "database_env = \"APP_DB_UNSET\""), ["database_env", "APP_DB_UNSET"]),
    (("[entities.orders.roles.clerk]", "[entities.orders.roles.clerk]\ndelete = \"yes\""), ["delete", "true or false"]),
    (("list     =", "list ="), None),  # control: the unchanged declaration starts
])
async def test_a_misspelt_declaration_stops_the_server_naming_it(
        env: dict[str, str], app_url: str, tmp_path: Path, change: tuple[str, str], names: list[str] | None) -> None:
    text = MINIMAL.replace(*change)
    assert text != MINIMAL or names is None
    config = make_config(tmp_path / "config", app_url, entities=text, extra="")
    if names is None:
        async with entity_app(entity_env(env, config)) as app:
            assert "query_orders" in app.registry
        return
    message = await start_fails(env, config)
    assert "entities.toml" in message
    for name in names:
        assert name in message, message


async def test_a_syntax_error_and_a_missing_file_stop_the_server(env: dict[str, str], app_url: str,
                                                                 tmp_path: Path) -> None:
    config = make_config(tmp_path / "config", app_url, entities="[entities.orders\n", extra="")
    assert "syntax error" in await start_fails(env, config)
    (config / "entities.toml").unlink()
    assert "entities.toml is missing" in await start_fails(env, config)


async def test_entity_scopes_must_be_in_the_catalogue(env: dict[str, str], app_url: str, tmp_path: Path) -> None:
    config = make_config(tmp_path / "config", app_url, entities=MINIMAL, extra="")
    catalogue = config / "scopes" / "catalogue.toml"
    catalogue.write_text(catalogue.read_text().replace('"orders:read"', '"orders:reed"'))
    (config / "scopes" / "profiles.toml").unlink()  # its profiles name orders:read too
    with pytest.raises(ScopeCatalogueError, match="orders:read"):
        async with entity_app(entity_env(env, config)):
            pass


async def test_a_misspelt_column_is_named_on_postgresql_too(env: dict[str, str], database_url: str,
                                                            tmp_path: Path) -> None:
    await make_app_database(database_url)
    config = make_config(tmp_path / "config", database_url, entities=MINIMAL.replace('"note"]\n\n', '"nte"]\n\n'),
                         extra="")
    message = await start_fails(env, config)
    assert "entities.orders.persist" in message and "'nte'" in message and "status" in message


async def test_the_role_claim_and_a_default_role_are_configurable(env: dict[str, str], app_url: str,
                                                                  tmp_path: Path) -> None:
    text = 'role_claim = "app_role"\ndefault_role = "clerk"\n' + MINIMAL
    config = make_config(tmp_path / "config", app_url, entities=text, extra="")
    async with entity_app(entity_env(env, config)) as app:
        async with client_for(app, actor(None, scopes=["orders:read"])) as client:
            assert [list(r) for r in await rows(client, "query_orders", {"limit": 1})] == [["id", "status", "note"]]
        # knecht_role is not the configured claim: the default applies, not "admin"
        async with client_for(app, actor("admin", scopes=["orders:read"])) as client:
            assert len(await rows(client, "query_orders", {"limit": 2})) == 2
    config = make_config(tmp_path / "config", app_url, entities='default_role = "boss"\n' + MINIMAL, extra="")
    assert "default_role" in await start_fails(env, config)


async def test_database_env_and_relative_paths(env: dict[str, str], app_url: str, tmp_path: Path) -> None:
    config = make_config(tmp_path / "config", app_url, entities=MINIMAL.replace(
        'database = "app.db"', 'database_env = "SHOP_DB"'), extra="")
    async with entity_app({**entity_env(env, config), "SHOP_DB": app_url}) as app, \
            client_for(app, actor("clerk")) as client:
        assert (await call(client, "query_orders", {"limit": 1}))[0] is False
    relative = make_config(tmp_path / "relative", "../app.db", entities=MINIMAL, extra="")
    async with entity_app(entity_env(env, relative)) as app:
        assert "update_orders" in app.registry and "delete_orders" not in app.registry


async def test_the_shipped_example_config_starts(env: dict[str, str], tmp_path: Path) -> None:
    example = tmp_path / "example"
    import shutil

    shutil.copytree(EXAMPLE, example)
    subprocess.run([sys.executable, str(example / "make_app_db.py")], check=True, capture_output=True)
    async with entity_app(entity_env(env, example)) as app:
        names = {tool.name for tool in app.registry}
        assert {"query_users", "update_users", "query_orders", "delete_orders"} <= names
        # Made from the configuration, every entity model is built with the start (a mistake fails it).
        made = [t.input_model for t in app.registry if t.input_model.__module__ == "mcp_knecht.entities.models"]
        assert len(made) >= 4 and all(model.__pydantic_complete__ for model in made)
        async with client_for(app, actor("support")) as client:
            assert [r["username"] for r in await rows(client, "query_users", {})] == ["ada", "linus", "grace"]


async def test_the_fingerprint_key_is_made_once_and_kept_private(env: dict[str, str], app_url: str,
                                                                tmp_path: Path) -> None:
    config = make_config(tmp_path / "config", app_url, entities=MINIMAL, extra="")
    async with entity_app(entity_env(env, config)):
        pass
    key = Path(env["KNECHT_DATA_DIR"]) / "entities-key"
    first = key.read_text()
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    async with entity_app(entity_env(env, config)):
        pass
    assert key.read_text() == first
    if os.name == "posix":
        key.chmod(0o644)
        assert "readable by others" in await start_fails(env, config)
    short = {**env, "KNECHT_ENTITIES_KEY": "short"}
    with pytest.raises(ConfigError, match="KNECHT_ENTITIES_KEY"):
        async with entity_app(entity_env(short, config)):
            pass


async def test_the_servers_own_store_can_hold_the_application_tables(
        env: dict[str, str], database_url: str, tmp_path: Path) -> None:
    """Same URL: the store's connection is reused (and closed once, by the server)."""
    await make_app_database(database_url)
    config = make_config(tmp_path / "config", database_url, entities=MINIMAL, extra="")
    same = {**entity_env(env, config), "KNECHT_DATABASE_URL": database_url}
    async with entity_app(same) as app, client_for(app, actor("clerk")) as client:
        _, staged, _ = await call(client, "update_orders", {"id": 1, "fields": {"note": "same store"}})
        assert (await approve(app, staged["id"])).status == "succeeded"
        assert (await rows(client, "query_orders", {"filters": {"note": "same store"}}))[0]["id"] == 1


async def test_a_declared_postgresql_schema_is_used(env: dict[str, str], pg_url: str, tmp_path: Path) -> None:
    await make_app_database(pg_url)
    schema = pg_url.rsplit("search_path=", 1)[1]
    bare = pg_url.split("?", 1)[0]  # no search_path: only the declared schema finds the table
    text = MINIMAL.replace('list     =', f'schema = "{schema}"\nlist     =')
    config = make_config(tmp_path / "config", bare, entities=text, extra="")
    async with entity_app(entity_env(env, config)) as app, client_for(app, actor("clerk")) as client:
        assert len(await rows(client, "query_orders", {"limit": 3})) == 3
    config = make_config(tmp_path / "config", bare, entities=text.replace(f'"{schema}"', '"nowhere"'), extra="")
    message = await start_fails(env, config)
    assert "entities.orders.table" in message and "'nowhere'" in message

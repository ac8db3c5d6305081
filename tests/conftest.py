"""Fixtures: a real SQLite file with demo data, real tokens, the SDK's own client."""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from mcp_knecht import testing
from mcp_knecht.app import App, open_app
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.auth import TokenSettings, TokenVerifier, mint_token
from mcp_knecht.core.settings import Settings, load_settings

pytest_plugins = ["tests.pg"]  # `database_url`: each test that takes it runs on SQLite and PostgreSQL

REPO = Path(__file__).resolve().parent.parent
READONLY = ("projects:read", "workflows:read", "runs:read", "logs:read")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def secret() -> str:
    return secrets.token_urlsafe(48)


@pytest.fixture
def env(tmp_path: Path, secret: str) -> dict[str, str]:
    """A process environment for a server with its own data dir, database and secret, and a config
    dir of its own: the shipped scopes, and an empty policies.toml (the built-in defaults: reads
    auto, writes approve). Tests of the shipped policies.toml say so (tests/test_shipped_policy.py)."""
    from tests.staging import make_config

    values = {
        "KNECHT_DATA_DIR": str(tmp_path / "data"),
        "KNECHT_DATABASE_URL": f"sqlite:///{tmp_path / 'knecht.db'}",
        "KNECHT_CONFIG_DIR": str(make_config(tmp_path / "config")),
        "KNECHT_JWT_SECRET": secret,
    }
    return values


@pytest.fixture
def settings(env: dict[str, str]) -> Settings:
    return load_settings(env=env)


@pytest.fixture
def token_settings(secret: str) -> TokenSettings:
    return TokenSettings(secret=secret)


@pytest.fixture
def mint(token_settings: TokenSettings) -> Callable[..., str]:
    def _mint(subject: str = "alice", scopes: Iterable[str] = READONLY, **kwargs: Any) -> str:
        return mint_token(token_settings, subject=subject, scopes=scopes, client="pytest", **kwargs)

    return _mint


@pytest.fixture
def actor_for(token_settings: TokenSettings, mint: Callable[..., str]) -> Callable[..., Actor]:
    """An actor as the server would build it: from a minted, verified token."""
    verifier = TokenVerifier(token_settings)

    def _actor(subject: str = "alice", scopes: Iterable[str] = READONLY) -> Actor:
        return verifier.verify(mint(subject, scopes))

    return _actor


@pytest.fixture(scope="session")
def demo_db_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Demo data is deterministic: build it once, copy it per test."""
    import anyio

    from mcp_knecht.knecht import open_store
    from mcp_knecht.knecht.demo import fill_demo_data

    path = tmp_path_factory.mktemp("template") / "demo.db"

    async def build() -> None:
        db = await open_store(f"sqlite:///{path}")
        try:
            await fill_demo_data(db)
        finally:
            await db.close()

    anyio.run(build)
    return path


@pytest.fixture
def demo_env(env: dict[str, str], demo_db_template: Path, tmp_path: Path) -> dict[str, str]:
    target = tmp_path / "knecht.db"
    target.write_bytes(demo_db_template.read_bytes())
    return env


@pytest.fixture
async def app(demo_env: dict[str, str]) -> AsyncIterator[App]:
    async with open_app(load_settings(env=demo_env)) as running:
        yield running


@pytest.fixture(params=["auto", "legacy"], ids=["2026-07-28", "2025-11-25"])
def protocol_mode(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def connect(app: App, actor_for: Callable[..., Actor], protocol_mode: str):  # type: ignore[no-untyped-def]
    """`async with connect(scopes=…) as client`: the SDK client, in memory, as a token's actor."""

    @asynccontextmanager
    async def _connect(subject: str = "alice", scopes: Iterable[str] = READONLY) -> AsyncIterator[Client]:
        async with testing.connect(app, actor_for(subject, scopes), mode=protocol_mode) as client:
            yield client

    return _connect


def server_env(env: dict[str, str], **extra: str) -> dict[str, str]:
    """The environment for a server subprocess: ours on top of PATH and friends."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "PYTHONPATH", "VIRTUAL_ENV")}
    return {**keep, **env, **extra}


@pytest.fixture
def staged_env(env: dict[str, str], database_url: str, tmp_path: Path) -> dict[str, str]:
    """A server environment on each store (SQLite, PostgreSQL) with the test toolset (countable
    write effects) and a config dir of the test's own, whose policies.toml a test may rewrite."""
    from tests.staging import TEST_TOOLSETS, make_config

    config = make_config(tmp_path / "config")
    return {**env, "KNECHT_DATABASE_URL": database_url, "KNECHT_CONFIG_DIR": str(config),
            "KNECHT_TOOLSETS": TEST_TOOLSETS, "PYTHONPATH": str(REPO)}


@pytest.fixture
async def staged_app(staged_env: dict[str, str]) -> AsyncIterator[App]:
    from tests.toolsets import EFFECTS_TABLE

    async with open_app(load_settings(env=staged_env)) as running:
        async with running.db.transaction() as tx:
            await tx.execute(EFFECTS_TABLE)
        yield running

"""PostgreSQL for tests: a throw-away database per test session, a fresh schema per test.

    pytest_plugins = ["tests.pg"]  (in tests/conftest.py)

`database_url` is parametrized over both stores (`sqlite`, `postgresql`), so a test that takes it
runs against each. The server comes from `KNECHT_TEST_POSTGRES_URL` (default: the local trust-auth
server, database `test`, used only to CREATE and DROP `knecht_test_<random>`). Per test, a schema
`t_<random>` is made and put on the URL as `?search_path=…`, so subprocesses given that URL
(servers, CLIs, workers) see exactly the test's tables.

When PostgreSQL is unreachable the PostgreSQL variants are skipped with the reason; with
`CI=true` that is a failure instead: CI must run the PostgreSQL tests.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import anyio
import pytest

ADMIN_URL_ENV = "KNECHT_TEST_POSTGRES_URL"
DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
BACKENDS = ("sqlite", "postgresql")


def admin_url() -> str:
    return os.environ.get(ADMIN_URL_ENV) or DEFAULT_ADMIN_URL


def _with_database(url: str, database: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{database}"))


def _unavailable(reason: str) -> None:
    message = f"PostgreSQL tests need a server at {admin_url()} (set {ADMIN_URL_ENV}): {reason}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} — in CI a skipped PostgreSQL test is a failure", pytrace=False)
    pytest.skip(message)


async def _admin(sql: str, url: str | None = None) -> None:
    import asyncpg

    conn = await asyncpg.connect(url or admin_url(), timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


_session_failure: list[str] = []


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """The URL of a database made for this test session (dropped at its end)."""
    if _session_failure:
        _unavailable(_session_failure[0])
    name = f"knecht_test_{secrets.token_hex(6)}"
    try:
        import asyncpg  # noqa: F401
    except ImportError as exc:  # pragma: no cover - asyncpg is a dependency
        _session_failure.append(f"asyncpg is not installed ({exc})")
        _unavailable(_session_failure[0])
    try:
        anyio.run(_admin, f'CREATE DATABASE "{name}"')
    except Exception as exc:
        _session_failure.append(f"{type(exc).__name__}: {exc}")
        _unavailable(_session_failure[0])
    try:
        yield _with_database(admin_url(), name)
    finally:
        anyio.run(_admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_url(pg_database: str) -> Iterator[str]:
    """A fresh, empty schema of the session database, as a URL with its search_path."""
    schema = f"t_{secrets.token_hex(6)}"
    anyio.run(_admin, f'CREATE SCHEMA "{schema}"', pg_database)
    try:
        yield f"{pg_database}?search_path={schema}"
    finally:
        anyio.run(_admin, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE', pg_database)


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty store of each kind: `sqlite:///…` in tmp_path, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return str(request.getfixturevalue("pg_url"))

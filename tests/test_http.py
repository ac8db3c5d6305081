"""A real HTTP server subprocess on 127.0.0.1: bearer tokens per request, 401s, metadata."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import httpx2
import jwt
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.servers import http_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def module_env(tmp_path_factory: pytest.TempPathFactory, demo_db_template, secret_for_module: str):  # type: ignore[no-untyped-def]
    from tests.staging import make_config

    folder = tmp_path_factory.mktemp("http")
    (folder / "knecht.db").write_bytes(demo_db_template.read_bytes())
    return {
        "KNECHT_DATA_DIR": str(folder / "data"),
        "KNECHT_DATABASE_URL": f"sqlite:///{folder / 'knecht.db'}",
        "KNECHT_CONFIG_DIR": str(make_config(folder / "config")),
        "KNECHT_JWT_SECRET": secret_for_module,
    }


@pytest.fixture(scope="module")
def secret_for_module() -> str:
    import secrets

    return secrets.token_urlsafe(48)


@pytest.fixture(scope="module", params=[False, True], ids=["sessions", "stateless"])
def base_url(request: pytest.FixtureRequest, module_env: dict[str, str]) -> Iterator[str]:
    with http_server(module_env, *(["--stateless"] if request.param else [])) as url:
        yield url


@pytest.fixture
def token(secret_for_module: str) -> Callable[..., str]:
    from mcp_knecht.core.auth import TokenSettings, mint_token

    def _token(subject: str = "erin", scopes: tuple[str, ...] = ("projects:read",), **kw) -> str:  # type: ignore[no-untyped-def]
        return mint_token(TokenSettings(secret=secret_for_module), subject=subject, scopes=scopes, **kw)

    return _token


async def _names_and_call(base_url: str, bearer: str, mode: str) -> tuple[set[str], bool]:
    headers = {"Authorization": f"Bearer {bearer}"}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http, Client(
        streamable_http_client(f"{base_url}/mcp", http_client=http), mode=mode
    ) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        result = await client.call_tool("list_projects", {})
        return names, result.is_error


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"], ids=["2026-07-28", "2025-11-25"])
async def test_two_tokens_on_one_server_see_different_tools(base_url: str, token, mode: str) -> None:  # type: ignore[no-untyped-def]
    narrow, ok = await _names_and_call(base_url, token("erin", ("projects:read",)), mode)
    wide, _ = await _names_and_call(base_url, token("frank", ("projects:read", "runs:read")), mode)
    assert narrow == {"list_projects", "get_project"}
    assert {"list_runs", "get_run"} <= wide and narrow < wide
    assert ok is False


def _post_mcp(base_url: str, bearer: str | None) -> tuple[int, dict[str, str], bytes]:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}).encode()
    request = urllib.request.Request(f"{base_url}/mcp", data=body, method="POST", headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
        **({"Authorization": f"Bearer {bearer}"} if bearer is not None else {}),
    })
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def _forged_tokens(token, secret: str) -> dict[str, str | None]:  # type: ignore[no-untyped-def]
    good = token()
    claims = jwt.decode(good, options={"verify_signature": False})
    long_ago = datetime(2020, 1, 1, tzinfo=UTC)
    later = datetime.now(UTC) + timedelta(hours=2)
    header, payload, _ = good.split(".")
    return {
        "missing": None,
        "garbage": "abc.def.ghi",
        "forged signature": f"{header}.{payload}.{'A' * 43}",
        "other secret": jwt.encode(claims, "x" * 48, algorithm="HS256"),
        "expired": token(now=long_ago, ttl=timedelta(minutes=5)),
        "not yet valid": token(now=later),
        "wrong audience": jwt.encode({**claims, "aud": "someone-else"}, secret, algorithm="HS256"),
        "wrong issuer": jwt.encode({**claims, "iss": "https://evil.example"}, secret, algorithm="HS256"),
        "alg none": jwt.encode(claims, None, algorithm="none"),
    }


def test_refused_tokens_get_401_with_resource_metadata(base_url: str, token, secret_for_module: str) -> None:  # type: ignore[no-untyped-def]
    for kind, bearer in _forged_tokens(token, secret_for_module).items():
        status, headers, _ = _post_mcp(base_url, bearer)
        assert status == 401, kind
        challenge = headers.get("www-authenticate") or headers.get("WWW-Authenticate") or ""
        assert challenge.startswith("Bearer"), kind
        assert "resource_metadata=" in challenge, kind
    status, _, _ = _post_mcp(base_url, token())
    assert status != 401  # past authentication (a bare request may still lack a session)


def test_protected_resource_metadata_is_served_at_the_well_known_path(base_url: str) -> None:
    for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"):
        with urllib.request.urlopen(base_url + path, timeout=10) as response:
            metadata = json.loads(response.read())
        assert metadata["resource"] == f"{base_url}/mcp"
        assert "projects:read" in metadata["scopes_supported"]

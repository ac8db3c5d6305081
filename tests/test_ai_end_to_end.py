"""End to end, in real processes: demo data → a run fails → the server's background worker
diagnoses it through a provider's SDK (a fake Anthropic on 127.0.0.1) → the diagnosis is stored →
`GET /api/runs/{id}/diagnosis` and `get_run` over MCP show it → `mcp-knecht diagnose` prints it."""

from __future__ import annotations

import json
import sqlite3
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from mcp_knecht.core.auth import TokenSettings, mint_token
from tests.ai_fakes import FakeProvider, Turn, diagnoser
from tests.servers import http_server
from tests.staging import cli

pytestmark = pytest.mark.slow

READ = ("projects:read", "workflows:read", "runs:read", "logs:read")


def _get(url: str, token: str | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture
def fresh_failure(demo_env: dict[str, str]) -> int:
    """One run that failed just now; every other failure is months old (outside the worker's week)."""
    path = Path(demo_env["KNECHT_DATABASE_URL"].removeprefix("sqlite:///"))
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE runs SET finished_at = '2025-01-01T00:00:00Z' WHERE status = 'failed'")
        run_id = conn.execute("SELECT id FROM runs WHERE status = 'failed' ORDER BY id DESC LIMIT 1").fetchone()[0]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        conn.execute("UPDATE runs SET finished_at = ? WHERE id = ?", (now, run_id))
    return int(run_id)


@pytest.fixture
def token(secret: str) -> Callable[..., str]:
    def _token(scopes: tuple[str, ...] = READ, subject: str = "erin") -> str:
        return mint_token(TokenSettings(secret=secret), subject=subject, scopes=scopes)

    return _token


def test_a_failed_run_is_diagnosed_in_the_background_and_shown_everywhere(
    demo_env: dict[str, str], fresh_failure: int, token: Callable[..., str]
) -> None:
    run_id = fresh_failure
    with FakeProvider(diagnoser) as fake:
        env = {**demo_env, "KNECHT_MODEL_DEFAULT": "anthropic:claude-haiku-4-5", "ANTHROPIC_API_KEY": "sk-e2e-test",
               "ANTHROPIC_BASE_URL": fake.url}
        with http_server(env) as base:
            deadline = time.monotonic() + 30
            while True:
                status, shown = _get(f"{base}/api/runs/{run_id}/diagnosis", token())
                if shown.get("status") == "done" or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert status == 200 and shown["status"] == "done", shown
            assert shown["model"] == "anthropic:claude-haiku-4-5"
            assert shown["summary"] and shown["actionIds"]
            assert len(fake.requests) == 3, "one diagnosis: get_run, the failed log, the answer"
            assert {r.path for r in fake.requests} == {"/v1/messages"}

            import anyio

            async def get_run() -> dict:
                headers = {"Authorization": f"Bearer {token()}"}
                async with httpx2.AsyncClient(headers=headers) as http, \
                        Client(streamable_http_client(f"{base}/mcp", http_client=http)) as client:
                    result = await client.call_tool("get_run", {"run_id": run_id})
                    return result.structured_content

            run = anyio.run(get_run)
            assert run["diagnosis"]["summary"] == shown["summary"]
            assert run["diagnosis"]["actionIds"] == shown["actionIds"] == [run["failed_action"]["id"]]

        printed = cli("mcp-knecht", env, "diagnose", str(run_id), "--json")
        assert printed.returncode == 0, printed.stderr
        assert json.loads(printed.stdout) == {"run_id": run_id, "status": "done", "summary": shown["summary"],
                                              "actionIds": shown["actionIds"], "model": shown["model"]}
        assert len(fake.requests) == 3, "the stored diagnosis is printed, not made again"
        human = cli("mcp-knecht", env, "diagnose", str(run_id))
        assert human.returncode == 0 and shown["summary"] in human.stdout


def test_the_diagnosis_route_answers_like_the_other_routes(demo_env: dict[str, str], token: Callable[..., str]) -> None:
    with http_server(demo_env) as base:
        failed = f"{base}/api/runs/66/diagnosis"
        assert _get(failed)[0] == 401
        assert _get(failed, "not-a-token")[0] == 401
        status, body = _get(failed, token(("runs:read",)))
        assert status == 403 and body["error"]["code"] == "insufficient_scope"
        assert "logs:read" in body["error"]["message"]
        assert _get(f"{base}/api/runs/999999/diagnosis", token())[0] == 404
        assert _get(f"{base}/api/runs/abc/diagnosis", token())[0] == 400
        assert _get(f"{base}/api/runs/1/diagnosis", token())[0] == 409  # run 1 succeeded
        status, body = _get(failed, token())
        assert status == 200 and body["status"] == "unavailable" and "KNECHT_MODEL_DEFAULT" in body["error"]


def test_diagnose_without_a_model_exits_1_and_says_what_to_set(demo_env: dict[str, str]) -> None:
    done = cli("mcp-knecht", demo_env, "diagnose", "66", "--json")
    assert done.returncode == 1
    out = json.loads(done.stdout)
    assert out["status"] == "unavailable" and "KNECHT_MODEL_DEFAULT" in out["error"]
    assert cli("mcp-knecht", demo_env, "diagnose", "1").returncode == 1  # succeeded: nothing to diagnose
    assert cli("mcp-knecht", demo_env, "diagnose", "not-a-number").returncode == 2


def test_diagnose_on_demand_calls_the_model_once(demo_env: dict[str, str]) -> None:
    turns = [Turn.call("get_run", run_id=66), Turn.answer(summary="Invalid YAML in the workflow.", actionIds=[396])]
    with FakeProvider(turns) as fake:
        env = {**demo_env, "KNECHT_MODEL_FAST": "openai-compatible:llama3", "KNECHT_OPENAI_COMPATIBLE_BASE_URL":
               fake.url + "/v1"}
        done = cli("mcp-knecht", env, "diagnose", "66", "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["summary"] == "Invalid YAML in the workflow."
        assert json.loads(done.stdout)["actionIds"] == [396]
        assert len(fake.requests) == 2 and "authorization" in fake.requests[0].headers

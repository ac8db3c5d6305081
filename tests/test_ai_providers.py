"""Each provider through its real SDK and the real HTTP stack, against a fake provider on 127.0.0.1
that speaks the provider's wire format: what the model was asked, offered and sent back."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from mcp_knecht.ai.diagnosis import WORKER_ACTOR
from mcp_knecht.ai.errors import FeatureUnavailable, ModelCallError
from mcp_knecht.ai.records import feature_runs
from mcp_knecht.app import App, open_app
from mcp_knecht.core.settings import load_settings
from mcp_knecht.errors import ConfigError
from mcp_knecht.knecht import secret_values
from tests.ai_fakes import FakeProvider, Turn

pytestmark = pytest.mark.anyio

SECRET_RUN = 593  # demo data: a failed run whose failed action's log prints a secret variable's value
TOOLS = ["get_run", "get_action_log", "get_run_log", "get_workflow"]


@dataclass(frozen=True)
class Case:
    provider: str
    model: str
    path: str
    """The path the SDK must post to."""
    auth: tuple[str, str]
    """The header that must carry the key, and how its value starts."""

    def env(self, url: str, key: str) -> dict[str, str]:
        env = {"KNECHT_MODEL_FAST": f"{self.provider}:{self.model}"}
        if self.provider == "anthropic":
            return env | {"ANTHROPIC_API_KEY": key, "ANTHROPIC_BASE_URL": url}
        if self.provider == "openai":
            return env | {"OPENAI_API_KEY": key, "OPENAI_BASE_URL": url + "/v1"}
        if self.provider == "google":
            return env | {"GOOGLE_API_KEY": key, "GOOGLE_GEMINI_BASE_URL": url}
        if self.provider == "langdock":
            return env | {"LANGDOCK_API_KEY": key, "KNECHT_LANGDOCK_BASE_URL": url}
        return env | {"KNECHT_OPENAI_COMPATIBLE_BASE_URL": url + "/v1", "KNECHT_OPENAI_COMPATIBLE_API_KEY": key}


CASES = [
    Case("anthropic", "claude-haiku-4-5", "/v1/messages", ("authorization", "Bearer sk-test")),
    Case("openai", "gpt-5-mini", "/v1/chat/completions", ("authorization", "Bearer sk-test")),
    Case("google", "gemini-2.5-flash", "/v1beta/models/gemini-2.5-flash:generateContent",
         ("x-goog-api-key", "sk-test")),
    Case("langdock", "claude-opus-4-7", "/anthropic/eu/v1/messages", ("authorization", "Bearer sk-test")),
    Case("langdock", "gpt-5", "/openai/eu/v1/chat/completions", ("authorization", "Bearer sk-test")),
    Case("openai-compatible", "qwen3:8b", "/v1/chat/completions", ("authorization", "Bearer sk-test")),
]

KEY = "sk-test-0123456789abcdef"


@asynccontextmanager
async def server(demo_env: dict[str, str], **extra: str) -> AsyncIterator[App]:
    async with open_app(load_settings(env={**demo_env, **extra}), watch_policy=False) as app:
        yield app


def _script(run: dict, action: dict) -> list[Turn]:
    return [
        Turn.call("get_run", run_id=SECRET_RUN),
        Turn.call("get_action_log", run_id=SECRET_RUN, action=action["id"], limit=50),
        Turn(calls=(("get_run_log", {"run_id": SECRET_RUN, "tail": 20}),), text="Looking at the run log too."),
        Turn.answer(summary=f"The {action['name']} action failed.", actionIds=[action["id"], 999_999]),
    ]


@pytest.mark.parametrize("case", CASES, ids=[f"{c.provider}-{c.model}" for c in CASES])
async def test_the_diagnosis_through_each_provider(case: Case, demo_env: dict[str, str]) -> None:
    async with server(demo_env) as plain:
        run = await plain.db.fetch_one("SELECT * FROM runs WHERE id = ?", (SECRET_RUN,))
        action = await plain.db.fetch_one("SELECT id, name FROM actions WHERE run_id = ? AND status = 'failed'",
                                          (SECRET_RUN,))
        known = await secret_values(plain.db)
    with FakeProvider(_script(run, action)) as fake:
        async with server(demo_env, **case.env(fake.url, KEY)) as app:
            shown = await app.ai.diagnoses.request(SECRET_RUN, WORKER_ACTOR)
            [record] = await feature_runs(app.db, feature="failure-diagnosis")
    assert shown == {"status": "done", "summary": f"The {action['name']} action failed.",
                     "actionIds": [action["id"]], "model": f"{case.provider}:{case.model}"}, "unknown ids dropped"
    assert [r.path.split("?")[0] for r in fake.requests] == [case.path] * 4
    assert all(r.model == case.model for r in fake.requests)
    header, value = case.auth
    assert all(r.headers[header].startswith(value) for r in fake.requests)
    # Tools per step: the feature's four and the answer; in the last step (max_steps 4) only the answer.
    assert [r.tools for r in fake.requests] == [[*TOOLS, "final_result"]] * 3 + [["final_result"]]
    # The scrubbed tool results, as the provider received them.
    results = fake.requests[-1].tool_results
    assert len(results) == 3
    assert json.loads(results[0])["id"] == SECRET_RUN
    assert "***" in results[1]
    assert not any(secret in request.text for request in fake.requests for secret in known)
    assert KEY not in "".join(request.text for request in fake.requests)
    # The prompt and instructions reached the model.
    assert f"Run {SECRET_RUN} failed" in fake.requests[0].text
    assert "You explain why a run of Knecht CI failed" in fake.requests[0].text
    # Usage, as the fake reported it (100 + n input, 10 + n output tokens per request n).
    assert (record["status"], record["requests"], record["steps"]) == ("done", 4, 4)
    assert (record["input_tokens"], record["output_tokens"]) == (410, 50)
    assert [call["tool"] for call in record["tool_calls"]] == ["get_run", "get_action_log", "get_run_log"]
    assert record["model"] == f"{case.provider}:{case.model}"


async def test_a_model_its_provider_deprecated_still_answers_and_the_log_says_once_what_to_change(
    demo_env: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    deprecated = Case("openai", "gpt-5-mini", "/v1/chat/completions", ("authorization", "Bearer sk-test"))
    answers = [Turn.answer(summary="Out of memory.", actionIds=[])] * 2
    with FakeProvider(answers) as fake, caplog.at_level("WARNING", logger="mcp_knecht.ai.models"):
        async with server(demo_env, **deprecated.env(fake.url, KEY)) as app:
            first = await app.ai.diagnoses.request(SECRET_RUN, WORKER_ACTOR, again=True)
            second = await app.ai.diagnoses.request(SECRET_RUN, WORKER_ACTOR, again=True)
    assert first["status"] == second["status"] == "done"
    notices = [r.getMessage() for r in caplog.records if r.name == "mcp_knecht.ai.models"]
    assert len(notices) == 1, f"one notice, not {notices} (do pydantic-ai's profiles still deprecate gpt-5-mini?)"
    [notice] = notices
    assert notice.startswith("KNECHT_MODEL_FAST names openai:gpt-5-mini, which its provider has deprecated")
    assert "change KNECHT_MODEL_FAST to another model" in notice and "https://" in notice


async def test_cost_is_recorded_where_prices_are_known(demo_env: dict[str, str]) -> None:
    with FakeProvider([Turn.answer(summary="Out of memory.", actionIds=[])]) as fake:
        async with server(demo_env, **CASES[0].env(fake.url, KEY)) as app:
            await app.ai.diagnoses.request(SECRET_RUN, WORKER_ACTOR)
            [record] = await feature_runs(app.db)
    assert record["cost_usd"] is not None and 0 < record["cost_usd"] < 0.01


async def test_without_a_model_features_are_unavailable_and_say_what_to_set(demo_env: dict[str, str]) -> None:
    async with server(demo_env) as app:
        shown = await app.ai.diagnoses.request(SECRET_RUN, WORKER_ACTOR)
        assert shown["status"] == "unavailable" and "KNECHT_MODEL_DEFAULT" in shown["error"]
        assert (await app.ai.diagnoses.stored(SECRET_RUN))["status"] == "unavailable"
        from mcp_knecht.ai.diagnosis import FAILURE_DIAGNOSIS

        with pytest.raises(FeatureUnavailable, match="KNECHT_MODEL_DEFAULT"):
            await app.ai.run_feature(FAILURE_DIAGNOSIS, "Run 1 failed.", WORKER_ACTOR)
        [record] = await feature_runs(app.db)
        assert record["status"] == "unavailable"


async def test_a_provider_without_its_key_is_unavailable_naming_the_variable(demo_env: dict[str, str]) -> None:
    async with server(demo_env, KNECHT_MODEL_DEFAULT="google:gemini-2.5-flash") as app:
        shown = await app.ai.diagnoses.request(SECRET_RUN, WORKER_ACTOR)
    assert shown["status"] == "unavailable" and "GOOGLE_API_KEY is not set" in shown["error"]


async def test_a_provider_error_fails_the_diagnosis_with_a_clear_message(demo_env: dict[str, str]) -> None:
    with FakeProvider([Turn(status=400)] * 3) as fake:
        async with server(demo_env, **CASES[1].env(fake.url, KEY)) as app:
            shown = await app.ai.diagnoses.request(SECRET_RUN, WORKER_ACTOR)
    assert shown["status"] == "failed"
    assert shown["error"].startswith("The model openai:gpt-5-mini failed") and KEY not in shown["error"]


async def test_every_model_call_has_a_timeout(demo_env: dict[str, str]) -> None:
    with FakeProvider([Turn(delay=5.0, calls=(("get_run", {"run_id": 1}),))] * 3) as fake:
        async with server(demo_env, KNECHT_MODEL_TIMEOUT="0.5", **CASES[0].env(fake.url, KEY)) as app:
            from mcp_knecht.ai.diagnosis import FAILURE_DIAGNOSIS

            with pytest.raises(ModelCallError, match=r"did not answer within 0\.5 s|timed out"):
                await app.ai.run_feature(FAILURE_DIAGNOSIS, "Run 1 failed.", WORKER_ACTOR)


async def test_api_keys_join_the_output_scrubber(demo_env: dict[str, str]) -> None:
    async with server(demo_env, **CASES[0].env("http://127.0.0.1:9", KEY)) as app:
        assert app.secrets(f"key={KEY} and {KEY}") == "key=*** and ***"


async def test_roles_fall_back_and_the_file_is_read_but_the_environment_wins(tmp_path: Path) -> None:
    from mcp_knecht.ai.settings import load_ai_settings
    from mcp_knecht.core.settings import Settings

    def ai(**fields: object):  # type: ignore[no-untyped-def]
        return load_ai_settings(Settings(data_dir=tmp_path, config_dir=tmp_path, database_url="sqlite:///x",
                                         **fields))  # type: ignore[arg-type]

    assert not ai().auto_diagnose_on, "no model: no automatic diagnosis"
    only_default = ai(model_default="langdock:claude-opus-4-7")
    assert str(only_default.spec("fast")) == "langdock:claude-opus-4-7" and only_default.auto_diagnose_on
    assert not ai(model_default="openai:gpt-5", auto_diagnose=False).auto_diagnose_on
    (tmp_path / "knecht.toml").write_text('[models]\ndefault = "openai:gpt-5"\nfast = "google:gemini-2.5-flash"\n')
    from_file = ai()
    assert (str(from_file.spec("default")), str(from_file.spec("fast"))) == ("openai:gpt-5", "google:gemini-2.5-flash")
    assert str(ai(model_fast="anthropic:claude-haiku-4-5").spec("fast")) == "anthropic:claude-haiku-4-5"
    keys = ai(env={"ANTHROPIC_API_KEY": "sk-a"}, openai_compatible_api_key="sk-b")
    assert sorted(keys.secret_values()) == ["sk-a", "sk-b"]


@pytest.mark.parametrize("value, problem", [
    ("gpt-5", "expected provider:model"),
    ("azure:gpt-5", "unknown provider 'azure'"),
])
async def test_a_bad_model_setting_stops_the_server_naming_the_variable(
    demo_env: dict[str, str], value: str, problem: str
) -> None:
    with pytest.raises(ConfigError, match=f"KNECHT_MODEL_DEFAULT: {problem}"):
        async with server(demo_env, KNECHT_MODEL_DEFAULT=value):
            pass

"""The loop's rules, with a scripted model (pydantic-ai's FunctionModel) over the real gate, store,
policy and audit log of a demo server: what a feature's model may reach, and what it must answer."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mcp_knecht.ai.diagnosis import DIAGNOSIS_SCOPES, FAILURE_DIAGNOSIS, DiagnosisOutput
from mcp_knecht.ai.errors import FeatureOutputError
from mcp_knecht.ai.feature import Feature
from mcp_knecht.ai.loop import run_feature
from mcp_knecht.ai.workflow_fix import WORKFLOW_FIX, workflow_fix_prompt
from mcp_knecht.app import App, open_app
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.settings import load_settings
from mcp_knecht.knecht import secret_values
from mcp_knecht.store.audit_log import recent_entries
from tests.ai_scripted import Scripted, answer, call, text
from tests.staging import make_config

pytestmark = pytest.mark.anyio

FAILED_RUN = 66  # demo data: bad workflow syntax, found by its `parse-workflow` action
SECRET_RUN, SECRET_ACTION = 146, 885  # demo data: an action log that prints a secret variable's value
READONLY = Actor("rita", "pytest", frozenset({"projects:read", "workflows:read", "runs:read", "logs:read"}))
AGENT = Actor("alice", "pytest", READONLY.scopes | {"workflows:write", "runs:write", "proposals:read"})


async def _run(app: App, model: Scripted, feature: Feature = FAILURE_DIAGNOSIS, actor: Actor = READONLY,
               prompt: str = f"Run {FAILED_RUN} failed. Why?"):  # type: ignore[no-untyped-def]
    return await run_feature(feature, prompt, actor, gate=app.gate, model=model.model, scrub=app.secrets)


async def _audit(app: App, source: str) -> list[dict]:
    await app.audit.flush()
    return list(reversed(await recent_entries(app.db, source=source, limit=100)))


async def test_tool_calls_run_through_the_gate_as_the_actor_with_the_feature_as_source(app: App) -> None:
    model = Scripted(call("get_run", run_id=FAILED_RUN),
                     call("get_action_log", run_id=FAILED_RUN, action="parse-workflow", tail=5),
                     answer(summary="Bad YAML.", actionIds=[1]))
    result = await _run(app, model)
    assert result.output == DiagnosisOutput(summary="Bad YAML.", actionIds=[1])
    assert (result.steps, result.usage.requests) == (3, 3)
    assert [(c.tool, c.outcome) for c in result.calls] == [("get_run", "ran"), ("get_action_log", "ran")]
    entries = await _audit(app, "feature:failure-diagnosis")
    assert [(e["tool"], e["outcome"], e["subject"], e["client"]) for e in entries] == [
        ("get_run", "ran", "rita", "pytest"), ("get_action_log", "ran", "rita", "pytest")]
    assert json.loads(model.results[0])["id"] == FAILED_RUN


async def test_only_allowlisted_tools_are_offered_and_another_is_refused_and_audited(app: App) -> None:
    model = Scripted(call("list_projects"), answer(summary="x", actionIds=[]))
    result = await _run(app, model, actor=AGENT)
    assert model.offered[0] == ["get_run", "get_action_log", "get_run_log", "get_workflow"]
    assert [(c.tool, c.outcome) for c in result.calls] == [("list_projects", "forbidden")]
    assert "Unknown tool: 'list_projects'" in model.results[0]
    [entry] = await _audit(app, "feature:failure-diagnosis")
    assert (entry["tool"], entry["outcome"], entry["subject"]) == ("list_projects", "forbidden", "alice")


async def test_a_tool_the_actor_may_not_see_is_not_offered(app: App) -> None:
    no_logs = Actor("ian", "pytest", frozenset({"runs:read", "workflows:read"}))
    model = Scripted(call("get_action_log", run_id=FAILED_RUN, action="lint"), answer(summary="x", actionIds=[]))
    result = await _run(app, model, actor=no_logs)
    assert model.offered[0] == ["get_run", "get_workflow"]
    assert [(c.tool, c.outcome) for c in result.calls] == [("get_action_log", "forbidden")]


async def test_the_last_step_offers_no_tools_and_the_model_answers(app: App) -> None:
    model = Scripted(*[call("get_run", run_id=FAILED_RUN)] * 3, answer(summary="Found it.", actionIds=[]))
    result = await _run(app, model)
    assert model.offered == [list(FAILURE_DIAGNOSIS.tools)] * 3 + [[]]  # max_steps 4: the fourth has none
    assert model.answer_tools == [["final_result"]] * 4
    assert result.steps == 4 and result.output.summary == "Found it."


async def test_a_model_that_keeps_calling_tools_gets_one_repair_request_then_a_clear_error(app: App) -> None:
    model = Scripted(call("get_run", run_id=FAILED_RUN))
    with pytest.raises(FeatureOutputError, match="no valid answer after a repair attempt"):
        await _run(app, model)
    assert len(model.offered) == FAILURE_DIAGNOSIS.max_steps + 1
    assert model.offered[-2:] == [[], []]
    entries = await _audit(app, "feature:failure-diagnosis")
    assert len(entries) == FAILURE_DIAGNOSIS.max_steps - 1, "calls in the last step are not run"


async def test_an_invalid_answer_is_repaired_once(app: App) -> None:
    model = Scripted(answer(summary="", actionIds=["x"]), answer(summary="Fixed answer.", actionIds=[2]))
    result = await _run(app, model)
    assert result.output == DiagnosisOutput(summary="Fixed answer.", actionIds=[2])
    assert model.offered[1] == [], "the repair request offers only the answer"
    assert any("summary" in retry and "actionIds" in retry for retry in model.retries)


async def test_an_answer_that_stays_invalid_is_an_error(app: App) -> None:
    model = Scripted(answer(summary=""), text("I think it was the network."))
    with pytest.raises(FeatureOutputError, match=r"repair attempt \(Answer by calling final_result, not in text"):
        await _run(app, model)


async def test_a_json_answer_in_text_is_accepted(app: App) -> None:
    model = Scripted(text('```json\n{"summary": "Timeout in test.", "actionIds": [4]}\n```'))
    result = await _run(app, model)
    assert result.output.actionIds == [4]


async def test_secrets_are_masked_before_they_reach_the_model(app: App) -> None:
    known = await secret_values(app.db)
    raw = await app.db.fetch_all("SELECT text FROM log_lines WHERE run_id = ? AND action_id = ?",
                                 (SECRET_RUN, SECRET_ACTION))
    assert any(value in line["text"] for line in raw for value in known), "the demo log prints a secret"
    model = Scripted(call("get_action_log", run_id=SECRET_RUN, action=SECRET_ACTION, limit=50),
                     call("get_run_log", run_id=SECRET_RUN, limit=200), answer(summary="x", actionIds=[]))
    await _run(app, model, prompt=f"Run {SECRET_RUN} failed. Why?")
    sent = "\n".join(model.results)
    assert "***" in sent
    assert not any(value in sent for value in known)


async def test_a_readonly_actor_cannot_stage_anything(app: App) -> None:
    model = Scripted(call("update_workflow", workflow=1, definition="name: x\n"), answer(summary="no", proposalId=None))
    result = await _run(app, model, feature=WORKFLOW_FIX, prompt=workflow_fix_prompt(FAILED_RUN))
    assert "update_workflow" not in model.offered[0]
    assert [(c.tool, c.outcome) for c in result.calls] == [("update_workflow", "forbidden")]
    assert await app.proposals.list() == []


async def test_a_write_is_reachable_only_as_a_proposal_an_operator_approves(app: App) -> None:
    run = await app.db.fetch_one("SELECT workflow_id FROM runs WHERE id = ?", (FAILED_RUN,))
    before = await app.db.fetch_one("SELECT current_version FROM workflows WHERE id = ?", (run["workflow_id"],))
    fixed = ("name: nightly\nactions:\n  - name: checkout\n    run: git clone .\n"
             "  - name: test\n    run: go test ./...\n")
    model = Scripted(call("update_workflow", workflow=run["workflow_id"], definition=fixed, message="Fix YAML"),
                     answer(summary="Proposed a fix.", proposalId=1))
    result = await _run(app, model, feature=WORKFLOW_FIX, actor=AGENT, prompt=workflow_fix_prompt(FAILED_RUN))
    assert "update_workflow" in model.offered[0]
    assert [(c.tool, c.outcome) for c in result.calls] == [("update_workflow", "staged")]
    assert "Submitted for approval (#1)" in model.results[0]
    [proposal] = await app.proposals.list()
    assert (proposal.tool, proposal.status, proposal.proposer_subject) == ("update_workflow", "pending", "alice")
    [entry] = await _audit(app, "feature:workflow-fix")
    assert (entry["outcome"], entry["proposal_id"]) == ("staged", proposal.id)
    after = await app.db.fetch_one("SELECT current_version FROM workflows WHERE id = ?", (run["workflow_id"],))
    assert after == before, "nothing changes before an operator approves"


@pytest.fixture
async def denying_app(demo_env: dict[str, str], tmp_path: Path) -> AsyncIterator[App]:
    config = make_config(tmp_path / "config", '[tools]\n"update_workflow" = "deny"\n"get_run_log" = "deny"\n')
    async with open_app(load_settings(env={**demo_env, "KNECHT_CONFIG_DIR": str(config)})) as running:
        yield running


async def test_policy_deny_holds_for_features_as_for_mcp_clients(denying_app: App) -> None:
    model = Scripted(call("update_workflow", workflow=1, definition="name: x\n"),
                     call("get_run_log", run_id=FAILED_RUN), answer(summary="no", proposalId=None))
    result = await _run(denying_app, model, feature=WORKFLOW_FIX, actor=AGENT, prompt=workflow_fix_prompt(1))
    assert model.offered[0] == ["get_run", "get_action_log", "get_workflow"]
    assert [c.outcome for c in result.calls] == ["forbidden", "forbidden"]
    assert await denying_app.proposals.list() == []


async def test_the_diagnosis_actor_holds_only_read_scopes() -> None:
    assert all(scope.endswith(":read") for scope in DIAGNOSIS_SCOPES)

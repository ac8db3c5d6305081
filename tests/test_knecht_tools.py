"""The Knecht tools as a model meets them: over the SDK client, through the gate, with approvals."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import pytest

from mcp_knecht.app import App
from tests.knecht_harness import Knecht, build, call
from tests.staging import acli

pytestmark = pytest.mark.anyio


@pytest.fixture
async def kn(app: App) -> AsyncIterator[Knecht]:
    yield await build(app)


async def failed_run(kn: Knecht, kind_action: str = "test") -> dict:
    row = await kn.app.db.fetch_one(
        "SELECT r.id, a.id AS action_id, a.name FROM runs r JOIN actions a ON a.run_id = r.id"
        " WHERE r.status = 'failed' AND a.status = 'failed' AND a.name = ? ORDER BY r.id LIMIT 1",
        (kind_action,),
    )
    assert row is not None
    return row


# --- Workflows -----------------------------------------------------------------------------------


async def test_list_and_get_workflows_by_id_by_name_and_by_version(kn: Knecht) -> None:
    async with kn.connect() as client:
        listed = (await call(client, "list_workflows", project="payments-api")).structured_content
        names = {w["name"] for w in listed["workflows"]}
        assert names == {"ci", "release", "nightly"}
        ci = next(w for w in listed["workflows"] if w["name"] == "ci")
        by_name = (await call(client, "get_workflow", workflow="ci", project="payments-api")).structured_content
        by_id = (await call(client, "get_workflow", workflow=ci["id"])).structured_content
        assert by_name == by_id
        assert by_id["version"] == by_id["current_version"] == ci["current_version"]
        assert by_id["actions"][:3] == ["parse-workflow", "checkout", "install"]
        assert by_id["inputs"]["log_level"]["options"] == ["debug", "info", "warning"]
        first = (await call(client, "get_workflow", workflow=ci["id"], version=1)).structured_content
        assert first["version"] == 1 and not first["is_current"] and first["definition"] != by_id["definition"]
        missing = await client.call_tool("get_workflow", {"workflow": ci["id"], "version": 99})
        assert missing.is_error and "no version 99" in missing.content[0].text
        ambiguous = await client.call_tool("get_workflow", {"workflow": "ci"})
        assert ambiguous.is_error and "project" in ambiguous.content[0].text


# --- Logs ----------------------------------------------------------------------------------------


async def test_an_action_log_is_addressed_by_name_or_by_id(kn: Knecht) -> None:
    failed = await failed_run(kn)
    async with kn.connect() as client:
        by_name = (await call(client, "get_action_log", run_id=failed["id"], action="test", tail=20)).structured_content
        by_id = (await call(client, "get_action_log", run_id=failed["id"], action=failed["action_id"],
                            tail=20)).structured_content
        assert by_name == by_id
        assert by_name["action"]["name"] == "test" and by_name["action"]["status"] == "failed"
        unknown = await client.call_tool("get_action_log", {"run_id": failed["id"], "action": "tset"})
        assert unknown.is_error
        assert "test (id " in unknown.content[0].text  # names the actions that do exist


async def test_log_paging_edges(kn: Knecht) -> None:
    run_id = (await failed_run(kn))["id"]
    async with kn.connect() as client:
        whole = (await call(client, "get_run_log", run_id=run_id)).structured_content
        total = whole["total_lines"]
        assert total > 4 and [line["n"] for line in whole["lines"]] == list(range(1, total + 1))
        assert whole["truncated"] is False and whole["next_offset"] is None

        page = (await call(client, "get_run_log", run_id=run_id, offset=0, limit=2)).structured_content
        assert [line["n"] for line in page["lines"]] == [1, 2]
        assert page["truncated"] and page["next_offset"] == 2
        assert "next offset 2" in page["note"]
        rest = (await call(client, "get_run_log", run_id=run_id, offset=2, limit=1000)).structured_content
        assert [line["n"] for line in rest["lines"]] == list(range(3, total + 1)) and rest["next_offset"] is None

        last = (await call(client, "get_run_log", run_id=run_id, offset=total - 1, limit=1)).structured_content
        assert [line["n"] for line in last["lines"]] == [total] and last["next_offset"] is None
        beyond = (await call(client, "get_run_log", run_id=run_id, offset=total + 10)).structured_content
        assert beyond["lines"] == [] and beyond["next_offset"] is None

        tail = (await call(client, "get_run_log", run_id=run_id, tail=3)).structured_content
        assert [line["n"] for line in tail["lines"]] == [total - 2, total - 1, total]
        assert tail["truncated"] and "earlier lines" in tail["note"]
        everything = (await call(client, "get_run_log", run_id=run_id, tail=1000)).structured_content
        assert len(everything["lines"]) == total and everything["truncated"] is False

        both = await client.call_tool("get_run_log", {"run_id": run_id, "tail": 3, "offset": 1})
        assert both.is_error and "tail" in both.content[0].text
        for bad in ({"limit": 0}, {"limit": 1001}, {"offset": -1}, {"tail": 0}):
            refused = await client.call_tool("get_run_log", {"run_id": run_id, **bad})
            assert refused.is_error and next(iter(bad)) in refused.content[0].text
        missing = await client.call_tool("get_run_log", {"run_id": 99_999_999})
        assert missing.is_error and "99999999" in missing.content[0].text


async def test_output_is_bounded_by_size_with_a_next_offset(kn: Knecht) -> None:
    run_id = (await failed_run(kn))["id"]
    async with kn.app.db.transaction() as tx:
        await tx.execute("DELETE FROM log_lines WHERE run_id = ? AND action_id = 0", (run_id,))
        await tx.execute_many(
            "INSERT INTO log_lines (run_id, action_id, line_no, text) VALUES (?, 0, ?, ?)",
            [(run_id, n, f"line {n} " + "x" * 290) for n in range(1, 5001)]
            + [(run_id, 5001, "y" * 50_000)],
        )
    async with kn.connect() as client:
        page = (await call(client, "get_run_log", run_id=run_id, limit=1000)).structured_content
        shown = len(page["lines"])
        assert 20 < shown < 100  # 24 KB of 300-character lines
        assert page["truncated"] and page["next_offset"] == shown
        assert f"next offset {shown}" in page["note"]
        assert len(page["content"] if "content" in page else str(page)) < 40_000
        huge = (await call(client, "get_run_log", run_id=run_id, tail=1)).structured_content
        assert len(huge["lines"][0]["text"]) < 2_100 and "line cut: 50000 characters" in huge["lines"][0]["text"]


async def test_grep_is_literal_bounded_and_resumable(kn: Knecht) -> None:
    failed = await failed_run(kn)
    async with kn.connect() as client:
        found = (await call(client, "get_action_log", run_id=failed["id"], action="test",
                            grep="FAIL")).structured_content
        assert found["matches"] >= 1 and all("fail" in line["text"].lower() for line in found["lines"])
        first = (await call(client, "get_action_log", run_id=failed["id"], action="test", grep="fail",
                            limit=1)).structured_content
        assert first["matches"] == 1 and first["next_offset"] == first["lines"][0]["n"]
        if found["matches"] > 1:
            second = (await call(client, "get_action_log", run_id=failed["id"], action="test", grep="fail",
                                 limit=1, offset=first["next_offset"])).structured_content
            assert second["lines"][0] == found["lines"][1]
        last = (await call(client, "get_action_log", run_id=failed["id"], action="test", grep="fail",
                           tail=1)).structured_content
        assert last["lines"] == found["lines"][-1:]
        literal = (await call(client, "get_action_log", run_id=failed["id"], action="test",
                              grep="100%_")).structured_content
        assert literal["matches"] == 0  # % and _ are not wildcards
        too_long = await client.call_tool("get_action_log", {"run_id": failed["id"], "action": "test",
                                                             "grep": "a" * 201})
        assert too_long.is_error and "grep" in too_long.content[0].text


async def test_a_pathological_pattern_cannot_hang_the_server(kn: Knecht) -> None:
    run_id = (await failed_run(kn))["id"]
    async with kn.app.db.transaction() as tx:
        await tx.execute_many(
            "INSERT INTO log_lines (run_id, action_id, line_no, text) VALUES (?, 0, ?, ?)",
            [(run_id, 1000 + n, "a" * 1_900 + "!") for n in range(1, 3001)],
        )
    async with kn.connect() as client:
        for pattern in ("(a+)+$", "(a|aa)*b", "^(a*)*$" + "a" * 50, ".*.*.*.*.*=.*"):
            started = time.perf_counter()
            result = (await call(client, "get_run_log", run_id=run_id, grep=pattern)).structured_content
            assert time.perf_counter() - started < 2
            assert result["matches"] == 0


# --- Runs ----------------------------------------------------------------------------------------


async def test_rerun_freezes_the_commit_when_proposed_and_runs_it_when_approved(kn: Knecht) -> None:
    failed = await failed_run(kn)
    run = await kn.app.db.fetch_one("SELECT * FROM runs WHERE id = ?", (failed["id"],))
    head = await kn.app.db.fetch_one(
        "SELECT head_sha FROM branches WHERE project_id = ? AND name = ?", (run["project_id"], run["branch"])
    )
    async with kn.connect() as client:
        same = (await call(client, "rerun_run", run_id=run["id"])).structured_content
        newest = (await call(client, "rerun_run", run_id=run["id"], ref="branch_head")).structured_content
        proposal = (await call(client, "get_proposal", id=same["id"])).structured_content
    assert same["status"] == "pending"
    assert proposal["arguments"]["commit_sha"] == run["commit_sha"]
    stored = await kn.app.proposals.get(newest["id"])
    assert stored is not None and stored.arguments["commit_sha"] == head["head_sha"]
    assert stored.preview["will_run"]["commit_sha"] == head["head_sha"]
    assert stored.preview["run"]["status"] == "failed"

    done = await kn.approve(same["id"])
    assert done.status == "succeeded", done.error
    new = done.result["run"]
    assert (new["status"], new["trigger"], new["rerun_of"], new["commit_sha"]) == (
        "queued", "rerun", run["id"], run["commit_sha"])
    async with kn.connect() as client:
        shown = (await call(client, "get_run", run_id=new["id"])).structured_content
        assert [a["status"] for a in shown["actions"]] == ["pending"] * len(shown["actions"])
        assert shown["actions"][0]["name"] == "parse-workflow"
        queued_again = await client.call_tool("rerun_run", {"run_id": new["id"]})
        assert queued_again.is_error and "still queued" in queued_again.content[0].text
        wrong = await client.call_tool("rerun_run", {"run_id": run["id"], "commit_sha": "0" * 40})
        assert wrong.is_error and "commit_sha" in wrong.content[0].text


async def test_cancelling_a_finished_run_is_refused_with_a_clear_error(kn: Knecht) -> None:
    failed = await failed_run(kn)
    async with kn.connect() as client:
        result = await client.call_tool("cancel_run", {"run_id": failed["id"]})
    assert result.is_error
    assert f"Run {failed['id']} is failed" in result.content[0].text
    assert "only queued or running runs can be cancelled" in result.content[0].text
    assert await kn.app.proposals.list() == []  # refused at once, nothing staged


async def test_cancelling_a_queued_run_after_approval(kn: Knecht) -> None:
    queued = await kn.app.db.fetch_one("SELECT id FROM runs WHERE status = 'queued' ORDER BY id LIMIT 1")
    async with kn.connect() as client:
        staged = (await call(client, "cancel_run", run_id=queued["id"], reason="superseded")).structured_content
    done = await kn.approve(staged["id"])
    assert done.status == "succeeded", done.error
    run = await kn.app.db.fetch_one("SELECT status FROM runs WHERE id = ?", (queued["id"],))
    assert run["status"] == "cancelled"
    async with kn.connect() as client:
        log = (await call(client, "get_run_log", run_id=queued["id"], tail=1)).structured_content
        assert "cancelled by alice: superseded" in log["lines"][0]["text"]


async def test_a_run_that_finished_before_approval_is_not_cancelled(kn: Knecht) -> None:
    running = await kn.app.db.fetch_one("SELECT id FROM runs WHERE status = 'running' ORDER BY id LIMIT 1")
    async with kn.connect() as client:
        staged = (await call(client, "cancel_run", run_id=running["id"])).structured_content
    async with kn.app.db.transaction() as tx:
        await tx.execute("UPDATE runs SET status = 'succeeded' WHERE id = ?", (running["id"],))
    done = await kn.approve(staged["id"])
    assert done.status == "failed" and "is succeeded" in done.error


# --- Dispatch ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("inputs", "field", "problem"),
    [
        ({"environment": "staging"}, "inputs.version", "required input is missing"),
        ({"version": "v1.2.3", "environment": "moon"}, "inputs.environment", "one of"),
        ({"version": "v1.2.3", "dry_run": "yes"}, "inputs.dry_run", "boolean"),
        ({"version": "v1.2.3", "colour": "red"}, "inputs.colour", "not a declared input"),
        ({"version": 3}, "inputs.version", "string"),
    ],
)
async def test_dispatch_inputs_are_validated_against_the_declaration(kn: Knecht, inputs, field, problem) -> None:  # type: ignore[no-untyped-def]
    async with kn.connect() as client:
        result = await client.call_tool("dispatch_workflow", {
            "workflow": "release", "project": "payments-api", "branch": "main", "inputs": inputs})
    assert result.is_error
    problems = result.structured_content["error"]["problems"]
    assert any(p["field"] == field and problem in p["problem"] for p in problems), problems
    assert await kn.app.proposals.list() == []


async def test_dispatch_freezes_branch_head_and_defaults(kn: Knecht) -> None:
    async with kn.connect() as client:
        bad_branch = await client.call_tool("dispatch_workflow", {
            "workflow": "ci", "project": "payments-api", "branch": "nope"})
        assert bad_branch.is_error and "main" in bad_branch.content[0].text
        staged = (await call(client, "dispatch_workflow", workflow="release", project="payments-api",
                             branch="main", inputs={"version": "v9.9.9"})).structured_content
    proposal = await kn.app.proposals.get(staged["id"])
    head = await kn.app.db.fetch_one("SELECT head_sha FROM branches WHERE project_id = 1 AND name = 'main'")
    assert proposal.arguments["commit_sha"] == head["head_sha"]
    assert proposal.arguments["inputs"] == {"version": "v9.9.9", "environment": "staging", "dry_run": False}
    assert isinstance(proposal.arguments["workflow"], int)
    done = await kn.approve(staged["id"])
    assert done.status == "succeeded", done.error
    assert done.result["run"]["trigger"] == "manual" and done.result["run"]["created_by"] == "alice"


# --- Workflow updates ----------------------------------------------------------------------------


async def new_definition(client, workflow_id: int) -> tuple[str, int]:  # type: ignore[no-untyped-def]
    current = (await call(client, "get_workflow", workflow=workflow_id)).structured_content
    return current["definition"].replace("timeout-minutes: 20", "timeout-minutes: 45"), current["version"]


async def test_update_workflow_shows_a_diff_and_stores_a_new_version(kn: Knecht) -> None:
    async with kn.connect() as client:
        definition, version = await new_definition(client, 1)
        staged = (await call(client, "update_workflow", workflow=1, definition=definition,
                             message="tests need longer")).structured_content
    proposal = await kn.app.proposals.get(staged["id"])
    assert proposal.arguments["base_version"] == version
    assert "-timeout-minutes: 20" in proposal.preview["diff"] and "+timeout-minutes: 45" in proposal.preview["diff"]
    done = await kn.approve(staged["id"])
    assert done.status == "succeeded", done.error
    assert done.result["version"] == version + 1
    async with kn.connect() as client:
        now = (await call(client, "get_workflow", workflow=1)).structured_content
    assert now["version"] == version + 1 and now["definition"] == definition and now["created_by"] == "alice"


async def test_a_stale_update_workflow_is_refused_at_execution(kn: Knecht) -> None:
    async with kn.connect() as client:
        definition, version = await new_definition(client, 1)
        mine = (await call(client, "update_workflow", workflow=1, definition=definition)).structured_content
    async with kn.connect(subject="carol") as other:
        theirs = (await call(other, "update_workflow", workflow=1,
                             definition=definition + "# carol was here\n")).structured_content
    assert (await kn.approve(theirs["id"])).status == "succeeded"

    done = await kn.approve(mine["id"])
    assert done.status == "failed"
    assert "changed since this update was proposed" in done.error
    assert f"version {version + 1} now" in done.error and f"based on version {version}" in done.error
    async with kn.connect() as client:
        now = (await call(client, "get_workflow", workflow=1)).structured_content
        assert now["definition"].endswith("# carol was here\n")  # no lost update
        outdated = await client.call_tool("update_workflow", {"workflow": 1, "definition": definition,
                                                              "base_version": version})
        assert outdated.is_error and "changed since" in outdated.content[0].text


async def test_an_update_with_broken_yaml_is_refused_when_proposed(kn: Knecht) -> None:
    async with kn.connect() as client:
        definition, _ = await new_definition(client, 1)
        broken = definition.replace("run: pytest -q --maxfail=1", "run: pytest -q: --junitxml=x.xml")
        result = await client.call_tool("update_workflow", {"workflow": 1, "definition": broken})
    assert result.is_error and "quote the command" in result.content[0].text


# --- Variables -----------------------------------------------------------------------------------


async def test_secret_variables_are_never_returned(kn: Knecht, demo_env: dict[str, str]) -> None:
    secret = await kn.app.db.fetch_one(
        "SELECT value FROM project_variables WHERE project_id = 1 AND name = 'DEPLOY_TOKEN'")
    async with kn.connect() as client:
        listed = await call(client, "project_variable", action="list", project="payments-api")
        by_name = {v["name"]: v for v in listed.structured_content["variables"]}
        assert by_name["DEPLOY_TOKEN"]["secret"] is True and by_name["DEPLOY_TOKEN"]["value"] is None
        assert by_name["REGION"]["value"] == "eu-central-1"
        got = await call(client, "project_variable", action="get", project="payments-api", name="DEPLOY_TOKEN")
        assert got.structured_content["variable"]["value"] is None
        assert secret["value"] not in listed.content[0].text + got.content[0].text

        new_secret = "n3w-S3cret-value-for-tests"
        staged = (await call(client, "project_variable", action="set", project="payments-api",
                             name="SENTRY_DSN", value=new_secret, secret=True)).structured_content
        followed = await call(client, "get_proposal", id=staged["id"])
        assert new_secret not in followed.content[0].text  # masked from the moment it was proposed
    proposal = await kn.app.proposals.get(staged["id"])
    assert new_secret not in str(proposal.preview)
    assert new_secret not in json.dumps(proposal.shown_arguments)  # what `knecht-approve show` prints
    assert new_secret in proposal.arguments_json  # what runs, under the hash
    shown = await acli("knecht-approve", demo_env, "show", str(staged["id"]))
    assert shown.returncode == 0 and new_secret not in shown.stdout and "SENTRY_DSN" in shown.stdout
    done = await kn.approve(staged["id"])
    assert done.status == "succeeded", done.error
    assert new_secret not in str(done.result)
    assert new_secret in kn.secrets.literals
    async with kn.connect() as client:
        got = await call(client, "project_variable", action="get", project="payments-api", name="SENTRY_DSN")
        assert got.structured_content["variable"] == {**got.structured_content["variable"], "secret": True,
                                                      "value": None}
        unsecret = await client.call_tool("project_variable", {
            "action": "set", "project": "payments-api", "name": "SENTRY_DSN", "value": "x", "secret": False})
        assert unsecret.is_error and "cannot be made non-secret" in unsecret.content[0].text


async def test_plain_variables_are_set_and_deleted_after_approval(kn: Knecht) -> None:
    async with kn.connect() as client:
        staged = (await call(client, "project_variable", action="set", project="payments-api",
                             name="LOG_LEVEL", value="debug")).structured_content
        gone = (await call(client, "project_variable", action="delete", project="payments-api",
                           name="REGION")).structured_content
        missing = await client.call_tool("project_variable", {"action": "delete", "project": "payments-api",
                                                              "name": "NOPE"})
        nameless = await client.call_tool("project_variable", {"action": "get", "project": "payments-api"})
    assert missing.is_error and "no variable 'NOPE'" in missing.content[0].text
    assert nameless.is_error and "name" in nameless.content[0].text
    preview = (await kn.app.proposals.get(staged["id"])).preview
    assert preview["current"]["value"] == "info" and preview["new"]["value"] == "debug"
    assert (await kn.approve(staged["id"])).status == "succeeded"
    assert (await kn.approve(gone["id"])).status == "succeeded"
    async with kn.connect() as client:
        listed = (await call(client, "project_variable", action="list", project="payments-api")).structured_content
    values = {v["name"]: v["value"] for v in listed["variables"]}
    assert values["LOG_LEVEL"] == "debug" and "REGION" not in values


async def test_changing_variables_needs_the_write_scope(kn: Knecht) -> None:
    reader = ("projects:read", "variables:read", "proposals:read")
    async with kn.connect(scopes=reader) as client:
        listed = await client.call_tool("project_variable", {"action": "list", "project": 1})
        assert not listed.is_error
        refused = await client.call_tool("project_variable", {
            "action": "set", "project": 1, "name": "LOG_LEVEL", "value": "debug"})
    assert refused.is_error and "variables:write" in refused.content[0].text
    assert await kn.app.proposals.list() == []


# --- Listing, descriptions, prompt ---------------------------------------------------------------


async def test_every_tool_is_listed_with_a_description_for_a_model(kn: Knecht) -> None:
    async with kn.connect() as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    expected = {"list_projects", "get_project", "list_workflows", "get_workflow", "list_runs", "get_run",
                "get_run_log", "get_action_log", "rerun_run", "cancel_run", "dispatch_workflow",
                "update_workflow", "project_variable"}
    assert expected <= set(tools)
    for name in expected:
        assert len(tools[name].description) > 150, name
        for field, schema in tools[name].input_schema.get("properties", {}).items():
            assert schema.get("description"), f"{name}.{field}"
    for name in ("rerun_run", "cancel_run", "dispatch_workflow", "update_workflow"):
        assert tools[name].annotations.read_only_hint is False
        assert "staged" in tools[name].description


async def test_the_diagnose_run_prompt(app: App) -> None:
    from mcp_knecht.errors import InvalidArgumentsError, NotFoundError

    [prompt] = app.prompts
    text = await prompt.render({"run_id": "42"})
    for step in ("get_run(run_id=42)", "get_action_log", "earlier actions", "get_workflow", "one or two sentences",
                 "actions: [id, ...]"):
        assert step in text
    with pytest.raises(InvalidArgumentsError):
        await prompt.render({"run_id": "latest"})
    with pytest.raises(NotFoundError, match="Run 999999 does not exist"):
        await prompt.render({"run_id": "999999"})

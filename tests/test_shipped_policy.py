"""The shipped policies.toml, in seed 004's spirit — staging protects, it does not paralyse: reads
and cheap-to-undo writes run at once, what cannot be undone or touches what is protected waits for
an operator. Also: the README's worked examples are valid policy files."""

from __future__ import annotations

import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from mcp_knecht.app import App, open_app
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.policy_file import parse_policy
from mcp_knecht.core.policy_text import rule_warnings
from mcp_knecht.core.settings import load_settings
from tests.conftest import REPO
from tests.test_entities_support import make_app_database
from tests.test_entities_support import make_config as entity_config

pytestmark = pytest.mark.anyio

SHIPPED = REPO / "policies.toml"
README = REPO / "README.md"
EVERYTHING = frozenset({
    "projects:read", "workflows:read", "workflows:write", "runs:read", "runs:write", "logs:read", "variables:read",
    "variables:write", "proposals:read", "users:read", "users:write", "orders:read", "orders:write"})


@pytest.fixture
async def shipped_app(demo_env: dict[str, str], tmp_path: Path) -> AsyncIterator[App]:
    """The Knecht demo data and the example entities, under the policies.toml this repository ships."""
    app_url = f"sqlite:///{tmp_path / 'shop.db'}"
    await make_app_database(app_url)
    config = entity_config(tmp_path / "shipped-config", app_url)
    shutil.copy(SHIPPED, config / "policies.toml")
    env = {**demo_env, "KNECHT_CONFIG_DIR": str(config),
           "KNECHT_TOOLSETS": "mcp_knecht.knecht:toolset,mcp_knecht.entities:toolset"}
    async with open_app(load_settings(env=env), watch_policy=False) as running:
        yield running


async def _one(app: App, sql: str) -> dict[str, Any]:
    row = await app.db.fetch_one(sql)
    assert row is not None, sql
    return row


async def test_the_shipped_policy_protects_without_paralysing(shipped_app: App) -> None:
    app = shipped_app
    agent = Actor("claude", "claude-code", EVERYTHING, {"sub": "claude", "knecht_role": "admin"})

    async def outcome(tool: str, arguments: dict[str, Any]) -> str:
        result = await app.gate.call_tool(agent, tool, arguments)
        assert not result.is_error or result.outcome == "denied", result.text
        return result.outcome

    # Reads run at once.
    assert await outcome("list_runs", {"limit": 1}) == "ran"
    assert await outcome("project_variable", {"action": "list", "project": 1}) == "ran"
    assert await outcome("query_orders", {"limit": 1}) == "ran"
    # Reruns and cancels: at once on a feature branch, staged on a protected one.
    feature = await _one(app, "SELECT id FROM runs WHERE branch LIKE 'feature/%' AND status = 'failed' LIMIT 1")
    main = await _one(app, "SELECT id FROM runs WHERE branch = 'main' AND status = 'failed' LIMIT 1")
    assert await outcome("rerun_run", {"run_id": feature["id"]}) == "ran"
    assert await outcome("rerun_run", {"run_id": main["id"]}) == "staged"
    queued_feature = await _one(app, "SELECT id FROM runs WHERE branch NOT IN ('main', 'master') AND branch NOT LIKE "
                                     "'release/%' AND status IN ('queued', 'running') LIMIT 1")
    queued_main = await _one(app, "SELECT id FROM runs WHERE branch = 'main' AND status IN ('queued', 'running') "
                                  "LIMIT 1")
    assert await outcome("cancel_run", {"run_id": queued_feature["id"]}) == "ran"
    assert await outcome("cancel_run", {"run_id": queued_main["id"]}) == "staged"
    # Starting and changing workflows waits for a human.
    ci = await _one(app, "SELECT id FROM workflows WHERE name = 'ci' LIMIT 1")
    assert await outcome("dispatch_workflow", {"workflow": ci["id"], "branch": "main"}) == "staged"
    definition = "name: ci\nactions:\n  - name: build\n    run: make\n"
    assert await outcome("update_workflow", {"workflow": ci["id"], "definition": definition}) == "staged"
    # Variables: set and delete are staged; deleting a secret needs two operators.
    secret = await _one(app, "SELECT p.slug, v.name FROM project_variables v JOIN projects p ON p.id = v.project_id"
                             " WHERE v.secret = 1 LIMIT 1")
    plain = await _one(app, "SELECT p.slug, v.name FROM project_variables v JOIN projects p ON p.id = v.project_id"
                            " WHERE v.secret = 0 LIMIT 1")
    assert await outcome("project_variable", {"action": "set", "project": plain["slug"], "name": "NEW_ONE",
                                              "value": "1"}) == "staged"
    for row, approvers in ((secret, 2), (plain, 1)):
        staged = await app.gate.call_tool(agent, "project_variable", {"action": "delete", "project": row["slug"],
                                                                      "name": row["name"]})
        assert staged.outcome == "staged"
        proposal = await app.proposals.get(staged.data["id"])  # type: ignore[index]
        assert proposal is not None and proposal.approvers == approvers
    # Entities: deleting a record is staged with its reason; creates and updates stay staged (built-in).
    deleted = await app.gate.call_tool(agent, "delete_orders", {"id": 3})
    assert deleted.outcome == "staged" and "a deleted record cannot be restored" in deleted.text
    assert await outcome("update_orders", {"id": 3, "fields": {"note": "x"}}) == "staged"


async def test_the_shipped_policy_has_no_rule_that_can_never_match(shipped_app: App) -> None:
    policy = shipped_app.policy()
    assert policy.rule_list and rule_warnings(policy, shipped_app.registry) == []


def _readme_policies() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Policies: `policies.toml`"):text.index("## Proposals and `knecht-approve`")]
    return re.findall(r"```toml\n(.*?)```", section, flags=re.DOTALL)


async def test_the_readme_has_five_worked_examples_and_each_is_a_valid_policy(shipped_app: App) -> None:
    blocks = _readme_policies()
    examples = [block for block in blocks if "[[rules]]" in block]
    assert len(examples) >= 5
    for block in blocks:
        parse_policy(block, Path("README.md"), shipped_app.registry)  # raises ConfigError when broken

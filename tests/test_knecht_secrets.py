"""No secret leaves the server: every demo failure walked through every tool, every output checked
for the known secret values and for anything shaped like a secret."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest

from mcp_knecht.app import App
from mcp_knecht.knecht import secret_values
from tests.knecht_harness import Knecht, build, call

pytestmark = pytest.mark.anyio

SECRET_SHAPES = re.compile(
    r"(?:AKIA|ASIA)[0-9A-Z]{16}"
    r"|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|glpat-[A-Za-z0-9_\-]{20,}"
    r"|xox[abprs]-[A-Za-z0-9\-]{10,}"
    r"|eyJ[A-Za-z0-9_\-]{5,}\.eyJ"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----\s*[A-Za-z0-9+/]"
    r"|://[^\s:/@\"]+:(?!\*\*\*)[^\s@/\"]+@"
    r"|(?:password|passwd|secret|token)[\"']?\s*[=:]\s*[\"']?(?!\*\*\*|null|true|false)[A-Za-z0-9+/]{6,}",
    re.IGNORECASE,
)


@pytest.fixture
async def kn(app: App) -> AsyncIterator[Knecht]:
    yield await build(app)


class Walk:
    def __init__(self, known: set[str]) -> None:
        self.known = known
        self.outputs = 0

    def check(self, where: str, text: str) -> None:
        self.outputs += 1
        for value in self.known:
            assert value not in text, f"{where}: a secret variable's value leaked"
        shaped = SECRET_SHAPES.search(text)
        assert shaped is None, f"{where}: secret-shaped text {shaped.group(0)!r}"

    async def __call__(self, client, tool: str, **arguments: object) -> dict:  # type: ignore[no-untyped-def]
        result = await call(client, tool, **arguments)
        self.check(f"{tool}({arguments})", result.content[0].text)
        return result.structured_content


async def test_the_demo_logs_really_contain_secrets(app: App) -> None:
    """Otherwise the walk below would prove nothing."""
    known = await secret_values(app.db)
    assert len(known) >= 20
    rows = await app.db.fetch_all("SELECT text FROM log_lines WHERE text LIKE '%AKIA%' OR text LIKE '%password=%'"
                                  " OR text LIKE '%ghp_%' OR text LIKE '%postgres://%'")
    assert len(rows) >= 10
    assert any(any(value in row["text"] for value in known) for row in rows)


async def test_no_secret_in_any_output_of_any_demo_failure(kn: Knecht) -> None:
    walk = Walk(await secret_values(kn.app.db))
    leaky = await kn.app.db.fetch_all(
        "SELECT DISTINCT run_id FROM log_lines WHERE text LIKE '%AKIA%' OR text LIKE '%password=%'"
        " OR text LIKE '%ghp_%' OR text LIKE '%postgres://%'"
    )
    failed = await kn.app.db.fetch_all("SELECT id FROM runs WHERE status = 'failed'")
    run_ids = sorted({row["id"] for row in failed} | {row["run_id"] for row in leaky})
    async with kn.connect() as client:
        projects = (await walk(client, "list_projects"))["projects"]
        for project in projects:
            await walk(client, "get_project", project=project["slug"])
            variables = await walk(client, "project_variable", action="list", project=project["slug"])
            for variable in variables["variables"]:
                await walk(client, "project_variable", action="get", project=project["slug"], name=variable["name"])
        for workflow in (await walk(client, "list_workflows"))["workflows"]:
            await walk(client, "get_workflow", workflow=workflow["id"])
        await walk(client, "list_runs", status="failed", limit=50)
        for run_id in run_ids:
            run = await walk(client, "get_run", run_id=run_id)
            await walk(client, "get_run_log", run_id=run_id, limit=1000)
            for action in run["actions"]:
                if action["log_lines"]:
                    await walk(client, "get_action_log", run_id=run_id, action=action["id"], limit=1000)
            for needle in ("AKIA", "password", "token", "://"):
                await walk(client, "get_run_log", run_id=run_id, grep=needle)
            await walk(client, "rerun_run", run_id=run_id)  # a staged write: its preview is checked below
        for proposal in (await walk(client, "list_proposals", limit=50))["proposals"]:
            await walk(client, "get_proposal", id=proposal["id"])
    for proposal in await kn.app.proposals.list(limit=1000):
        walk.check(f"preview of #{proposal.id}", str(proposal.preview))
    await kn.app.audit.flush()
    for row in await kn.app.db.fetch_all("SELECT * FROM audit_log"):
        walk.check(f"audit entry {row['id']}", str(row))
    assert walk.outputs > 500

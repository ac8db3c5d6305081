"""Every demo failure can be diagnosed through the tools in at most five calls: a scripted walk,
no model — the proof that the tools expose the cause (seed 002's failure diagnosis)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from mcp import Client

from mcp_knecht.app import App
from mcp_knecht.knecht.demo import FAILURE_KINDS
from tests.knecht_harness import Knecht, build, call

pytestmark = pytest.mark.anyio

MAX_CALLS = 5

# What a reader looks for: the kind of failure, recognised by the lines that state the cause.
CAUSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("bad_workflow_syntax", ("is not valid yaml", "mapping values are not allowed")),
    ("out_of_memory", ("ran out of memory", "exited with code 137")),
    ("timeout", ("exceeded timeout",)),
    ("flaky_network", ("connection reset by peer",)),
    ("dependency_install", ("resolutionimpossible", "eresolve", "failed to select a version", "unknown revision",
                            "failed to query available provider", "conflicting dependencies")),
    ("test_assertion", ("assertionerror", "assert 200 == 500", "--- fail", "expect(received)")),
)


@dataclass
class Diagnosis:
    kind: str | None = None
    actions: list[int] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    calls: int = 0


class Diagnoser:
    """The prompt `diagnose_run`, followed by a script instead of a model."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.diagnosis = Diagnosis()

    async def tool(self, name: str, **arguments: object) -> dict:
        self.diagnosis.calls += 1
        result = await call(self.client, name, **arguments)
        assert not result.is_error, result.content[0].text
        return result.structured_content

    def classify(self, lines: list[dict]) -> str | None:
        text = "\n".join(line["text"] for line in lines).lower()
        for kind, markers in CAUSES:
            if any(marker in text for marker in markers):
                return kind
        return None

    async def run(self, run_id: int) -> Diagnosis:
        run = await self.tool("get_run", run_id=run_id)
        failed = run["failed_action"]
        log = await self.tool("get_action_log", run_id=run_id, action=failed["id"], tail=60)
        self.diagnosis.kind = self.classify(log["lines"])
        self.diagnosis.actions = [failed["id"]]
        self.diagnosis.evidence = [line["text"] for line in log["lines"][-3:]]
        if self.diagnosis.kind == "out_of_memory":
            # "Killed" is the symptom; what filled the memory happened earlier in the run.
            for action in reversed(run["actions"][: failed["position"] - 1]):
                earlier = await self.tool("get_action_log", run_id=run_id, action=action["name"], grep="memory")
                if earlier["lines"]:
                    self.diagnosis.actions.insert(0, action["id"])
                    self.diagnosis.evidence += [line["text"] for line in earlier["lines"]]
                    break
        if self.diagnosis.kind == "bad_workflow_syntax":
            workflow = await self.tool("get_workflow", workflow=run["workflow_id"], version=run["workflow_version"])
            self.diagnosis.evidence.append(workflow["path"])
        if self.diagnosis.kind == "timeout":
            warnings = await self.tool("get_action_log", run_id=run_id, action=failed["id"], grep="warning")
            self.diagnosis.evidence += [line["text"] for line in warnings["lines"]]
        return self.diagnosis


@pytest.fixture
async def kn(app: App) -> AsyncIterator[Knecht]:
    yield await build(app)


async def test_every_failed_run_is_diagnosed_in_at_most_five_calls(kn: Knecht) -> None:
    failed = await kn.app.db.fetch_all(
        "SELECT r.id, a.name FROM runs r JOIN actions a ON a.run_id = r.id AND a.status = 'failed'"
        " WHERE r.status = 'failed' ORDER BY r.id"
    )
    assert len(failed) >= 50
    seen: dict[str, int] = {}
    async with kn.connect(scopes=("projects:read", "workflows:read", "runs:read", "logs:read")) as client:
        for row in failed:
            diagnosis = await Diagnoser(client).run(row["id"])
            assert diagnosis.calls <= MAX_CALLS, (row["id"], diagnosis)
            assert diagnosis.kind is not None, (row["id"], diagnosis.evidence)
            seen[diagnosis.kind] = seen.get(diagnosis.kind, 0) + 1
            if diagnosis.kind == "out_of_memory":
                assert len(diagnosis.actions) == 2, "the build log shows the memory filling up"
                assert any("tmp" in line for line in diagnosis.evidence)
            if diagnosis.kind == "timeout":
                assert any("redis" in line for line in diagnosis.evidence)
    assert set(seen) == set(FAILURE_KINDS)


async def test_diagnosis_matches_the_failing_action_of_each_kind(kn: Knecht) -> None:
    from mcp_knecht.knecht.demo import FAILING_ACTION

    examples: dict[str, int | None] = dict.fromkeys(FAILURE_KINDS)
    async with kn.connect() as client:
        rows = await kn.app.db.fetch_all("SELECT id FROM runs WHERE status = 'failed' ORDER BY id LIMIT 30")
        for row in rows:
            diagnosis = await Diagnoser(client).run(row["id"])
            run = (await call(client, "get_run", run_id=row["id"])).structured_content
            assert run["failed_action"]["name"] == FAILING_ACTION[diagnosis.kind]
            examples[diagnosis.kind] = row["id"]
    assert all(examples.values()), examples

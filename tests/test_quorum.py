"""The two-person rule: a proposal whose rule asks for `approvers = N` runs only after N distinct
operators (none of them the proposer) approved it — exactly once, however many race for it, on
SQLite and on PostgreSQL, across processes and replicas; one operator rejecting is enough."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from mcp_knecht.app import App, open_app
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.audit import AuditEntry
from mcp_knecht.core.clock import timestamp
from mcp_knecht.core.keys import ServerKeys
from mcp_knecht.core.proposals import Approval, NewProposal, person, seal_text
from mcp_knecht.core.settings import load_settings
from mcp_knecht.store import Database, open_database
from mcp_knecht.store.audit_log import AuditChain, verify_chain
from mcp_knecht.store.proposals import SqlProposalRepository
from tests.servers import http_server
from tests.staging import AGENT, acli, racing_approvers
from tests.test_decision_api import _as, _token
from tests.test_replicas import _effects, shared_env  # noqa: F401  (fixture)

pytestmark = pytest.mark.anyio

QUORUM = """
[[rules]]
tool = "record_effect"
when = { label = "two-*" }
decision = "approve"
approvers = 2
reason = "two people"

[[rules]]
tool = "record_effect"
when = { label = "three-*" }
decision = "approve"
approvers = 3
reason = "three people"
"""


@pytest.fixture
def quorum_env(shared_env: dict[str, str]) -> dict[str, str]:  # noqa: F811
    Path(shared_env["KNECHT_CONFIG_DIR"], "policies.toml").write_text(QUORUM, encoding="utf-8")
    return shared_env


async def _stage(env: dict[str, str], *labels: str, subject: str = "dev-agent") -> list[int]:
    async with open_app(load_settings(env=env), watch_policy=False) as app:
        agent = Actor(subject, "pytest", frozenset(AGENT))
        ids = []
        for label in labels:
            staged = await app.gate.call_tool(agent, "record_effect", {"label": label})
            assert staged.outcome == "staged", staged.text
            ids.append(int(staged.data["id"]))  # type: ignore[index]
    return ids


# --- the store: the approval that completes the quorum claims, exactly once -----------------------

CHAIN = AuditChain(ServerKeys(b"test-server-key-" * 4))


def _entry(outcome: str, subject: str) -> AuditEntry:
    return AuditEntry(source="approval", subject=subject, client="pytest", tool="t", outcome=outcome)  # type: ignore[arg-type]


async def _create(repo: SqlProposalRepository, n: int, approvers: int) -> int:
    now = timestamp()
    proposal = NewProposal(tool="t", action=None, arguments_json=f'{{"n":{n}}}', arguments_hash=f"h{n}",
                           arguments_shown=f'{{"n":{n}}}', proposer=Actor("alice", "c", frozenset()), rule="r",
                           preview_json=None, created_at=now, expires_at="9999-12-31T00:00:00.000000Z",
                           approvers=approvers, policy_reason="two people")
    proposal_id, created = await repo.create(proposal, _entry("staged", "alice"), lambda _: "s")
    assert created
    return proposal_id


async def test_eight_racing_operators_complete_each_quorum_exactly_once(database_url: str) -> None:
    db = await open_database(database_url)
    stores: list[Database] = [db, *[await open_database(db.url) for _ in range(3)]]
    repos = [SqlProposalRepository(s, CHAIN) for s in stores]
    ids = [await _create(repos[0], n, approvers=3) for n in range(30)]
    outcomes: dict[int, list[tuple[str, str]]] = {i: [] for i in ids}

    async def operator(repo: SqlProposalRepository, name: str) -> None:
        for proposal_id in random.sample(ids, len(ids)):
            approval = Approval(name, person(name), timestamp(), "sealed")
            outcome = await repo.add_approval(
                proposal_id, approval, required=3, counts=lambda a: True,
                audit=lambda counted, completes: _entry("approved" if completes else "approval_recorded", name))
            outcomes[proposal_id].append((outcome.outcome, name))

    try:
        async with anyio.create_task_group() as tasks:
            for n in range(8):
                tasks.start_soon(operator, repos[n % len(repos)], f"op-{n}")
        for proposal_id, seen in outcomes.items():
            kinds = sorted(kind for kind, _ in seen)
            assert kinds == ["claimed", *["not_pending"] * 5, "recorded", "recorded"], (proposal_id, seen)
            proposal = await repos[0].get(proposal_id)
            assert proposal is not None and proposal.status == "executing"  # approved and started in one commit
            assert len(proposal.approvals) == 3 and proposal.quorum.startswith("3 of 3 approvals (op-")
            [claimer] = [name for kind, name in seen if kind == "claimed"]
            assert proposal.decided_by == claimer == proposal.approvals[-1].operator
        counts = await db.fetch_all("SELECT outcome, COUNT(*) AS n FROM audit_log GROUP BY outcome ORDER BY outcome")
        assert counts == [{"outcome": "approval_recorded", "n": 60}, {"outcome": "approved", "n": 30},
                          {"outcome": "staged", "n": 30}]
        assert await verify_chain(db, CHAIN) == []
        # One approval per person: the same operator again is a duplicate, not a second vote.
        extra = await _create(repos[0], 99, approvers=2)
        first = Approval("op-0", person("op-0"), timestamp(), "sealed")
        again = Approval("OP-0 ", person("OP-0 "), timestamp(), "sealed")
        audit = lambda counted, completes: _entry("approval_recorded", "op-0")  # noqa: E731
        recorded = await repos[1].add_approval(extra, first, required=2, counts=lambda a: True, audit=audit)
        assert recorded.outcome == "recorded"
        duplicate = await repos[2].add_approval(extra, again, required=2, counts=lambda a: True, audit=audit)
        assert duplicate.outcome == "duplicate"
    finally:
        for store in stores:
            await store.close()


async def test_eight_approver_processes_run_each_proposal_once_after_n_distinct_approvals(
    quorum_env: dict[str, str],
) -> None:
    ids = await _stage(quorum_env, *(f"three-{n}" for n in range(25)))
    reports = await racing_approvers(quorum_env, 8, ids[0], ids[-1])
    assert sum(r["won"] for r in reports) == 25 and sum(r["recorded"] for r in reports) == 50
    assert await _effects(quorum_env["KNECHT_DATABASE_URL"]) == {f"three-{n}": 1 for n in range(25)}
    db = await open_database(quorum_env["KNECHT_DATABASE_URL"], migrate=False)
    try:
        per_proposal = await db.fetch_all(
            "SELECT proposal_id, COUNT(DISTINCT person) AS n FROM proposal_approvals GROUP BY proposal_id")
        assert sorted(r["proposal_id"] for r in per_proposal) == ids and {r["n"] for r in per_proposal} == {3}
        trail = await db.fetch_all(
            "SELECT outcome, COUNT(*) AS n FROM audit_log WHERE source = 'approval' GROUP BY outcome ORDER BY outcome")
        assert trail == [{"outcome": "approval_recorded", "n": 50}, {"outcome": "approved", "n": 25},
                         {"outcome": "executed", "n": 25}]
    finally:
        await db.close()
    verified = await acli("mcp-knecht", quorum_env, "audit", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr


# --- what operators see and do ---------------------------------------------------------------------


async def test_two_operators_decide_and_knecht_approve_says_how_far_the_quorum_is(
    quorum_env: dict[str, str],
) -> None:
    [proposal_id, other_id] = await _stage(quorum_env, "two-deploy", "two-other")
    shown = await acli("knecht-approve", quorum_env, "show", str(proposal_id))
    assert "approvals   0 of 2 approvals" in shown.stdout and "why staged  two people" in shown.stdout

    bob = await acli("knecht-approve", quorum_env, "approve", str(proposal_id), "--as", "bob")
    assert bob.returncode == 0, bob.stderr
    assert bob.stdout.strip() == (f"Recorded your approval of #{proposal_id} (record_effect): 1 of 2 approvals "
                                  "(local:bob); 1 more operator must approve before it runs.")
    assert await _effects(quorum_env["KNECHT_DATABASE_URL"]) == {}
    listed = await acli("knecht-approve", quorum_env, "list")
    assert "1 of 2 approvals (local:bob)" in listed.stdout and "APPROVALS" in listed.stdout
    [entry] = [e for e in json.loads((await acli("knecht-approve", quorum_env, "list", "--json")).stdout)
               if e["id"] == proposal_id]
    assert entry["quorum"] == "1 of 2 approvals (local:bob)" and entry["approvers"] == 2
    assert [a["operator"] for a in entry["approvals"]] == ["local:bob"] and entry["policy_reason"] == "two people"
    assert "1 of 2 approvals (local:bob)" in (await acli("knecht-approve", quorum_env, "show",
                                                         str(proposal_id))).stdout

    twice = await acli("knecht-approve", quorum_env, "approve", str(proposal_id), "--as", " BOB")
    assert twice.returncode == 1 and "You approved proposal" in twice.stderr and "already" in twice.stderr
    own = await acli("knecht-approve", quorum_env, "approve", str(proposal_id), "--as", "dev-agent")
    assert own.returncode == 1 and "another operator must approve" in own.stderr

    carol = await acli("knecht-approve", quorum_env, "approve", str(proposal_id), "--as", "carol", "--json")
    assert carol.returncode == 0, carol.stderr
    done = json.loads(carol.stdout)
    assert done["status"] == "succeeded" and done["decided_by"] == "local:carol"
    assert done["quorum"] == "2 of 2 approvals (local:bob, local:carol)"
    assert await _effects(quorum_env["KNECHT_DATABASE_URL"]) == {"two-deploy": 1}

    # Rejecting needs one operator, even after an approval.
    assert (await acli("knecht-approve", quorum_env, "approve", str(other_id), "--as", "bob")).returncode == 0
    rejected = await acli("knecht-approve", quorum_env, "reject", str(other_id), "--as", "erin", "--reason", "no")
    assert rejected.returncode == 0 and "Rejected" in rejected.stdout
    late = await acli("knecht-approve", quorum_env, "approve", str(other_id), "--as", "carol")
    assert late.returncode == 1 and "not pending any more" in late.stderr

    db = await open_database(quorum_env["KNECHT_DATABASE_URL"], migrate=False)
    try:
        trail = await db.fetch_all("SELECT subject, outcome, detail FROM audit_log WHERE proposal_id = ? ORDER BY id",
                                   (proposal_id,))
    finally:
        await db.close()
    assert [(r["subject"], r["outcome"]) for r in trail] == [
        ("dev-agent", "staged"), ("local:bob", "approval_recorded"), ("local:carol", "approved"),
        ("local:carol", "executed")]
    assert json.loads(trail[2]["detail"])["approvals"] == ["local:bob", "local:carol"]


@pytest.fixture
def server(quorum_env: dict[str, str]) -> Iterator[str]:
    with http_server(quorum_env) as base:
        yield base


@pytest.mark.slow
async def test_the_decision_api_and_knecht_approve_server_report_the_quorum(
    server: str, quorum_env: dict[str, str]
) -> None:
    import httpx

    [proposal_id] = await _stage(quorum_env, "two-api")
    async with httpx.AsyncClient(base_url=server, timeout=60) as http:
        first = await http.post(f"/api/proposals/{proposal_id}/approve", headers=_as(quorum_env, "alice"))
        assert first.status_code == 200, first.text
        assert first.json()["status"] == "pending" and first.json()["quorum"] == "1 of 2 approvals (alice)"
        again = await http.post(f"/api/proposals/{proposal_id}/approve", headers=_as(quorum_env, "Alice"))
        assert again.status_code == 409 and again.json()["error"]["code"] == "already_approved"

    remote = {**quorum_env, "KNECHT_SERVER_URL": server, "KNECHT_OPERATOR_TOKEN": _token(quorum_env, "bob")}
    direct = {**quorum_env, "KNECHT_OPERATOR_TOKEN": _token(quorum_env, "bob")}
    for command in (["list"], ["list", "--json"], ["show", str(proposal_id)], ["show", str(proposal_id), "--json"]):
        over_api, on_db = await acli("knecht-approve", remote, *command), await acli("knecht-approve", direct, *command)
        assert over_api.returncode == on_db.returncode == 0, over_api.stderr + on_db.stderr
        assert over_api.stdout == on_db.stdout and "1 of 2 approvals (alice)" in over_api.stdout
    approved = await acli("knecht-approve", remote, "approve", str(proposal_id))
    assert approved.returncode == 0 and "succeeded" in approved.stdout, approved.stderr
    assert await _effects(quorum_env["KNECHT_DATABASE_URL"]) == {"two-api": 1}


# --- the quorum is sealed ------------------------------------------------------------------------------


async def test_a_lowered_quorum_or_a_forged_approval_fails_the_seal(quorum_env: dict[str, str]) -> None:
    [lowered, forged] = await _stage(quorum_env, "two-lowered", "two-forged")
    db = await open_database(quorum_env["KNECHT_DATABASE_URL"], migrate=False)
    try:
        async with db.transaction() as tx:
            await tx.execute("UPDATE proposals SET approvers = 1, policy_reason = NULL WHERE id = ?", (lowered,))
            await tx.execute("INSERT INTO proposal_approvals (proposal_id, operator, person, approved_at, seal)"
                             " VALUES (?, 'mallory', 'mallory', ?, 'x')", (forged, timestamp()))
    finally:
        await db.close()
    for proposal_id in (lowered, forged):
        refused = await acli("knecht-approve", quorum_env, "approve", str(proposal_id), "--as", "bob")
        assert refused.returncode == 1 and "fails its seal" in refused.stderr
    assert await _effects(quorum_env["KNECHT_DATABASE_URL"]) == {}


def test_the_older_seal_text_is_exactly_as_before_and_the_current_one_binds_id_quorum_and_preview() -> None:
    call = dict(tool="t", action=None, arguments_json="{}", arguments_hash="h", arguments_shown="{}",
                subject="s", client="c", scopes=["a"], rule="r", created_at="1", expires_at="2")
    older = seal_text(proposal_id=None, **call)  # type: ignore[arg-type]
    assert older == '["t",null,"{}","h","{}","s","c",["a"],"r","1","2"]'  # one approver, no reason: as before quorums
    assert seal_text(proposal_id=None, **call, approvers=2) != older  # type: ignore[arg-type]
    assert seal_text(proposal_id=None, **call, policy_reason="why") != older  # type: ignore[arg-type]
    assert seal_text(proposal_id=None, **call, preview_json="{}") == older  # type: ignore[arg-type]

    current = seal_text(proposal_id=7, **call)  # type: ignore[arg-type]
    assert current == '["proposal",7,"t",null,"{}","h","{}","s","c",["a"],"r","1","2",1,null,null]'
    variants = {seal_text(proposal_id=8, **call), seal_text(proposal_id=7, **call, preview_json="{}"),  # type: ignore[arg-type]
                seal_text(proposal_id=7, **call, approvers=2), older}  # type: ignore[arg-type]
    assert current not in variants and len(variants) == 4


# --- the web page ----------------------------------------------------------------------------------------


async def test_the_web_page_shows_the_quorum_and_takes_one_approval_per_operator(
    demo_env: dict[str, str], token_settings: Any
) -> None:
    from mcp_knecht.core.auth import TokenVerifier
    from tests.web_support import OPERATOR, ORIGIN, csrf, field, pages, sign_in, stage

    Path(demo_env["KNECHT_CONFIG_DIR"], "policies.toml").write_text(
        '[[rules]]\ntool = "rerun_run"\ndecision = "approve"\napprovers = 2\nreason = "two people"\n')
    async with open_app(load_settings(env=demo_env), watch_policy=False) as app:
        proposal_id = await stage(app, "rerun_run", {"run_id": 11})
        for operator, expected, status in (("alice", "1 of 2 approvals (alice)", "pending"),
                                           ("bob", "2 of 2 approvals (alice, bob)", "succeeded")):
            async with pages(app, TokenVerifier(token_settings)) as browser:
                await sign_in(browser, app, operator, OPERATOR)
                page = (await browser.get(f"/proposals/{proposal_id}")).text
                assert "approvals" in page and "two people" in page
                done = await browser.post(f"/proposals/{proposal_id}", headers={"Origin": ORIGIN}, data={
                    "csrf_token": csrf(page), "decision": "approve", "expect_hash": field(page, "expect_hash")})
                assert done.status_code == 303, done.text
                assert expected in (await browser.get(f"/proposals/{proposal_id}")).text
            decided = await app.proposals.get(proposal_id)
            assert decided is not None and decided.status == status


class _SecondApprovalRightAfter:
    """The real repository; the moment an approval has been recorded and its turn is over, another
    operator's approval (through the real service) completes the quorum — what a racing operator can
    do at any moment."""

    def __init__(self, real: SqlProposalRepository, then: Any) -> None:
        self._real, self._then = real, then
        self._recorded = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    async def add_approval(self, *args: Any, **kwargs: Any) -> Any:
        outcome = await self._real.add_approval(*args, **kwargs)
        self._recorded = outcome.outcome == "recorded"
        return outcome

    @asynccontextmanager
    async def turn(self, proposal_id: int) -> AsyncIterator[Any]:
        async with self._real.turn(proposal_id) as turn:
            yield turn
        if self._recorded:
            await self._then()


async def test_an_approval_that_only_counted_is_told_so_even_when_another_completes_the_quorum_at_once(
    quorum_env: dict[str, str],
) -> None:
    from mcp_knecht.core.approval import ApprovalService, Operator

    [proposal_id] = await _stage(quorum_env, "two-race")
    async with open_app(load_settings(env=quorum_env), watch_policy=False) as app:
        carol = app.approvals.approve(proposal_id, Operator("carol"))
        racing = ApprovalService(_SecondApprovalRightAfter(app.proposals, lambda: carol),  # type: ignore[arg-type]
                                 app.gate, app.audit, app.keys)
        told = await racing.approve(proposal_id, Operator("bob"))
        assert told.status == "pending" and told.quorum == "1 of 2 approvals (local:bob)"
        now = await app.approvals.checked(proposal_id)
        assert now.status == "succeeded" and now.decided_by == "local:carol"
    assert await _effects(quorum_env["KNECHT_DATABASE_URL"]) == {"two-race": 1}


class _RowRewrittenBeforeTheClaim:
    """The real repository; between the operator's seal-checked read and the claim, someone with write
    access to the database swaps one of the proposal's sealed columns (keeping its seal, which they cannot forge)."""

    def __init__(self, real: SqlProposalRepository, db: Database, column: str, value: str) -> None:
        self._real, self._db, self._column, self._value = real, db, column, value

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    async def add_approval(self, proposal_id: int, *args: Any, **kwargs: Any) -> Any:
        async with self._db.transaction() as tx:
            await tx.execute(f"UPDATE proposals SET {self._column} = ? WHERE id = ?", (self._value, proposal_id))
        return await self._real.add_approval(proposal_id, *args, **kwargs)


@pytest.mark.parametrize(("column", "value"), [
    ("arguments_json", '{"label":"swapped"}'),
    ("preview_json", '{"label": "one-original", "note": "already recorded"}'),  # what the operator was shown
])
async def test_a_row_rewritten_between_the_operators_read_and_the_claim_is_not_claimed_and_runs_nothing(
    quorum_env: dict[str, str], column: str, value: str
) -> None:
    from mcp_knecht.core.approval import ApprovalService, Operator
    from mcp_knecht.errors import TamperedError

    [proposal_id] = await _stage(quorum_env, "one-original")
    async with open_app(load_settings(env=quorum_env), watch_policy=False) as app:
        racing = ApprovalService(_RowRewrittenBeforeTheClaim(app.proposals, app.db, column, value),  # type: ignore[arg-type]
                                 app.gate, app.audit, app.keys)
        with pytest.raises(TamperedError, match="fails its seal"):
            await racing.approve(proposal_id, Operator("bob"))
        state = await app.proposals.state(proposal_id)
        assert state is not None and state.status == "pending" and state.decided_by is None  # the claim rolled back
        approvals = await app.db.fetch_all("SELECT * FROM proposal_approvals WHERE proposal_id = ?", (proposal_id,))
        assert approvals == []
        tampered = await app.db.fetch_all(
            "SELECT subject, detail FROM audit_log WHERE proposal_id = ? AND outcome = 'tampered'", (proposal_id,))
        assert [(row["subject"], json.loads(row["detail"])["problem"]) for row in tampered] == [
            ("local:bob", "row changed before its claim")]
        with pytest.raises(TamperedError):  # and the row, as it now is, is refused by every later read
            await app.approvals.approve(proposal_id, Operator("carol"))
    assert await _effects(quorum_env["KNECHT_DATABASE_URL"]) == {}


class _PendingAgainAfterTheClaim:
    """The real repository; the first approval waits a moment inside the proposal's turn (so the others
    queue behind it), claims, and then the row is written back to pending, as someone with write access to
    the database could, before the turn passes on."""

    def __init__(self, real: SqlProposalRepository, db: Database) -> None:
        self._real, self._db = real, db
        self.claims = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    async def add_approval(self, proposal_id: int, *args: Any, **kwargs: Any) -> Any:
        await anyio.sleep(0.2)
        result = await self._real.add_approval(proposal_id, *args, **kwargs)
        if result.outcome == "claimed":
            self.claims += 1
            async with self._db.transaction() as tx:
                await tx.execute("UPDATE proposals SET status = 'pending', decided_by = NULL WHERE id = ?",
                                 (proposal_id,))
        return result


async def test_operators_queued_behind_a_claim_are_told_by_it_not_by_the_row_when_their_turn_comes(
    shared_env: dict[str, str],  # noqa: F811
) -> None:
    """Eight operators of one process race for one proposal: the seven queued behind the claim are told who
    claimed it without reading the row again (here it reads pending again), and it runs once. What the
    claim told them does not outlive the queue: a later operator is told what the row says then."""
    from mcp_knecht.core.approval import ApprovalService, Operator
    from mcp_knecht.errors import NotPendingError

    [proposal_id] = await _stage(shared_env, "queued")
    async with open_app(load_settings(env=shared_env), watch_policy=False) as app:
        repository = _PendingAgainAfterTheClaim(app.proposals, app.db)  # type: ignore[arg-type]
        racing = ApprovalService(repository, app.gate, app.audit, app.keys)  # type: ignore[arg-type]
        told: dict[str, str] = {}

        async def approve(name: str) -> None:
            try:
                decided = await racing.approve(proposal_id, Operator(name))
            except NotPendingError as exc:
                told[name] = exc.message
            else:
                told[name] = f"ran: {decided.status}"

        async with anyio.create_task_group() as tasks:
            for n in range(8):
                tasks.start_soon(approve, f"operator-{n}")
        assert repository.claims == 1
        [winner] = [name for name, message in told.items() if message.startswith("ran")]
        queued = [message for name, message in told.items() if name != winner]
        assert len(queued) == 7
        assert all(f"is not pending any more: executing (outcome unknown if the approver stopped) by local:{winner}"
                   in message for message in queued)
        async with app.db.transaction() as tx:
            await tx.execute("UPDATE proposals SET status = 'rejected', decided_by = 'eve' WHERE id = ?",
                             (proposal_id,))
        with pytest.raises(NotPendingError, match="rejected by eve"):
            await racing.approve(proposal_id, Operator("operator-9"))
    assert await _effects(shared_env["KNECHT_DATABASE_URL"]) == {"queued": 1}


# --- a proposal claimed once is never claimed again ------------------------------------------------

WRITTEN_BACK = ("UPDATE proposals SET status = 'pending', decided_by = NULL, decided_at = NULL, started_at = NULL,"
                " finished_at = NULL, result_json = NULL, error = NULL, reason = NULL WHERE id = ?")


async def _approval_refused_with_nothing_written(app: App, proposal_id: int, told: str, problem: str) -> None:
    """dave's approval of a proposal written back to pending: refused as tampered (`told`), audited once with
    `problem`, and neither the row nor the approvals changed."""
    from mcp_knecht.core.approval import Operator
    from mcp_knecht.errors import TamperedError

    with pytest.raises(TamperedError, match=told):
        await app.approvals.approve(proposal_id, Operator("dave"))
    state = await app.proposals.state(proposal_id)
    assert state is not None and state.status == "pending" and state.decided_by is None  # nothing written
    people = await app.db.fetch_all("SELECT person FROM proposal_approvals WHERE proposal_id = ?", (proposal_id,))
    assert "dave" not in {row["person"] for row in people}
    tampered = await app.db.fetch_all(
        "SELECT subject, detail FROM audit_log WHERE proposal_id = ? AND outcome = 'tampered'", (proposal_id,))
    assert [(row["subject"], json.loads(row["detail"])["problem"]) for row in tampered] == [("local:dave", problem)]


@pytest.mark.parametrize("also", ["nothing else", "its approvals", "its approved audit row"])
async def test_a_proposal_written_back_to_pending_after_it_ran_is_refused_not_run_again(
    quorum_env: dict[str, str], also: str,
) -> None:
    """Someone with write access to the database sets a finished proposal back to pending, as it was
    before its approval (the seal covers what runs, not the status). Another operator's approval of it
    is refused, audited and writes nothing: what the approvals recorded before, or the audit log's
    `approved` row, shows it was claimed once."""
    from mcp_knecht.core.approval import Operator

    [one, two] = await _stage(quorum_env, "one-again", "two-again")
    async with open_app(load_settings(env=quorum_env), watch_policy=False) as app:
        assert (await app.approvals.approve(one, Operator("bob"))).status == "succeeded"
        assert (await app.approvals.approve(two, Operator("bob"))).status == "pending"
        assert (await app.approvals.approve(two, Operator("carol"))).status == "succeeded"
        async with app.db.transaction() as tx:
            for proposal_id in (one, two):
                await tx.execute(WRITTEN_BACK, (proposal_id,))
                if also == "its approvals":
                    await tx.execute("DELETE FROM proposal_approvals WHERE proposal_id = ?", (proposal_id,))
                elif also == "its approved audit row":
                    await tx.execute("DELETE FROM audit_log WHERE proposal_id = ? AND outcome = 'approved'",
                                     (proposal_id,))
        for proposal_id in (one, two):
            shown = await app.approvals.checked(proposal_id)
            assert shown.status == "pending"  # what the row says; approving it is what is refused
            await _approval_refused_with_nothing_written(
                app, proposal_id, f"#{proposal_id} was approved and run before",
                "claimed before, status written back to pending")
    assert await _effects(quorum_env["KNECHT_DATABASE_URL"]) == {"one-again": 1, "two-again": 1}
    verified = await acli("mcp-knecht", quorum_env, "audit", "verify")
    assert (verified.returncode == 0) == (also != "its approved audit row"), verified.stdout + verified.stderr


async def test_a_proposal_written_back_to_pending_after_its_rejection_is_refused_not_run(
    quorum_env: dict[str, str],
) -> None:
    """A rejection is as final as a claim: someone with write access to the database sets a rejected
    proposal back to pending. Approving it is refused, audited and writes nothing, for a proposal that
    needed one approval and for one whose first approval was recorded before another operator rejected it
    (a second approval would complete that quorum)."""
    from mcp_knecht.core.approval import Operator

    [one, two] = await _stage(quorum_env, "one-rejected", "two-rejected")
    async with open_app(load_settings(env=quorum_env), watch_policy=False) as app:
        assert (await app.approvals.approve(two, Operator("bob"))).status == "pending"
        for proposal_id in (one, two):
            assert (await app.approvals.reject(proposal_id, Operator("carol"), "not now")).status == "rejected"
        async with app.db.transaction() as tx:
            for proposal_id in (one, two):
                await tx.execute(WRITTEN_BACK, (proposal_id,))
        for proposal_id in (one, two):
            assert (await app.approvals.checked(proposal_id)).status == "pending"  # what the row says
            await _approval_refused_with_nothing_written(
                app, proposal_id, f"#{proposal_id} was rejected before",
                "rejected before, status written back to pending")
    refused = await acli("knecht-approve", quorum_env, "approve", str(one), "--as", "erin")
    assert refused.returncode == 1 and "was rejected before" in refused.stderr
    assert await _effects(quorum_env["KNECHT_DATABASE_URL"]) == {}


async def test_an_approval_reads_its_own_proposals_audit_rows_however_long_the_log(database_url: str) -> None:
    """Whether a proposal was approved before is looked up among that proposal's own audit rows (the
    index by proposal), not by walking the log's `approved` rows in order until one is its: that made
    every decision slower by each decision before it. On SQLite with no planner statistics yet (a new
    store) and on PostgreSQL with them."""
    from mcp_knecht.store import quorum

    db = await open_database(database_url)
    try:
        async with db.transaction() as tx:
            await tx.execute_many(
                "INSERT INTO audit_log (id, at, source, subject, client, tool, outcome, proposal_id, prev_hash, hash)"
                " VALUES (?, ?, 'approval', 'bob', 'pytest', 'record_effect', ?, ?, '', '')",
                [(n, timestamp(), "approved" if n % 3 else "executed", n // 3) for n in range(1, 30_001)])
        if db.dialect == "postgresql":
            await db.fetch_all("ANALYZE audit_log")
        plan = " ".join(str(value) for row in await db.fetch_all(
            f"EXPLAIN {'QUERY PLAN ' if db.dialect == 'sqlite' else ''}{quorum.CLAIM_READ}", (5_000,))
            for value in row.values())
    finally:
        await db.close()
    assert "audit_by_outcome" not in plan, plan
    assert "audit_by_proposal" in plan, plan

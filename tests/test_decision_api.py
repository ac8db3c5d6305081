"""Operators decide as verified subjects: the decision API over HTTP, `knecht-approve --server`, and
the team setting after which nothing is decided without an operator token."""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from mcp_knecht.core.auth import TokenSettings, mint_token
from mcp_knecht.store import open_database
from tests.servers import http_server
from tests.staging import AGENT, acli
from tests.test_replicas import _client, _effects, replicas, shared_env  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

OPERATOR = ("proposals:decide", "proposals:read", "projects:read", "runs:read")


def _token(env: dict[str, str], subject: str, scopes: tuple[str, ...] = OPERATOR) -> str:
    return mint_token(TokenSettings(secret=env["KNECHT_JWT_SECRET"]), subject=subject, scopes=scopes)


def _as(env: dict[str, str], subject: str, scopes: tuple[str, ...] = OPERATOR) -> dict[str, str]:
    return {"Authorization": f"Bearer {_token(env, subject, scopes)}"}


@pytest.fixture
def server(shared_env: dict[str, str]) -> Iterator[str]:  # noqa: F811
    with http_server(shared_env) as base:
        yield base


async def _stage(base: str, env: dict[str, str], label: str, subject: str = "alice") -> int:
    async with _client(base, env, subject=subject) as client:
        staged = await client.call_tool("record_effect", {"label": label})
    assert not staged.is_error and staged.structured_content is not None, staged.content
    return int(staged.structured_content["id"])


async def test_the_decision_api_answers_each_case(server: str, shared_env: dict[str, str]) -> None:  # noqa: F811
    mine = await _stage(server, shared_env, "api-1")
    others = await _stage(server, shared_env, "api-2", subject="carol")
    async with httpx.AsyncClient(base_url=server, timeout=60) as http:
        nobody = await http.get("/api/proposals")
        assert nobody.status_code == 401 and nobody.json()["error"]["code"] == "unauthenticated"
        assert "token mint" in nobody.json()["error"]["message"]
        forged = await http.get("/api/proposals", headers={"Authorization": "Bearer not.a.jwt"})
        assert forged.status_code == 401

        alice = _as(shared_env, "alice", AGENT)
        listed = (await http.get("/api/proposals", headers=alice)).json()
        assert [p["id"] for p in listed["proposals"]] == [mine] and listed["next"] is None
        assert (await http.get(f"/api/proposals/{others}", headers=alice)).status_code == 404  # not hers
        assert (await http.get("/api/proposals/999999", headers=alice)).status_code == 404
        own = await http.post(f"/api/proposals/{mine}/approve", headers=alice)
        assert own.status_code == 403 and "proposals:decide" in own.json()["error"]["message"]

        bob = _as(shared_env, "bob")
        everything = (await http.get("/api/proposals?limit=1", headers=bob)).json()
        assert [p["id"] for p in everything["proposals"]] == [others] and everything["next"] == others
        assert (await http.get("/api/proposals?status=nonsense", headers=bob)).status_code == 400
        assert (await http.get("/api/proposals?limit=0", headers=bob)).status_code == 400
        shown = (await http.get(f"/api/proposals/{mine}", headers=bob)).json()
        assert shown["proposer"]["subject"] == "alice" and shown["arguments"] == {"label": "api-1"}
        assert len(shown["arguments_hash"]) == 64 and shown["status"] == "pending"

        bad_json = await http.post(f"/api/proposals/{mine}/approve", headers=bob, content=b"{nope")
        assert bad_json.status_code == 400
        unknown_field = await http.post(f"/api/proposals/{mine}/approve", headers=bob, json={"hash": "x"})
        assert unknown_field.status_code == 400
        short = await http.post(f"/api/proposals/{mine}/approve", headers=bob, json={"expect_hash": "ab"})
        assert short.status_code == 400
        wrong = await http.post(f"/api/proposals/{mine}/approve", headers=bob, json={"expect_hash": "0" * 12})
        assert wrong.status_code == 403 and wrong.json()["error"]["code"] == "hash_mismatch"

        approved = await http.post(f"/api/proposals/{mine}/approve", headers=bob,
                                   json={"expect_hash": shown["arguments_hash"][:12]})
        assert approved.status_code == 200, approved.text
        body = approved.json()
        assert body["status"] == "succeeded" and body["decided_by"] == "bob"
        again = await http.post(f"/api/proposals/{mine}/approve", headers=bob)
        assert again.status_code == 409 and "by bob" in again.json()["error"]["message"]

        # Self-approval is compared on the verified subject, case and whitespace ignored.
        carol_operator = _as(shared_env, " CAROL ")
        self_approval = await http.post(f"/api/proposals/{others}/approve", headers=carol_operator)
        assert self_approval.status_code == 403 and self_approval.json()["error"]["code"] == "self_approval"
        no_reason = await http.post(f"/api/proposals/{others}/reject", headers=bob, json={"reason": "  "})
        assert no_reason.status_code == 400
        rejected = await http.post(f"/api/proposals/{others}/reject", headers=bob, json={"reason": "not today"})
        assert rejected.status_code == 200 and rejected.json()["status"] == "rejected"
    assert await _effects(shared_env["KNECHT_DATABASE_URL"]) == {"api-1": 1}


async def test_knecht_approve_through_the_server_prints_what_the_direct_mode_prints(
    server: str, shared_env: dict[str, str]  # noqa: F811
) -> None:
    first = await _stage(server, shared_env, "cli-1")
    second = await _stage(server, shared_env, "cli-2")
    remote = {**shared_env, "KNECHT_SERVER_URL": server, "KNECHT_OPERATOR_TOKEN": _token(shared_env, "bob")}
    direct_list = await acli("knecht-approve", shared_env, "list", "--json")
    remote_list = await acli("knecht-approve", remote, "list", "--json")
    assert remote_list.returncode == direct_list.returncode == 0, remote_list.stderr
    assert json.loads(remote_list.stdout) == json.loads(direct_list.stdout)
    direct_show = await acli("knecht-approve", shared_env, "show", str(first))
    remote_show = await acli("knecht-approve", remote, "show", str(first))
    assert remote_show.stdout == direct_show.stdout and "cli-1" in remote_show.stdout

    approved = await acli("knecht-approve", remote, "approve", str(first))
    assert approved.returncode == 0 and f"Approved #{first}" in approved.stdout and "succeeded" in approved.stdout
    again = await acli("knecht-approve", remote, "approve", str(first))
    assert again.returncode == 1 and "not pending any more" in again.stderr and "bob" in again.stderr
    assert (await acli("knecht-approve", remote, "approve", "999999")).returncode == 1
    assert (await acli("knecht-approve", remote, "reject", str(second))).returncode == 2  # no --reason
    assert (await acli("knecht-approve", remote, "approve", str(second), "--as", "mallory")).returncode == 2
    no_token = {k: v for k, v in remote.items() if k != "KNECHT_OPERATOR_TOKEN"}
    missing = await acli("knecht-approve", no_token, "list")
    assert missing.returncode == 2 and "KNECHT_OPERATOR_TOKEN" in missing.stderr
    rejected = await acli("knecht-approve", remote, "reject", str(second), "--reason", "later", "--json")
    assert rejected.returncode == 0 and json.loads(rejected.stdout)["decided_by"] == "bob"


async def _rewrite_around_the_server(env: dict[str, str], *statements: tuple[str, tuple[object, ...]]) -> None:
    db = await open_database(env["KNECHT_DATABASE_URL"], migrate=False)
    try:
        async with db.transaction() as tx:
            for sql, params in statements:
                await tx.execute(sql, params)
    finally:
        await db.close()


COPIED = ("tool, action, arguments_json, arguments_hash, arguments_shown, proposer_subject, proposer_client,"
          " proposer_scopes, rule, preview_json, created_at, expires_at, seal, approvers, policy_reason")


async def test_a_proposal_rewritten_copied_or_unrejected_in_the_database_is_refused_over_the_api(
    server: str, shared_env: dict[str, str]  # noqa: F811
) -> None:
    """What the seal and the audit log refuse in process is refused the same over HTTP (409 `tampered`)
    and through `knecht-approve --server`: a preview rewritten, a call that ran copied into a new pending
    row, a rejected proposal written back to pending. Nothing runs again."""
    rewritten = await _stage(server, shared_env, "api-rewritten")
    ran = await _stage(server, shared_env, "api-ran")
    unrejected = await _stage(server, shared_env, "api-unrejected")
    bob = _as(shared_env, "bob")
    async with httpx.AsyncClient(base_url=server, timeout=60) as http:
        assert (await http.post(f"/api/proposals/{ran}/approve", headers=bob)).json()["status"] == "succeeded"
        refusal = await http.post(f"/api/proposals/{unrejected}/reject", headers=bob, json={"reason": "no"})
        assert refusal.json()["status"] == "rejected"
        await _rewrite_around_the_server(
            shared_env,
            ("UPDATE proposals SET preview_json = ? WHERE id = ?", ('{"label": "harmless"}', rewritten)),
            (f"INSERT INTO proposals ({COPIED}, status) SELECT {COPIED}, 'pending' FROM proposals WHERE id = ?",
             (ran,)),
            ("UPDATE proposals SET status = 'pending', decided_by = NULL, decided_at = NULL, reason = NULL"
             " WHERE id = ?", (unrejected,)))
        copy = max(p["id"] for p in (await http.get("/api/proposals", headers=bob)).json()["proposals"])
        assert copy > unrejected
        for proposal_id in (rewritten, copy):
            shown = await http.get(f"/api/proposals/{proposal_id}", headers=bob)
            assert shown.status_code == 409 and shown.json()["error"]["code"] == "tampered", shown.text
            assert "harmless" not in shown.text
        for proposal_id, told in ((rewritten, "fails its seal"), (copy, "fails its seal"),
                                  (unrejected, "was rejected before")):
            approved = await http.post(f"/api/proposals/{proposal_id}/approve", headers=bob)
            assert approved.status_code == 409 and approved.json()["error"]["code"] == "tampered", approved.text
            assert told in approved.json()["error"]["message"]
    remote = {**shared_env, "KNECHT_SERVER_URL": server, "KNECHT_OPERATOR_TOKEN": _token(shared_env, "carol")}
    again = await acli("knecht-approve", remote, "approve", str(copy))
    assert again.returncode == 1 and "fails its seal" in again.stderr
    assert await _effects(shared_env["KNECHT_DATABASE_URL"]) == {"api-ran": 1}


async def test_with_operator_auth_token_nothing_is_decided_without_a_verified_operator(
    server: str, shared_env: dict[str, str]  # noqa: F811
) -> None:
    proposal_id = await _stage(server, shared_env, "team-1")
    team = {**shared_env, "KNECHT_OPERATOR_AUTH": "token"}
    local = await acli("knecht-approve", team, "approve", str(proposal_id), "--as", "bob")
    assert local.returncode == 2 and "KNECHT_OPERATOR_TOKEN" in local.stderr
    alice_token = {**team, "KNECHT_OPERATOR_TOKEN": _token(shared_env, "alice")}
    own = await acli("knecht-approve", alice_token, "approve", str(proposal_id))
    assert own.returncode == 1 and "another operator" in own.stderr
    spoofed = await acli("knecht-approve", alice_token, "approve", str(proposal_id), "--as", "bob")
    assert spoofed.returncode == 2 and "cannot override" in spoofed.stderr
    agent_token = {**team, "KNECHT_OPERATOR_TOKEN": _token(shared_env, "dave", AGENT)}
    assert (await acli("knecht-approve", agent_token, "approve", str(proposal_id))).returncode == 2
    bob = {**team, "KNECHT_OPERATOR_TOKEN": _token(shared_env, "bob")}
    approved = await acli("knecht-approve", bob, "approve", str(proposal_id), "--json")
    assert approved.returncode == 0, approved.stderr
    assert json.loads(approved.stdout)["decided_by"] == "bob"


async def test_eight_operators_racing_over_http_on_two_replicas_execute_each_proposal_once(
    replicas: tuple[str, str], shared_env: dict[str, str]  # noqa: F811
) -> None:
    ids = [await _stage(replicas[n % 2], shared_env, f"race-{n}") for n in range(24)]
    wins: dict[int, list[str]] = {i: [] for i in ids}
    refused: list[int] = []

    async def operator(name: str) -> None:
        async with httpx.AsyncClient(timeout=120, headers=_as(shared_env, name)) as http:
            for proposal_id in random.sample(ids, len(ids)):
                base = random.choice(replicas)
                answer = await http.post(f"{base}/api/proposals/{proposal_id}/approve")
                if answer.status_code == 200:
                    wins[proposal_id].append(name)
                else:
                    refused.append(answer.status_code)

    with anyio.fail_after(240):
        async with anyio.create_task_group() as tasks:
            for n in range(8):
                tasks.start_soon(operator, f"operator-{n}")
    assert all(len(winners) == 1 for winners in wins.values()), wins
    assert set(refused) == {409} and len(refused) == 24 * 7
    assert await _effects(shared_env["KNECHT_DATABASE_URL"]) == {f"race-{n}": 1 for n in range(24)}


async def test_a_server_killed_while_operators_race_through_its_api_runs_nothing_twice(database_url: str) -> None:
    script = Path(__file__).resolve().parent.parent / "scripts" / "soak_server_kills.py"
    run = await anyio.run_process(
        [sys.executable, str(script), "--proposals", "200", "--clients", "4", "--kills", "3", "--db", database_url,
         "--json"], check=False)
    report = json.loads(run.stdout)
    assert report["killed"] == 3 and report["answers"]["asked_again"] > 0  # requests found no server
    assert (report["client_errors"], report["server_tracebacks"], report["last_approver"]) == ([], 0, "ok")
    assert report["told_succeeded"] > 0 and report["told_succeeded_but_not"] == 0
    assert report["double_executions"] == report["succeeded_without_effect"] == 0
    assert set(report["statuses"]) <= {"succeeded", "executing"}  # none pending, none failed (nothing was stopped)
    assert report["executing_left"] <= 3 * 4  # at most the decisions in flight when a server died
    assert report["claims_not_one"] == report["ran_without_claim_audited"] == 0
    assert report["audit_verified"] and report["integrity"] in ("ok", "not checked (PostgreSQL)")
    assert (report["ok"], run.returncode) == (True, 0), run.stderr.decode()[-2000:]

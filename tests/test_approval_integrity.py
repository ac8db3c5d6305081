"""Approved means exactly what runs: the state a preview showed is frozen; a proposal row rewritten in
the database is refused, not run; the audit chain cannot be truncated or recomputed unnoticed; the
same call is not proposed twice."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from mcp_knecht.app import App
from mcp_knecht.core.canonical import canonical_json
from mcp_knecht.core.proposal_watch import ProposalWatcher
from mcp_knecht.store.audit_log import verify_chain
from tests.knecht_harness import Knecht, build, call
from tests.staging import acli

pytestmark = pytest.mark.anyio


@pytest.fixture
async def kn(app: App) -> AsyncIterator[Knecht]:
    yield await build(app)


async def _new_version(kn: Knecht, workflow_id: int, marker: str) -> None:
    """Someone changes the workflow (through an approved update) while a proposal waits."""
    async with kn.connect(subject="carol") as other:
        current = (await call(other, "get_workflow", workflow=workflow_id)).structured_content
        changed = current["definition"] + "\n  - name: deploy-prod\n    run: ./deploy --prod  # " + marker + "\n"
        staged = (await call(other, "update_workflow", workflow=workflow_id, definition=changed)).structured_content
    assert (await kn.approve(staged["id"])).status == "succeeded"


async def _runs(kn: Knecht) -> int:
    row = await kn.app.db.fetch_one("SELECT COUNT(*) AS n FROM runs")
    assert row is not None
    return int(row["n"])


# --- 1. what runs is what was approved -------------------------------------------------------------


async def test_a_dispatch_runs_the_version_its_preview_showed_or_nothing(kn: Knecht) -> None:
    async with kn.connect() as client:
        staged = (await call(client, "dispatch_workflow", workflow="release", project="payments-api",
                             branch="main", inputs={"version": "v9.9.9"})).structured_content
    proposal = await kn.app.proposals.get(staged["id"])
    assert proposal is not None
    shown_version = proposal.arguments["workflow_version"]
    assert proposal.preview is not None and proposal.preview["version"] == shown_version
    assert "deploy-prod" not in proposal.preview["actions"]
    await _new_version(kn, proposal.arguments["workflow"], "dispatch")
    before = await _runs(kn)
    done = await kn.approve(staged["id"])
    assert done.status == "failed" and "changed since it was proposed" in (done.error or "")
    assert f"version {shown_version} was shown" in (done.error or "")
    assert await _runs(kn) == before  # nothing started, certainly not deploy-prod


async def test_a_rerun_runs_the_version_its_preview_showed_or_nothing(kn: Knecht) -> None:
    failed = await kn.app.db.fetch_one("SELECT id, workflow_id FROM runs WHERE status = 'failed' ORDER BY id LIMIT 1")
    assert failed is not None
    async with kn.connect() as client:
        staged = (await call(client, "rerun_run", run_id=failed["id"])).structured_content
    proposal = await kn.app.proposals.get(staged["id"])
    assert proposal is not None and proposal.preview is not None
    assert proposal.preview["will_run"]["workflow_version"] == proposal.arguments["workflow_version"]
    await _new_version(kn, failed["workflow_id"], "rerun")
    before = await _runs(kn)
    done = await kn.approve(staged["id"])
    assert done.status == "failed" and "changed since it was proposed" in (done.error or "")
    assert await _runs(kn) == before


@pytest.mark.parametrize("action", ["set", "delete"])
async def test_a_variable_change_runs_only_against_the_state_it_was_proposed_on(kn: Knecht, action: str) -> None:
    async with kn.connect() as client:
        plain = (await call(client, "project_variable", action="set", project="payments-api", name="FEATURE_X",
                            value="on")).structured_content
        assert (await kn.approve(plain["id"])).status == "succeeded"
        arguments: dict[str, Any] = {"action": action, "project": "payments-api", "name": "FEATURE_X"}
        if action == "set":
            arguments["value"] = "off"
        mine = (await call(client, "project_variable", **arguments)).structured_content
        # Meanwhile someone else changes the variable: the operator's preview no longer holds.
        theirs = (await call(client, "project_variable", action="set", project="payments-api", name="FEATURE_X",
                             value="partly")).structured_content
    assert (await kn.approve(theirs["id"], operator="dora")).status == "succeeded"
    done = await kn.approve(mine["id"])
    assert done.status == "failed" and "changed since it was proposed" in (done.error or "")
    row = await kn.app.db.fetch_one("SELECT value FROM project_variables WHERE name = 'FEATURE_X'")
    assert row == {"value": "partly"}  # no lost update


# --- 3. proposal rows are not trusted wholesale ----------------------------------------------------


async def _staged_rerun(kn: Knecht) -> int:
    failed = await kn.app.db.fetch_one("SELECT id FROM runs WHERE status = 'failed' ORDER BY id LIMIT 1")
    assert failed is not None
    async with kn.connect() as client:
        return int((await call(client, "rerun_run", run_id=failed["id"])).structured_content["id"])


REWRITES = {
    # The attacker rewrites the call and recomputes a plain hash so that `show` and the hash agree.
    "arguments and hash": lambda a: {
        "arguments_json": (text := a["arguments_json"].replace('"same_commit"', '"branch_head"')),
        "arguments_hash": hashlib.sha256(text.encode()).hexdigest(),
        "arguments_shown": text},
    "tool and action": lambda a: {"tool": "project_variable", "action": "delete"},
    "proposer scopes": lambda a: {"proposer_scopes": a["proposer_scopes"] + " variables:write admin:all"},
    "proposer": lambda a: {"proposer_subject": "ceo"},
}


@pytest.mark.parametrize("rewrite", list(REWRITES))
async def test_a_proposal_rewritten_in_the_database_is_refused_loudly_and_audited(
    kn: Knecht, demo_env: dict[str, str], rewrite: str
) -> None:
    proposal_id = await _staged_rerun(kn)
    row = await kn.app.db.fetch_one("SELECT * FROM proposals WHERE id = ?", (proposal_id,))
    assert row is not None
    changes = REWRITES[rewrite](row)
    async with kn.app.db.transaction() as tx:
        assignments = ", ".join(f"{column} = ?" for column in changes)
        await tx.execute(f"UPDATE proposals SET {assignments} WHERE id = ?", (*changes.values(), proposal_id))
    runs = await _runs(kn)
    shown = await acli("knecht-approve", demo_env, "show", str(proposal_id))
    assert shown.returncode == 1 and "fails its seal" in shown.stderr and shown.stdout == ""
    approved = await acli("knecht-approve", demo_env, "approve", str(proposal_id), "--as", "bob")
    assert approved.returncode == 1 and "fails its seal" in approved.stderr
    assert await _runs(kn) == runs
    stored = await kn.app.proposals.get(proposal_id)
    assert stored is not None and stored.status == "pending"  # not approved, not run
    tampered = await kn.app.db.fetch_all(
        "SELECT outcome FROM audit_log WHERE proposal_id = ? AND outcome = 'tampered'", (proposal_id,))
    assert len(tampered) == 2


async def test_a_proposal_whose_expiry_was_rewritten_as_bytes_reads_as_expired_and_breaks_no_other_read(
    kn: Knecht, demo_env: dict[str, str],
) -> None:
    """SQLite keeps a BLOB as bytes even in a TEXT column; compared with a timestamp it failed every read of
    that row: every listing holding it, and the watcher's first look, for good."""
    proposal_id = await _staged_rerun(kn)
    async with kn.app.db.transaction() as tx:
        await tx.execute("UPDATE proposals SET expires_at = x'00ff' WHERE id = ?", (proposal_id,))
    read = await kn.app.proposals.get(proposal_id)
    # Read as text, as SQL reads it (`expires_at || ''`): its bytes, before every timestamp.
    assert read is not None and read.status == "expired" and read.expires_at == "\x00\ufffd"
    assert proposal_id in {p.id for p in await kn.app.proposals.list(limit=100) if p.status == "expired"}
    assert proposal_id not in {p.id for p in await kn.app.proposals.list(status="pending", limit=100)}
    watcher = ProposalWatcher(kn.app.proposals, kn.app.changes)
    await watcher.poll()  # its first look reads every open proposal
    runs = await _runs(kn)
    approved = await acli("knecht-approve", demo_env, "approve", str(proposal_id), "--as", "bob")
    assert approved.returncode == 1 and "expired" in approved.stderr
    assert await _runs(kn) == runs
    again = await _staged_rerun(kn)  # the same call is staged anew, not joined to the one that reads expired
    assert again != proposal_id and (await _staged_rerun(kn)) == again
    assert (await kn.approve(again)).status == "succeeded" and await _runs(kn) == runs + 1
    assert again in {change.proposal_id for change in await watcher.poll()}  # and the watcher goes on telling


async def test_arguments_hashes_are_keyed_so_a_staged_value_cannot_be_guessed_offline(kn: Knecht) -> None:
    async with kn.connect() as client:
        staged = (await call(client, "project_variable", action="set", project="payments-api", name="DB_PASSWORD",
                             value="Summer2026!", secret=True)).structured_content
        seen = (await call(client, "get_proposal", id=staged["id"])).structured_content
    proposal = await kn.app.proposals.get(staged["id"])
    assert proposal is not None
    guess = json.loads(proposal.arguments_json)
    assert hashlib.sha256(canonical_json(guess).encode()).hexdigest() != seen["arguments_hash"]


# --- 4. the audit chain ----------------------------------------------------------------------------


async def _chain_of(kn: Knecht, calls: int = 12) -> None:
    async with kn.connect() as client:
        for _ in range(calls):
            await call(client, "list_projects")
    await kn.app.audit.flush()


@pytest.mark.parametrize("attack", ["edit a row", "delete a middle row", "delete the newest rows",
                                    "recompute the chain without the key"])
async def test_audit_verify_finds_every_kind_of_tampering(kn: Knecht, attack: str) -> None:
    await _chain_of(kn)
    assert await verify_chain(kn.app.db, kn.app.audit.chain) == []
    async with kn.app.db.transaction() as tx:
        if attack == "edit a row":
            await tx.execute("UPDATE audit_log SET outcome = 'denied' WHERE id = 5")
        elif attack == "delete a middle row":
            await tx.execute("DELETE FROM audit_log WHERE id = 6")
        elif attack == "delete the newest rows":
            await tx.execute("DELETE FROM audit_log WHERE id > 9")
        else:
            await _recompute_with_sha256(tx)
    problems = await verify_chain(kn.app.db, kn.app.audit.chain)
    assert problems, attack
    if attack == "delete the newest rows":
        assert any("newest rows were deleted" in p.problem for p in problems)


async def _recompute_with_sha256(tx: Any) -> None:
    """What someone with write access but without the key can do: edit, then rebuild every link."""
    columns = ("id", "at", "source", "subject", "client", "tool", "action", "outcome", "rule", "proposal_id",
               "arguments_hash", "detail", "duration_ms")
    rows = await tx.fetch_all(f"SELECT {', '.join(columns)} FROM audit_log ORDER BY id")
    prev = "0" * 64
    for row in rows:
        if row["id"] == 3:
            row["subject"] = "nobody"
        fields = {c: row[c] for c in columns}
        digest = hashlib.sha256((prev + canonical_json(fields)).encode()).hexdigest()
        await tx.execute("UPDATE audit_log SET subject = ?, prev_hash = ?, hash = ? WHERE id = ?",
                         (row["subject"], prev, digest, row["id"]))
        prev = digest
    await tx.execute("UPDATE audit_anchor SET head_hash = ? WHERE id = 1", (prev,))


async def test_audit_verify_on_the_command_line_exits_1_naming_the_rows(kn: Knecht, demo_env: dict[str, str]) -> None:
    await _chain_of(kn)
    async with kn.app.db.transaction() as tx:
        await tx.execute("DELETE FROM audit_log WHERE id > 10")
    verified = await acli("mcp-knecht", demo_env, "audit", "verify", "--json")
    assert verified.returncode == 1
    report = json.loads(verified.stdout)
    assert not report["ok"] and any("newest rows" in p["problem"] for p in report["problems"])


# --- 9. the same call is not proposed twice ----------------------------------------------------------


async def test_an_identical_pending_call_returns_the_existing_proposal(kn: Knecht) -> None:
    failed = await kn.app.db.fetch_one("SELECT id FROM runs WHERE status = 'failed' ORDER BY id LIMIT 1")
    assert failed is not None
    async with kn.connect() as client:
        first = await client.call_tool("rerun_run", {"run_id": failed["id"]})
        second = await client.call_tool("rerun_run", {"run_id": failed["id"]})
        other = await client.call_tool("rerun_run", {"run_id": failed["id"], "ref": "branch_head"})
    assert first.content[0].text.startswith("Submitted for approval (#")
    assert second.structured_content["id"] == first.structured_content["id"]
    assert second.content[0].text.startswith(f"Already pending approval (#{first.structured_content['id']})")
    assert other.structured_content["id"] != first.structured_content["id"] or (
        # branch_head may resolve to the very commit the run used: then it is the same call
        (await kn.app.proposals.get(first.structured_content["id"])).arguments  # type: ignore[union-attr]
        == (await kn.app.proposals.get(other.structured_content["id"])).arguments)  # type: ignore[union-attr]
    assert len(await kn.app.proposals.list(status="pending")) <= 2
    async with kn.connect(subject="carol") as carol:
        hers = await carol.call_tool("rerun_run", {"run_id": failed["id"]})
    assert hers.structured_content["id"] != first.structured_content["id"]  # another proposer's is their own
    await kn.app.audit.flush()
    staged = await kn.app.db.fetch_all("SELECT detail FROM audit_log WHERE outcome = 'staged' ORDER BY id")
    assert sum('"already_pending": true' in row["detail"] for row in staged) == 1

"""A proposal's row written around the store with a value of a kind mcp-knecht never writes — bytes, a
seal beyond ASCII, text that is no JSON where JSON belongs, a quorum size that is no number — fails no
read but its own: the agent's listing and reads, the operators' listing (in process and `knecht-approve
list`) and the watcher go on for everyone. A sealed value so changed (the preview an operator reads is
one) is refused as any rewritten row is (audited, never run); an unsealed one is shown as it was stored.
So is a sealed row copied into another: the seal binds the proposal's id.
An audit row so written is named by `audit verify`, which goes on, and listed by `audit list`; a
notification so written stops no other. On both stores, where the store takes the value at all."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from contextlib import closing
from pathlib import Path

import pytest

from mcp_knecht import testing
from mcp_knecht.app import App, open_app
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.proposal_watch import ProposalWatcher
from mcp_knecht.core.settings import load_settings
from mcp_knecht.errors import TamperedError
from mcp_knecht.notify import outbox
from mcp_knecht.store.audit_log import verify_chain
from tests.receivers import WebhookReceiver
from tests.staging import AGENT, acli
from tests.test_notify_delivery import FAST, cli_app, configure, deliveries, stage, worker_for

pytestmark = pytest.mark.anyio

TWO_PEOPLE = '[[rules]]\ntool = "record_effect"\nwhen = { label = "two-*" }\ndecision = "approve"\napprovers = 2\n'

# (column, SQL literal, the stores that take it). SQLite keeps a BLOB as bytes in any column and text in an
# INTEGER column; PostgreSQL's typed columns refuse both.
SEALED = {
    "seal beyond ASCII": ("seal", "'é'", ("sqlite", "postgresql")),
    "arguments shown that are no JSON": ("arguments_shown", "'garbage'", ("sqlite", "postgresql")),
    "arguments that are no JSON": ("arguments_json", "'garbage'", ("sqlite", "postgresql")),
    "preview showing another state": ("preview_json", """'{"label": "rewritten", "note": "already recorded"}'""",
                                      ("sqlite", "postgresql")),
    "preview that is no JSON": ("preview_json", "'garbage'", ("sqlite", "postgresql")),
    "preview removed": ("preview_json", "NULL", ("sqlite", "postgresql")),
    "seal as bytes": ("seal", "x'00ff'", ("sqlite",)),
    "tool as bytes": ("tool", "x'00ff'", ("sqlite",)),
    "scopes as bytes": ("proposer_scopes", "x'00ff'", ("sqlite",)),
    "staging time as bytes": ("created_at", "x'00ff'", ("sqlite",)),
}

SQLITE_ONLY = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


@pytest.fixture
async def staged(staged_env: dict[str, str]) -> AsyncIterator[App]:
    from tests.toolsets import EFFECTS_TABLE

    Path(staged_env["KNECHT_CONFIG_DIR"], "policies.toml").write_text(TWO_PEOPLE, encoding="utf-8")
    async with open_app(load_settings(env=staged_env)) as running:
        async with running.db.transaction() as tx:
            await tx.execute(EFFECTS_TABLE)
        yield running


async def _stage(app: App, label: str) -> int:
    staged = await app.gate.call_tool(Actor("alice", "pytest", frozenset(AGENT)), "record_effect", {"label": label})
    return int(staged.data["id"])  # type: ignore[index]


async def _rewrite(app: App, table: str, column: str, literal: str, where: str, key: int) -> None:
    async with app.db.transaction() as tx:
        await tx.execute(f"UPDATE {table} SET {column} = {literal} WHERE {where} = ?", (key,))


async def _effects(app: App) -> list[str]:
    return [row["label"] for row in await app.db.fetch_all("SELECT label FROM test_effects ORDER BY label")]


async def _every_reader_goes_on(app: App, env: dict[str, str], *ids: int) -> None:
    async with testing.connect(app, testing.actor("alice", AGENT)) as client:
        listed = await client.call_tool("list_proposals", {})
        assert not listed.is_error, listed.content
        assert set(ids) <= {p["id"] for p in listed.structured_content["proposals"]}  # type: ignore[index]
        for proposal_id in ids:
            read = await client.call_tool("get_proposal", {"id": proposal_id})
            assert not read.is_error, read.content
    assert set(ids) <= {p.id for p in await app.proposals.list(limit=100)}
    await ProposalWatcher(app.proposals, app.changes).poll()  # its first look reads every open proposal
    listing = await acli("knecht-approve", env, "list")
    assert listing.returncode == 0, listing.stderr


async def _tampered(app: App, proposal_id: int) -> int:
    rows = await app.db.fetch_all("SELECT id FROM audit_log WHERE proposal_id = ? AND outcome = 'tampered'",
                                  (proposal_id,))
    return len(rows)


@pytest.mark.parametrize(("database_url", "case"), [(store, case) for case, (_, _, stores) in SEALED.items()
                                                    for store in stores], indirect=["database_url"])
async def test_a_sealed_value_of_another_kind_is_refused_as_tampered_and_breaks_no_read(
    staged: App, staged_env: dict[str, str], case: str
) -> None:
    column, literal, _ = SEALED[case]
    rewritten, beside = await _stage(staged, "rewritten"), await _stage(staged, "beside")
    await _rewrite(staged, "proposals", column, literal, "id", rewritten)

    await _every_reader_goes_on(staged, staged_env, rewritten, beside)
    with pytest.raises(TamperedError, match="fails its seal"):
        await testing.approve(staged, rewritten)
    assert await _tampered(staged, rewritten) == 1
    assert (await testing.approve(staged, beside)).status == "succeeded"
    assert await _effects(staged) == ["beside"]  # the rewritten one never ran


@SQLITE_ONLY  # PostgreSQL's text columns hold no bytes
@pytest.mark.parametrize("column", ["seal", "approved_at", "operator"])
async def test_an_approval_rewritten_as_bytes_is_refused_as_tampered(
    staged: App, staged_env: dict[str, str], column: str
) -> None:
    proposal_id = await _stage(staged, "two-keys")
    assert len((await testing.approve(staged, proposal_id, "bob")).approvals) == 1
    await _rewrite(staged, "proposal_approvals", column, "x'00ff'", "proposal_id", proposal_id)
    await _every_reader_goes_on(staged, staged_env, proposal_id)
    with pytest.raises(TamperedError):
        await testing.approve(staged, proposal_id, "carol")
    assert await _effects(staged) == []


@SQLITE_ONLY  # PostgreSQL's integer column holds numbers only
@pytest.mark.parametrize("size", ["'garbage'", "x'00ff'"])
async def test_a_quorum_size_that_is_no_number_reads_as_one_and_the_seal_decides(
    staged: App, staged_env: dict[str, str], size: str
) -> None:
    one, two = await _stage(staged, "one-key"), await _stage(staged, "two-keys")
    for proposal_id in (one, two):
        await _rewrite(staged, "proposals", "approvers", size, "id", proposal_id)
    await _every_reader_goes_on(staged, staged_env, one, two)
    assert (await testing.approve(staged, one)).status == "succeeded"  # it needed one, and still does
    with pytest.raises(TamperedError):  # it needed two: one approval does not run it
        await testing.approve(staged, two)
    assert await _effects(staged) == ["one-key"]


async def test_a_preview_rewritten_is_refused_before_it_is_shown(staged: App, staged_env: dict[str, str]) -> None:
    proposal_id = await _stage(staged, "rewritten")
    await _rewrite(staged, "proposals", "preview_json", """'{"label": "rewritten", "note": "harmless"}'""", "id",
                   proposal_id)
    shown = await acli("knecht-approve", staged_env, "show", str(proposal_id))
    assert shown.returncode == 1 and "fails its seal" in shown.stderr and "harmless" not in shown.stdout
    assert await _tampered(staged, proposal_id) == 1
    approving = await acli("knecht-approve", staged_env, "approve", str(proposal_id))
    assert approving.returncode == 1 and "fails its seal" in approving.stderr
    assert await _effects(staged) == []


async def _seal_as_before_this_release(app: App, proposal_id: int) -> None:
    proposal = await app.proposals.get(proposal_id)
    assert proposal is not None and proposal.preview_json is not None
    assert app.keys.mac("seal", proposal.seal_text()) == proposal.seal  # staged now: the preview is sealed
    await _rewrite(app, "proposals", "seal", f"'{app.keys.mac('seal', proposal.seal_text(older=True))}'",
                   "id", proposal_id)


async def test_a_proposal_sealed_as_before_this_release_still_runs_and_shows_its_preview_as_stored(
    staged: App, staged_env: dict[str, str]
) -> None:
    older, rewritten = await _stage(staged, "older"), await _stage(staged, "rewritten")
    for proposal_id in (older, rewritten):
        await _seal_as_before_this_release(staged, proposal_id)
    await _rewrite(staged, "proposals", "preview_json", "'garbage'", "id", rewritten)

    await _every_reader_goes_on(staged, staged_env, older, rewritten)
    rewritten_read = await staged.proposals.get(rewritten)
    assert rewritten_read is not None and rewritten_read.document()["preview"] == {"unreadable": "garbage"}
    shown = await acli("knecht-approve", staged_env, "show", str(rewritten))
    assert shown.returncode == 0 and "garbage" in shown.stdout, shown.stderr
    assert (await testing.approve(staged, older)).status == "succeeded"
    assert (await testing.approve(staged, rewritten)).status == "succeeded"  # its seal never covered the preview
    assert await _effects(staged) == ["older", "rewritten"]
    assert await _tampered(staged, older) == await _tampered(staged, rewritten) == 0


async def test_a_result_that_is_no_json_is_shown_as_it_was_stored(staged: App, staged_env: dict[str, str]) -> None:
    done = await _stage(staged, "done")
    assert (await testing.approve(staged, done)).status == "succeeded"
    await _rewrite(staged, "proposals", "result_json", "'[1, 2]'", "id", done)

    await _every_reader_goes_on(staged, staged_env, done)
    async with testing.connect(staged, testing.actor("alice", AGENT)) as client:
        read = await client.call_tool("get_proposal", {"id": done})
    assert read.structured_content is not None and read.structured_content["result"] == {"unreadable": "[1, 2]"}


# --- sealed rows copied -----------------------------------------------------------------------------
# A proposal's seal is bound to its id. Before, a sealed row copied into another held its seal: a call that
# had run, staged again as a new pending row, ran a second time once approved.

SEALED_COLUMNS = ("tool", "action", "arguments_json", "arguments_hash", "arguments_shown", "proposer_subject",
                  "proposer_client", "proposer_scopes", "rule", "preview_json", "created_at", "expires_at", "seal",
                  "approvers", "policy_reason")


async def _copy_into_a_new_row(app: App, proposal_id: int) -> int:
    columns = ", ".join(SEALED_COLUMNS)
    async with app.db.transaction() as tx:
        row = await tx.fetch_one(f"INSERT INTO proposals ({columns}, status) SELECT {columns}, 'pending'"
                                 " FROM proposals WHERE id = ? RETURNING id", (proposal_id,))
    assert row is not None
    return int(row["id"])


async def _copy_onto(app: App, source: int, target: int) -> None:
    source_row = await app.db.fetch_one(f"SELECT {', '.join(SEALED_COLUMNS)} FROM proposals WHERE id = ?", (source,))
    assert source_row is not None
    async with app.db.transaction() as tx:
        await tx.execute(f"UPDATE proposals SET {', '.join(f'{c} = ?' for c in SEALED_COLUMNS)} WHERE id = ?",
                         (*source_row.values(), target))


async def test_a_call_that_ran_copied_into_a_new_pending_row_does_not_run_again(
    staged: App, staged_env: dict[str, str]
) -> None:
    ran = await _stage(staged, "once")
    assert (await testing.approve(staged, ran)).status == "succeeded"
    copy = await _copy_into_a_new_row(staged, ran)
    with pytest.raises(TamperedError, match="fails its seal"):
        await testing.approve(staged, copy)
    shown = await acli("knecht-approve", staged_env, "show", str(copy))
    assert shown.returncode == 1 and "fails its seal" in shown.stderr and shown.stdout == ""
    assert await _effects(staged) == ["once"]
    assert await _tampered(staged, copy) == 2 and await _tampered(staged, ran) == 0
    state = await staged.proposals.state(copy)
    assert state is not None and state.status == "pending"  # refused, nothing written to it


async def test_one_proposals_call_put_into_anothers_row_does_not_run(
    staged: App, staged_env: dict[str, str]
) -> None:
    harmless, dangerous = await _stage(staged, "harmless"), await _stage(staged, "dangerous")
    rejected = await acli("knecht-approve", staged_env, "reject", str(dangerous), "--reason", "no", "--as", "bob")
    assert rejected.returncode == 0, rejected.stderr
    await _copy_onto(staged, dangerous, harmless)
    approved = await acli("knecht-approve", staged_env, "approve", str(harmless), "--as", "bob")
    assert approved.returncode == 1 and "fails its seal" in approved.stderr
    assert await _effects(staged) == []
    assert await _tampered(staged, harmless) == 1


async def test_a_proposal_staged_now_is_sealed_under_its_own_id(staged: App) -> None:
    first, second = await _stage(staged, "first"), await _stage(staged, "second")
    for proposal_id in (first, second):
        proposal = await staged.proposals.get(proposal_id)
        assert proposal is not None and proposal.seal == staged.keys.mac("seal", proposal.seal_text())
        assert proposal.seal_text().startswith(f'["proposal",{proposal_id},')
    assert (await testing.approve(staged, second)).status == "succeeded"


# --- the audit log ---------------------------------------------------------------------------------

AUDIT_CASES = [("sqlite", "subject", "x'00ff'"), ("sqlite", "prev_hash", "x'00ff'"),
               ("sqlite", "detail", "'garbage'"), ("postgresql", "detail", "'garbage'")]


@pytest.mark.parametrize(("database_url", "column", "literal"), AUDIT_CASES, indirect=["database_url"])
async def test_an_audit_row_written_with_a_value_of_another_kind_is_named_by_verify_and_still_listed(
    staged: App, staged_env: dict[str, str], column: str, literal: str
) -> None:
    await _stage(staged, "first")
    await _stage(staged, "second")
    await _rewrite(staged, "audit_log", column, literal, "id", 1)

    assert {problem.id for problem in await verify_chain(staged.db, staged.audit.chain)} == {1}
    verified = await acli("mcp-knecht", staged_env, "audit", "verify", "--json")
    assert verified.returncode == 1, verified.stderr
    assert {problem["id"] for problem in json.loads(verified.stdout)["problems"]} == {1}
    listed = await acli("mcp-knecht", staged_env, "audit", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["id"]: row for row in json.loads(listed.stdout)}
    assert set(rows) == {1, 2}
    if column == "detail":
        assert rows[1]["detail"] == {"unreadable": "garbage"}
    assert (await acli("mcp-knecht", staged_env, "audit", "list")).returncode == 0


# --- notifications ---------------------------------------------------------------------------------


@pytest.mark.parametrize("when", ["before routing", "before delivery"])
async def test_an_event_whose_facts_are_no_json_stops_no_other_notification(
    staged_env: dict[str, str], webhook_receiver: WebhookReceiver, when: str
) -> None:
    """Before, the oldest events were routed (and claimed) first in every round: one such event failed every
    round that held it, so no notification went out again."""
    env = configure(staged_env, FAST, webhook_receiver)
    async with cli_app(env) as app, worker_for(app, env) as worker:
        rewritten, beside = await stage(app, "rewritten"), await stage(app, "beside")
        if when == "before delivery":
            assert await outbox.route(app.db, worker._router) == 2
        await _rewrite(app, "notify_outbox", "payload_json", "'garbage'", "proposal_id", rewritten)
        await worker.run_once()
        await worker.run_once()
        statuses = {row["proposal_id"]: row["status"] for row in await deliveries(app)}
    [told] = await webhook_receiver.wait_for(1)
    assert told.payload["data"]["id"] == beside and statuses[beside] == "delivered"
    assert statuses[rewritten] != "delivered"  # its message cannot be made: it fails alone, and gives up


def _sqlite_shell(env: dict[str, str]) -> closing[sqlite3.Connection]:
    """A connection as SQLite's own shell opens one: it does not enforce foreign keys."""
    return closing(sqlite3.connect(env["KNECHT_DATABASE_URL"].removeprefix("sqlite:///"), isolation_level=None))


@SQLITE_ONLY  # PostgreSQL enforces the foreign key for every writer
@pytest.mark.parametrize("change", [
    "DELETE FROM notify_outbox WHERE proposal_id = ?",
    "UPDATE notify_deliveries SET event_id = 'garbage' WHERE event_id = (SELECT id FROM notify_outbox"
    " WHERE proposal_id = ?)",
    "UPDATE notify_deliveries SET event_id = 999999 WHERE event_id = (SELECT id FROM notify_outbox"
    " WHERE proposal_id = ?)",
])
async def test_a_delivery_whose_event_is_gone_is_given_up_and_stops_no_other_notification(
    staged_env: dict[str, str], webhook_receiver: WebhookReceiver, change: str
) -> None:
    """Before, the claim read each delivery's event by its id and raised for one it did not find: the
    delivery stayed due, was claimed first again in every round, and no notification went out again."""
    env = configure(staged_env, FAST, webhook_receiver)
    async with cli_app(env) as app, worker_for(app, env) as worker:
        rewritten, beside = await stage(app, "rewritten"), await stage(app, "beside")
        assert await outbox.route(app.db, worker._router) == 2
        with _sqlite_shell(env) as shell:
            shell.execute(change, (rewritten,))
        await worker.run_once()
        await worker.run_once()
        statuses = {row["proposal_id"]: row["status"] for row in await deliveries(app)}
        given_up = await app.db.fetch_all("SELECT status, last_error FROM notify_deliveries WHERE event_id NOT IN"
                                          " (SELECT id FROM notify_outbox)")
    [told] = await webhook_receiver.wait_for(1)
    assert told.payload["data"]["id"] == beside and statuses == {beside: "delivered"}
    assert given_up == [{"status": "failed", "last_error": outbox.NO_EVENT}]
    shown = await acli("mcp-knecht", env, "notify", "status", "--json")
    assert shown.returncode == 0, shown.stderr


@SQLITE_ONLY  # PostgreSQL's text columns hold no bytes
@pytest.mark.parametrize("column", ["last_error", "destination", "status"])
async def test_the_outbox_status_shows_a_delivery_rewritten_as_bytes(
    staged_env: dict[str, str], webhook_receiver: WebhookReceiver, column: str
) -> None:
    env = configure(staged_env, FAST, webhook_receiver)
    async with cli_app(env) as app, worker_for(app, env) as worker:
        await stage(app, "rewritten")
        assert await outbox.route(app.db, worker._router) == 1
    with _sqlite_shell(env) as shell:  # the status column's CHECK binds the shell too: switched off here
        shell.execute("PRAGMA ignore_check_constraints = ON")
        shell.execute(f"UPDATE notify_deliveries SET attempts = 2, {column} = x'00ff'")
    for arguments in (("--json",), ()):
        shown = await acli("mcp-knecht", env, "notify", "status", *arguments)
        assert shown.returncode == 0, shown.stderr
    report = json.loads((await acli("mcp-knecht", env, "notify", "status", "--json")).stdout)
    shown_values = [*report["deliveries"][0].values(), *(report["problems"][0].values() if report["problems"] else ())]
    assert "\x00\ufffd" in shown_values

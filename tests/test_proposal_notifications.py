"""Agents are told when their proposal is decided: a resource per proposal and a notification
on change, on both protocol versions. Only the proposer may read or subscribe."""

from __future__ import annotations

import itertools
import json
import warnings
from datetime import timedelta
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from mcp_knecht.app import App
from mcp_knecht.core.actor import Actor
from mcp_knecht.store.changes import MAX_KEYS
from mcp_knecht.transports.mcp_server import server_for_app
from tests.staging import AGENT, acli

pytestmark = pytest.mark.anyio


@pytest.fixture
def app(staged_app: App) -> App:
    return staged_app


_labels = itertools.count()


async def stage(app: App, subject: str = "alice") -> int:
    """A new pending proposal (each with its own label: an identical pending one would be reused)."""
    result = await app.gate.call_tool(Actor(subject, "pytest", frozenset(AGENT)), "record_effect",
                                      {"label": f"x{next(_labels)}"})
    return int(result.data["id"])  # type: ignore[index]


async def test_a_listening_agent_is_told_when_its_proposal_is_decided(app: App, staged_env) -> None:  # type: ignore[no-untyped-def]
    proposal_id = await stage(app)
    uri = f"knecht://proposals/{proposal_id}"
    alice = Actor("alice", "pytest", frozenset(AGENT))
    async with Client(server_for_app(app, lambda ctx: alice)) as client:
        contents = (await client.read_resource(uri)).contents[0]
        assert json.loads(contents.text)["status"] == "pending"  # type: ignore[union-attr]
        async with client.listen(resource_subscriptions=[uri]) as subscription:
            approved = await acli("knecht-approve", staged_env, "approve", str(proposal_id), "--as", "bob")
            assert approved.returncode == 0, approved.stderr
            decided = anyio.current_time()
            with anyio.fail_after(10):
                event = await subscription.__anext__()
            pushed_after = anyio.current_time() - decided
        assert event.uri == uri
        if app.db.dialect == "postgresql":  # NOTIFY, not the 5-second look, brought it
            assert pushed_after < 4.0
        assert json.loads((await client.read_resource(uri)).contents[0].text)["status"] == "succeeded"  # type: ignore[union-attr]


async def test_a_legacy_subscriber_gets_resources_updated(app: App, staged_env) -> None:  # type: ignore[no-untyped-def]
    proposal_id = await stage(app)
    uri = f"knecht://proposals/{proposal_id}"
    received: list[Any] = []
    updated = anyio.Event()

    async def on_message(message: Any) -> None:
        params = getattr(getattr(message, "root", message), "params", None)
        if getattr(params, "uri", None) is not None:
            received.append(str(params.uri))
            updated.set()

    alice = Actor("alice", "pytest", frozenset(AGENT))
    async with Client(server_for_app(app, lambda ctx: alice), mode="legacy", message_handler=on_message) as client:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # resources/subscribe is deprecated in 2026-07-28, alive in 2025-11-25
            await client.subscribe_resource(uri)
        rejected = await acli("knecht-approve", staged_env, "reject", str(proposal_id), "--as", "bob",
                              "--reason", "no")
        assert rejected.returncode == 0, rejected.stderr
        with anyio.fail_after(10):
            await updated.wait()
    assert received == [uri]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_another_subjects_proposal_cannot_be_read_or_subscribed(app: App, mode: str) -> None:
    proposal_id = await stage(app, subject="alice")
    mallory = Actor("mallory", "pytest", frozenset(AGENT))
    async with Client(server_for_app(app, lambda ctx: mallory), mode=mode) as client:
        for uri in (f"knecht://proposals/{proposal_id}", "knecht://proposals/999999", "knecht://proposals/x'--"):
            with pytest.raises(MCPError, match="Unknown resource"):
                await client.read_resource(uri)
        if mode == "auto":
            with pytest.raises(MCPError, match="Unknown resource"):
                async with client.listen(resource_subscriptions=[f"knecht://proposals/{proposal_id}"]):
                    pass
        assert (await client.list_resources()).resources == []


async def test_the_watcher_announces_changes_after_its_start_not_history(app: App) -> None:
    from mcp_knecht.core.approval import Operator
    from mcp_knecht.core.proposal_watch import ProposalWatcher, StatusChange

    decided_before = await stage(app)
    await app.approvals.reject(decided_before, Operator("bob"), "old")
    still_open = await stage(app)
    heard: list[StatusChange] = []

    async def listen(change: StatusChange) -> None:
        heard.append(change)

    watcher = ProposalWatcher(app.proposals, app.changes)
    watcher.subscribe(listen)
    assert await watcher.poll() == [] and heard == []  # history is not news

    approvals = app.approvals
    await approvals.approve(still_open, Operator("bob"))
    quick = await stage(app)
    await approvals.reject(quick, Operator("bob"), "staged and decided between two looks")
    await watcher.poll()
    assert {(c.proposal_id, c.status, c.subject) for c in heard} == {
        (still_open, "succeeded", "alice"), (quick, "rejected", "alice")}
    assert await watcher.poll() == []


async def test_the_watcher_reads_only_the_proposals_that_moved(app: App) -> None:
    """Polled twice a second on SQLite: thousands of waiting proposals must not cost a row each."""
    from mcp_knecht.core.approval import Operator

    waiting = [await stage(app) for _ in range(5)]
    rejected, overdue = waiting[1], waiting[3]
    await app.approvals.reject(rejected, Operator("bob"), "no")
    async with app.db.transaction() as tx:  # its time has passed (no sweep has written `expired` yet)
        await tx.execute("UPDATE proposals SET expires_at = ? WHERE id = ?", ("2000-01-01T00:00:00.000000Z", overdue))
    assert await app.proposals.settled([*waiting, 10_000_000]) == {
        rejected: ("rejected", "alice"), overdue: ("expired", "alice")}


class _CountingReads:
    """The real repository, counting which open proposals each look asks `settled` about."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.asked: list[list[int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    async def settled(self, ids: Any) -> Any:
        self.asked.append(sorted(ids))
        return await self._real.settled(ids)


async def test_a_look_at_the_proposals_the_store_named_reads_only_those(app: App) -> None:
    """On PostgreSQL a NOTIFY names the proposal that moved: the watcher reads it alone, not every open one
    (a decision cost a read of them all, twice); a look at everything still finds the rest."""
    from mcp_knecht.core.approval import Operator
    from mcp_knecht.core.proposal_watch import ProposalWatcher

    waiting = [await stage(app) for _ in range(4)]
    reads = _CountingReads(app.proposals)
    watcher = ProposalWatcher(reads, app.changes)  # type: ignore[arg-type]
    await watcher.poll()
    reads.asked.clear()
    await app.approvals.approve(waiting[0], Operator("bob"))
    await app.approvals.reject(waiting[2], Operator("bob"), "not now")
    named = await watcher.poll(frozenset({waiting[0], 10_000_000}))
    assert [(c.proposal_id, c.status) for c in named] == [(waiting[0], "succeeded")]
    assert reads.asked == [[waiting[0]]]
    assert await watcher.poll(frozenset({waiting[0]})) == [] and reads.asked == [[waiting[0]]]  # settled: gone
    newer = await stage(app)
    await app.approvals.reject(newer, Operator("bob"), "staged and decided between two looks")
    assert [(c.proposal_id, c.status) for c in await watcher.poll(frozenset({newer}))] == [(newer, "rejected")]
    everything = await watcher.poll()
    assert [(c.proposal_id, c.status) for c in everything] == [(waiting[2], "rejected")]
    assert reads.asked[-1] == [waiting[1], waiting[2], waiting[3]]


async def test_the_change_feed_names_the_proposals_that_moved(app: App) -> None:
    """PostgreSQL names them in its NOTIFY; SQLite by the outbox rows each change writes in its own transaction."""
    from mcp_knecht.core.approval import Operator

    proposal_id = await stage(app)
    async with app.changes.watching("proposals") as wakeups:
        await app.approvals.reject(proposal_id, Operator("bob"), "no")
        with anyio.fail_after(5):
            while not await wakeups.wait(1.0):
                pass
        assert wakeups.keys == {proposal_id}

        async def announced(*statements: str) -> frozenset[int] | None:
            async with app.db.transaction() as tx:
                for sql in statements:
                    await tx.execute(sql)
            await anyio.sleep(0.3)  # every notification of the commit arrives before the one wait that takes them
            assert await wakeups.wait(1.0)
            return wakeups.keys

        if app.db.dialect == "postgresql":
            def notify(count: int) -> str:
                return f"SELECT pg_notify('knecht_proposals', n::text) FROM generate_series(1, {count}) n"

            assert await announced(notify(3)) == {1, 2, 3}
            assert await announced(notify(MAX_KEYS + 1)) is None  # more than are worth naming: read it all
            assert await announced("SELECT pg_notify('knecht_proposals', 'not a key')") is None
            return

        def events(count: int) -> str:
            return ("WITH RECURSIVE n(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM n WHERE k < "
                    f"{count}) INSERT INTO notify_outbox (uid, event, proposal_id, payload_json, created_at)"
                    " SELECT 'evt_test_' || (SELECT COUNT(*) FROM notify_outbox) || '_' || k, 'decided', k, '{}',"
                    " '2026-01-01T00:00:00.000000Z' FROM n")

        assert await announced(events(3)) == {1, 2, 3}
        assert await wakeups.wait(1.0) and wakeups.keys == frozenset()  # nothing since: nothing named
        assert await announced(events(MAX_KEYS + 1)) is None  # more than are worth naming: read it all
        # Every row purged, and the numbering starts again below the last one read: what is new is unknown.
        assert await announced("DELETE FROM notify_outbox", events(2)) is None
        assert await announced(events(1)) == {1}
        # Someone with write access to the database: a key that is no proposal's id names nothing.
        assert await announced(events(1).replace("'decided', k,", "'decided', 'x' || k,")) is None


async def test_the_watcher_still_finds_a_proposal_whose_time_ran_out_while_others_keep_moving(app: App) -> None:
    """Expiry is announced by nobody: however many named changes keep arriving, the watcher reads every open
    proposal at least once an interval."""
    from mcp_knecht.core.proposal_watch import ProposalWatcher, StatusChange

    overdue, busy = await stage(app), await stage(app)
    heard: list[StatusChange] = []

    async def listen(change: StatusChange) -> None:
        heard.append(change)

    watcher = ProposalWatcher(app.proposals, app.changes, interval=0.5)
    watcher.subscribe(listen)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(watcher.run)
        await anyio.sleep(0.2)
        async with app.db.transaction() as tx:  # its time has passed; nothing writes `expired` or notifies
            await tx.execute("UPDATE proposals SET expires_at = ? WHERE id = ?",
                             ("2000-01-01T00:00:00.000000Z", overdue))
        with anyio.fail_after(5):
            while (overdue, "expired") not in {(c.proposal_id, c.status) for c in heard}:
                async with app.db.transaction() as tx:  # a change the store announces, named, every 50 ms
                    await tx.execute("UPDATE proposals SET status = status WHERE id = ?", (busy,))
                await anyio.sleep(0.05)
        tasks.cancel_scope.cancel()


def _watching(reads: _CountingReads, app: App, heard: list[Any]) -> Any:
    from mcp_knecht.core.proposal_watch import ProposalWatcher

    async def listen(change: Any) -> None:
        heard.append((change.proposal_id, change.status))

    watcher = ProposalWatcher(reads, app.changes, interval=60.0)  # type: ignore[arg-type]
    watcher.subscribe(listen)
    return watcher


async def test_between_two_looks_at_everything_the_running_watcher_reads_only_what_moved(app: App) -> None:
    """However many proposals wait, a decision costs the watcher a read of that one (named by the store)."""
    from mcp_knecht.core.approval import Operator

    waiting = [await stage(app) for _ in range(30)]
    reads, heard = _CountingReads(app.proposals), []
    watcher = _watching(reads, app, heard)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(watcher.run)
        with anyio.fail_after(5):
            while not reads.asked:  # the first look: at every open one
                await anyio.sleep(0.02)
        assert reads.asked[0] == waiting
        await app.approvals.reject(waiting[7], Operator("bob"), "no")
        with anyio.fail_after(5):
            while not heard:
                await anyio.sleep(0.02)
        tasks.cancel_scope.cancel()
    assert heard == [(waiting[7], "rejected")]
    # On PostgreSQL the store's notice of the last stagings can reach the watcher after its first look (CI saw
    # it once): a read of those alone, as they moved. What must never come again is a read of them all.
    later = [ids for ids in reads.asked[1:] if ids]
    assert [waiting[7]] in later
    assert all(len(ids) < len(waiting) // 2 for ids in later), later


async def test_the_running_watcher_finds_a_proposal_whose_time_runs_out_without_a_look_at_everything(
        app: App) -> None:
    from mcp_knecht.core import clock

    soon, later = await stage(app), await stage(app)
    async with app.db.transaction() as tx:  # runs out in 2 s; nothing will write `expired` or notify
        await tx.execute("UPDATE proposals SET expires_at = ? WHERE id = ?",
                         (clock.timestamp(clock.now() + timedelta(seconds=2)), soon))
    reads, heard = _CountingReads(app.proposals), []
    watcher = _watching(reads, app, heard)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(watcher.run)
        with anyio.fail_after(10):
            while not heard:
                await anyio.sleep(0.05)
        tasks.cancel_scope.cancel()
    assert heard == [(soon, "expired")]
    assert reads.asked[0] == [soon, later] and [ids for ids in reads.asked[1:] if ids] == [[soon]]


# --- Issue 11, item 10: resources are the gate's get_proposal, subscriptions belong to a connection ---


class _Updates:
    """The `notifications/resources/updated` a legacy client receives, in order."""

    def __init__(self) -> None:
        self.uris: list[str] = []
        self._arrived = anyio.Event()

    async def __call__(self, message: Any) -> None:
        params = getattr(getattr(message, "root", message), "params", None)
        if getattr(params, "uri", None) is not None:
            self.uris.append(str(params.uri))
            self._arrived.set()
            self._arrived = anyio.Event()

    async def until(self, uri: str) -> None:
        with anyio.fail_after(10):
            while uri not in self.uris:
                await self._arrived.wait()


async def test_a_legacy_unsubscribe_ends_notifications_and_a_double_subscribe_notifies_once(app: App) -> None:
    from mcp_knecht import testing

    gone, twice, sentinel = await stage(app), await stage(app), await stage(app)
    uri = {n: f"knecht://proposals/{n}" for n in (gone, twice, sentinel)}
    updates = _Updates()
    alice = Actor("alice", "pytest", frozenset(AGENT))
    async with Client(server_for_app(app, lambda ctx: alice), mode="legacy", message_handler=updates) as client:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # resources/subscribe is deprecated in 2026-07-28, alive in 2025-11-25
            for n in (gone, twice, twice, sentinel):
                await client.subscribe_resource(uri[n])
            await client.unsubscribe_resource(uri[gone])
        for n in (gone, twice):
            await testing.reject(app, n, "no")
        await updates.until(uri[twice])
        await testing.reject(app, sentinel, "no")
        await updates.until(uri[sentinel])  # announced in order: anything about the others came before
    assert updates.uris == [uri[twice], uri[sentinel]]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_resources_need_proposals_read_and_every_read_is_audited(app: App, mode: str) -> None:
    proposal_id = await stage(app, subject="alice")
    uri = f"knecht://proposals/{proposal_id}"
    scopeless = Actor("alice", "pytest", frozenset({"runs:write"}))  # the proposer, without proposals:read
    async with Client(server_for_app(app, lambda ctx: scopeless), mode=mode) as client:
        assert (await client.list_resources()).resources == []
        with pytest.raises(MCPError, match="Unknown resource"):
            await client.read_resource(uri)
        if mode == "legacy":
            with pytest.raises(MCPError, match="Unknown resource"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                await client.subscribe_resource(uri)
    alice = Actor("alice", "pytest", frozenset(AGENT))
    async with Client(server_for_app(app, lambda ctx: alice), mode=mode) as client:
        read = json.loads((await client.read_resource(uri)).contents[0].text)  # type: ignore[union-attr]
    await app.audit.flush()
    rows = await app.db.fetch_all("SELECT outcome, subject FROM audit_log WHERE tool = 'get_proposal' ORDER BY id")
    assert [row["outcome"] for row in rows][-2:] == ["forbidden", "ran"] and rows[-1]["subject"] == "alice"
    async with Client(server_for_app(app, lambda ctx: alice), mode=mode) as client:
        assert json.loads((await client.call_tool("get_proposal", {"id": proposal_id})).content[0].text) == read


async def test_a_resource_shows_the_status_get_proposal_shows(app: App) -> None:
    proposal_id = await stage(app)
    async with app.db.transaction() as tx:  # its time ran out; no sweep has written "expired" yet
        await tx.execute("UPDATE proposals SET expires_at = '2000-01-01T00:00:00.000000Z' WHERE id = ?",
                         (proposal_id,))
    alice = Actor("alice", "pytest", frozenset(AGENT))
    async with Client(server_for_app(app, lambda ctx: alice)) as client:
        read = json.loads((await client.read_resource(f"knecht://proposals/{proposal_id}")).contents[0].text)  # type: ignore[union-attr]
        listed = {r.uri: r.description for r in (await client.list_resources()).resources}
    assert read["status"] == "expired"
    assert listed[f"knecht://proposals/{proposal_id}"] == "record_effect: expired"


async def test_resources_page_past_fifty(app: App) -> None:
    made = {await stage(app) for _ in range(61)}
    alice = Actor("alice", "pytest", frozenset(AGENT))
    seen: list[str] = []
    async with Client(server_for_app(app, lambda ctx: alice)) as client:
        page = await client.list_resources()
        seen += [str(r.uri) for r in page.resources]
        while page.next_cursor is not None:
            page = await client.list_resources(cursor=page.next_cursor)
            seen += [str(r.uri) for r in page.resources]
        with pytest.raises(MCPError, match="Invalid cursor"):
            await client.list_resources(cursor="x'; DROP TABLE proposals; --")
    assert len(seen) == len(set(seen)) == 61
    assert {int(u.rsplit("/", 1)[1]) for u in seen} == made

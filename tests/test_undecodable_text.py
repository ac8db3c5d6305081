"""Text that is no UTF-8, written around the store into a TEXT column (SQLite keeps whatever bytes it is
given: `CAST(x'ff41' AS TEXT)` from the sqlite3 shell), fails no read but its own: it reads with
replacement characters (U+FFFD), so the listings that hold its row go on for everyone, and the row
itself fails its seal check as any rewritten row does: refused, audited, never run. A write that meets
it is undone once, and reads it from then on. PostgreSQL refuses such text when it is written. (The
`app` fixture's demo store is SQLite.)"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator

import pytest

from mcp_knecht.app import App
from mcp_knecht.store.audit_log import verify_chain
from tests.knecht_harness import Knecht, build, call
from tests.staging import acli
from tests.test_approval_integrity import _chain_of, _runs, _staged_rerun
from tests.test_monitoring import _parse, _value

pytestmark = pytest.mark.anyio

NO_UTF8 = "CAST(x'ff41' AS TEXT)"  # a lone continuation byte, then "A"


@pytest.fixture
async def kn(app: App) -> AsyncIterator[Knecht]:
    yield await build(app)


async def _rewrite(kn: Knecht, proposal_id: int, column: str, value: str = NO_UTF8) -> None:
    async with kn.app.db.transaction() as tx:
        await tx.execute(f"UPDATE proposals SET {column} = {value} WHERE id = ?", (proposal_id,))


async def test_a_read_of_text_that_is_no_utf8_answers_it_with_replacement_characters(app: App) -> None:
    async with app.db.transaction() as tx:
        await tx.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
        await tx.execute(f"INSERT INTO notes (text) VALUES ('ok'), ({NO_UTF8})")
    for read in (app.db.lookup, app.db.fetch_all):  # on the event loop's thread, and on the reader's
        assert await read("SELECT text FROM notes WHERE id <= 2 ORDER BY id") == [{"text": "ok"}, {"text": "\ufffdA"}]
        async with app.db.transaction() as tx:  # written after the read: the next read sees it
            await tx.execute("INSERT INTO notes (text) VALUES ('later')")
        assert (await read("SELECT text FROM notes ORDER BY id DESC LIMIT 1")) == [{"text": "later"}]
    assert await app.db.lookup("SELECT hex(text) AS h FROM notes WHERE id = 2") == [{"h": "FF41"}]  # as it was


async def test_a_proposal_rewritten_with_text_that_is_no_utf8_is_refused_and_breaks_no_listing(
    kn: Knecht, demo_env: dict[str, str]
) -> None:
    proposal_id = await _staged_rerun(kn)
    async with kn.connect() as client:  # another proposal, waiting beside it
        other = (await call(client, "project_variable", action="set", project="payments-api", name="FEATURE_X",
                            value="on")).structured_content["id"]
    await _rewrite(kn, proposal_id, "arguments_json",
                   "CAST(CAST(arguments_json AS BLOB) || x'ff' AS TEXT)")  # what runs, with one byte more

    async with kn.connect() as client:  # the agent lists and reads its proposals
        listed = (await call(client, "list_proposals")).structured_content
        assert {proposal_id, other} <= {p["id"] for p in listed["proposals"]}
        read = await client.call_tool("get_proposal", {"id": proposal_id})
        assert not read.is_error, read.content
    # The agent's reads met the row on this process's reader: the refusal another process audits below is
    # seen by its next read (before, the failed read held the reader's snapshot until a garbage collection).
    listing = await acli("knecht-approve", demo_env, "list", "--json")
    assert listing.returncode == 0, listing.stderr
    assert {proposal_id, other} <= {p["id"] for p in json.loads(listing.stdout)}

    runs = await _runs(kn)
    approved = await acli("knecht-approve", demo_env, "approve", str(proposal_id), "--as", "bob")
    assert approved.returncode == 1 and "fails its seal" in approved.stderr
    assert await _runs(kn) == runs  # not run
    stored = await kn.app.proposals.get(proposal_id)
    assert stored is not None and stored.status == "pending"
    tampered = await kn.app.db.fetch_all(
        "SELECT outcome FROM audit_log WHERE proposal_id = ? AND outcome = 'tampered'", (proposal_id,))
    assert len(tampered) == 1
    assert (await kn.approve(other)).status == "succeeded"  # and the one beside it is decided as ever


async def test_a_scrape_goes_on_when_the_oldest_pending_ones_staging_time_is_no_utf8(kn: Knecht) -> None:
    from mcp_knecht.observe.metrics import Metrics

    metrics = Metrics()
    metrics.watch(db=kn.app.db, tools=[tool.name for tool in kn.app.registry])
    await _rewrite(kn, await _staged_rerun(kn), "created_at")
    samples = _parse((await metrics.render()).decode())
    assert _value(samples, "knecht_proposals_pending") == 1
    assert math.isnan(_value(samples, "knecht_proposal_oldest_pending_age_seconds"))  # type: ignore[arg-type]


async def test_audit_verify_names_an_audit_row_rewritten_with_text_that_is_no_utf8_and_checks_every_row(
    kn: Knecht, demo_env: dict[str, str]
) -> None:
    await _chain_of(kn)
    async with kn.app.db.transaction() as tx:
        await tx.execute(f"UPDATE audit_log SET subject = {NO_UTF8} WHERE id = 5")
    problems = await verify_chain(kn.app.db, kn.app.audit.chain)
    assert [p.id for p in problems] == [5] and "does not match its hash" in problems[0].problem
    verified = await acli("mcp-knecht", demo_env, "audit", "verify", "--json")
    assert verified.returncode == 1, verified.stderr
    report = json.loads(verified.stdout)
    assert [p["id"] for p in report["problems"]] == [5] and report["rows"] == 12


async def test_a_write_that_meets_text_that_is_no_utf8_is_undone_once_and_then_reads_it(
    kn: Knecht, caplog: pytest.LogCaptureFixture
) -> None:
    """A write's RETURNING meets such text after it has written, so that transaction is undone (nothing
    half-done) and the writer reads such text from then on. The expiry sweep reads no row before it writes."""
    from mcp_knecht.errors import StoreError

    first = await _staged_rerun(kn)
    async with kn.connect() as client:
        second = (await call(client, "project_variable", action="set", project="payments-api", name="FEATURE_X",
                             value="on")).structured_content["id"]
    async with kn.app.db.transaction() as tx:  # both overdue, one with a reason that is no UTF-8
        await tx.execute("UPDATE proposals SET expires_at = '2000-01-01T00:00:00.000000Z'")
    await _rewrite(kn, first, "reason")

    sweeps: list[object] = []
    for _ in range(2):
        try:
            sweeps.append(len(await kn.app.approvals.expire_due()))
        except StoreError as exc:
            assert "try again" in exc.message
            sweeps.append("undone")
    assert sweeps == ["undone", 2]
    rows = await kn.app.db.fetch_all("SELECT id, status FROM proposals ORDER BY id")
    assert rows == [{"id": first, "status": "expired"}, {"id": second, "status": "expired"}]
    assert len([r for r in caplog.records if "holds text that is no UTF-8" in r.getMessage()]) == 1

"""The gate, specified with small tools of the test's own over a real SQLite audit log."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import Field

from mcp_knecht.core import clock
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.canonical import canonical_json, sha256_hex
from mcp_knecht.core.gate import Gate
from mcp_knecht.core.keys import ServerKeys
from mcp_knecht.core.policy import Policy
from mcp_knecht.core.registry import Registry
from mcp_knecht.core.tools import Tool, ToolContext, ToolInput
from mcp_knecht.errors import ConfigError, NotFoundError, ScopeCatalogueError
from mcp_knecht.store import open_database
from mcp_knecht.store.audit_log import AuditChain, AuditLog, verify_chain

CHAIN = AuditChain(ServerKeys(b"test-server-key-" * 4))

pytestmark = pytest.mark.anyio

calls: list[str] = []


class CountIn(ToolInput):
    n: int = Field(ge=1, le=50, description="how many")


class SetIn(ToolInput):
    action: str = Field(pattern="^(get|set)$")
    value: str = ""


async def count(args: CountIn, ctx: ToolContext) -> dict[str, object]:
    calls.append(f"count:{args.n}")
    if args.n == 13:
        raise NotFoundError("Thirteen does not exist.")
    if args.n == 42:
        raise RuntimeError("/secret/path/db.sqlite: disk I/O error")
    return {"n": args.n, "by": ctx.actor.subject, "source": str(ctx.source)}


async def setting(args: SetIn, ctx: ToolContext) -> dict[str, object]:
    calls.append(f"setting:{args.action}")
    return {"action": args.action}


TOOLS = [
    Tool(name="count", description="Count.", scope="things:read",
         input_model=CountIn, handler=count),
    Tool(name="setting", description="Get or set.", scope="things:write",
         input_model=SetIn, handler=setting, action_effects={"get": "read", "set": "write"}),
]
ALL = frozenset({"things:read", "things:write"})


@pytest.fixture
async def gate_and_db(tmp_path: Path):  # type: ignore[no-untyped-def]
    calls.clear()
    db = await open_database(f"sqlite:///{tmp_path / 'gate.db'}")
    audit = AuditLog(db, CHAIN)
    policy = Policy()
    holder = {"policy": policy}
    gate = Gate(Registry(TOOLS), audit, policy=lambda: holder["policy"])
    yield gate, db, audit, holder
    await audit.aclose()
    await db.close()


async def audit_rows(db, audit):  # type: ignore[no-untyped-def]
    await audit.flush()
    return await db.fetch_all("SELECT * FROM audit_log ORDER BY id")


async def test_a_call_in_scope_runs_with_the_actor_from_the_token(gate_and_db) -> None:  # type: ignore[no-untyped-def]
    gate, db, audit, _ = gate_and_db
    result = await gate.call_tool(Actor("alice", "cli", ALL), "count", {"n": 3})
    assert not result.is_error
    assert result.data == {"n": 3, "by": "alice", "source": "mcp"}
    [row] = await audit_rows(db, audit)
    assert (row["outcome"], row["subject"], row["tool"], row["source"]) == ("ran", "alice", "count", "mcp")
    assert row["rule"] == "built-in: read effects are auto"
    assert len(row["arguments_hash"]) == 64


async def test_out_of_scope_answers_exactly_like_an_unknown_tool(gate_and_db) -> None:  # type: ignore[no-untyped-def]
    gate, db, audit, _ = gate_and_db
    reader = Actor("bob", "cli", frozenset())
    hidden = await gate.call_tool(reader, "count", {"n": 1})
    missing = await gate.call_tool(reader, "no_such_tool", {"n": 1})
    assert hidden.is_error and missing.is_error
    assert hidden.text.replace("count", "X") == missing.text.replace("no_such_tool", "X")
    assert hidden.error_code == missing.error_code == "unknown_tool"
    assert calls == []
    outcomes = [r["outcome"] for r in await audit_rows(db, audit)]
    assert outcomes == ["forbidden", "forbidden"]


@pytest.mark.parametrize(
    ("arguments", "field", "expected"),
    [
        ({"n": "3"}, "n", "valid integer"),
        ({"n": 10000}, "n", "less than or equal to 50"),
        ({"n": 0}, "n", "greater than or equal to 1"),
        ({"n": 3, "drop": "table"}, "drop", "unknown field; expected one of: n"),
        ({}, "n", "required field is missing"),
        ({"n": 3.5}, "n", "valid integer"),
        ({"n": True}, "n", "valid integer"),
    ],
)
async def test_invalid_arguments_name_the_field_and_run_nothing(  # type: ignore[no-untyped-def]
    gate_and_db, arguments, field, expected
) -> None:
    gate, db, audit, _ = gate_and_db
    result = await gate.call_tool(Actor("alice", "cli", ALL), "count", arguments)
    assert result.is_error and result.error_code == "invalid_arguments"
    problems = {p["field"]: p["problem"] for p in result.data["error"]["problems"]}
    assert expected in problems[field]
    assert calls == []
    [row] = await audit_rows(db, audit)
    assert row["outcome"] == "invalid"


async def test_arguments_that_are_not_an_object_are_refused(gate_and_db) -> None:  # type: ignore[no-untyped-def]
    gate, *_ = gate_and_db
    result = await gate.call_tool(Actor("alice", "cli", ALL), "count", ["n", 3])
    assert result.is_error and "JSON object" in result.text


async def test_a_tool_error_reaches_the_model_but_an_internal_error_does_not_leak(gate_and_db) -> None:  # type: ignore[no-untyped-def]
    gate, db, audit, _ = gate_and_db
    actor = Actor("alice", "cli", ALL)
    not_found = await gate.call_tool(actor, "count", {"n": 13})
    assert not_found.is_error and not_found.text == "Thirteen does not exist."
    crashed = await gate.call_tool(actor, "count", {"n": 42})
    assert crashed.is_error and "reference" in crashed.text
    assert "secret" not in crashed.text and "disk" not in crashed.text
    assert [r["outcome"] for r in await audit_rows(db, audit)] == ["failed", "failed"]


async def test_policy_resolves_from_tool_action_to_tool_to_default(gate_and_db) -> None:  # type: ignore[no-untyped-def]
    gate, db, audit, holder = gate_and_db
    actor = Actor("alice", "cli", ALL)
    assert not (await gate.call_tool(actor, "setting", {"action": "get"})).is_error
    # a write with no stager configured is refused, never run unapproved
    staged = await gate.call_tool(actor, "setting", {"action": "set", "value": "x"})
    assert staged.is_error and "approval" in staged.text
    holder["policy"] = Policy(rules={"setting.set": "auto", "setting": "deny"})
    assert not (await gate.call_tool(actor, "setting", {"action": "set"})).is_error
    denied = await gate.call_tool(actor, "setting", {"action": "get"})
    assert denied.is_error and denied.error_code == "denied"
    assert calls == ["setting:get", "setting:set"]
    rules = [r["rule"] for r in await audit_rows(db, audit)]
    assert rules == [
        "built-in: read effects are auto",
        "built-in: write effects are approve",
        "policies.toml: setting.set",
        "policies.toml: setting",
    ]


async def test_a_tool_whose_every_action_is_denied_is_hidden(gate_and_db) -> None:  # type: ignore[no-untyped-def]
    gate, _, _, holder = gate_and_db
    actor = Actor("alice", "cli", ALL)
    assert {t.name for t in gate.visible_tools(actor)} == {"count", "setting"}
    holder["policy"] = Policy(rules={"setting.get": "deny", "setting.set": "deny"})
    assert {t.name for t in gate.visible_tools(actor)} == {"count"}
    result = await gate.call_tool(actor, "setting", {"action": "get"})
    assert result.error_code == "unknown_tool"


async def test_an_entry_built_when_written_keeps_the_moment_and_hash_of_its_call(gate_and_db) -> None:  # type: ignore[no-untyped-def]
    gate, db, audit, _ = gate_and_db
    actor = Actor("alice", "cli", ALL)
    before = clock.timestamp()
    await gate.call_tool(actor, "count", {"n": 3})
    after = clock.timestamp()
    await asyncio.sleep(0.05)  # the row is written later; its moment is still the call's
    [row] = await audit_rows(db, audit)
    assert before <= row["at"] <= after
    assert row["arguments_hash"] == sha256_hex(canonical_json({"n": 3}))
    assert 0 < row["duration_ms"] < 1000


async def test_arguments_that_cannot_be_hashed_cost_the_row_its_hash_never_the_row(  # type: ignore[no-untyped-def]
    gate_and_db, caplog
) -> None:
    gate, db, audit, _ = gate_and_db

    def broken(text: str) -> str:
        raise RuntimeError("no hash today")

    gate.hash_arguments = broken
    result = await gate.call_tool(Actor("alice", "cli", ALL), "count", {"n": 3})
    assert result.data == {"n": 3, "by": "alice", "source": "mcp"}
    [row] = await audit_rows(db, audit)
    assert (row["outcome"], row["arguments_hash"]) == ("ran", None)
    assert "Hashing the arguments" in caplog.text
    assert await verify_chain(db, CHAIN) == []


async def test_every_outcome_lands_in_one_verifiable_chain(gate_and_db) -> None:  # type: ignore[no-untyped-def]
    gate, db, audit, _ = gate_and_db
    actor = Actor("alice", "cli", ALL)
    for n in range(1, 30):
        await gate.call_tool(actor, "count", {"n": n})
    rows = await audit_rows(db, audit)
    assert len(rows) == 29
    assert await verify_chain(db, CHAIN) == []
    async with db.transaction() as tx:
        await tx.execute("UPDATE audit_log SET subject = 'mallory' WHERE id = 7")
        await tx.execute("DELETE FROM audit_log WHERE id = 20")
    problems = {(p.id, p.problem.split(" ")[0]) for p in await verify_chain(db, CHAIN)}
    assert (7, "content") in problems
    assert any(pid == 20 for pid, _ in problems)


async def test_audit_entries_survive_a_clean_shutdown(tmp_path: Path) -> None:
    db = await open_database(f"sqlite:///{tmp_path / 'a.db'}")
    audit = AuditLog(db, CHAIN, flush_interval=3600)
    gate = Gate(Registry(TOOLS), audit)
    for n in range(1, 11):
        await gate.call_tool(Actor("alice", "cli", ALL), "count", {"n": n})
    assert await db.fetch_all("SELECT id FROM audit_log") == []  # nothing committed on the hot path
    await audit.aclose()
    await db.close()
    reopened = await open_database(f"sqlite:///{tmp_path / 'a.db'}")
    assert len(await reopened.fetch_all("SELECT id FROM audit_log")) == 10
    await reopened.close()


def test_a_tool_naming_a_scope_outside_the_catalogue_stops_startup() -> None:
    with pytest.raises(ScopeCatalogueError, match=r"things:write \(tool setting\)"):
        Registry(TOOLS).check_scopes({"things:read"})


def test_tool_names_are_unique() -> None:
    with pytest.raises(ConfigError, match="count"):
        Registry([TOOLS[0], TOOLS[0]])


def test_annotations_follow_the_effects() -> None:
    read, mixed = TOOLS
    assert read.annotations()["readOnlyHint"] is True and read.annotations()["destructiveHint"] is False
    assert mixed.annotations()["readOnlyHint"] is False and mixed.annotations()["destructiveHint"] is True


async def test_an_action_can_need_a_scope_beyond_the_tools_own(tmp_path: Path) -> None:
    guarded = Tool(name="guarded", description="Get or set.", scope="things:read",
         input_model=SetIn, handler=setting,
                   action_effects={"get": "read", "set": "write"}, action_scopes={"set": "things:admin"})
    db = await open_database(f"sqlite:///{tmp_path / 'g.db'}")
    audit = AuditLog(db, CHAIN)
    gate = Gate(Registry([guarded]), audit, policy=lambda: Policy(rules={"guarded": "auto"}))
    reader = Actor("alice", "cli", frozenset({"things:read"}))
    calls.clear()
    assert [t.name for t in gate.visible_tools(reader)] == ["guarded"]
    assert not (await gate.call_tool(reader, "guarded", {"action": "get"})).is_error
    refused = await gate.call_tool(reader, "guarded", {"action": "set"})
    assert refused.error_code == "missing_scope" and "things:admin" in refused.text
    admin = Actor("root", "cli", frozenset({"things:read", "things:admin"}))
    assert not (await gate.call_tool(admin, "guarded", {"action": "set"})).is_error
    assert calls == ["setting:get", "setting:set"]
    assert [r["outcome"] for r in await audit_rows(db, audit)] == ["ran", "forbidden", "ran"]
    with pytest.raises(ScopeCatalogueError, match="things:admin"):
        Registry([guarded]).check_scopes({"things:read"})
    await audit.aclose()
    await db.close()


async def test_a_crash_while_staging_is_an_internal_error_that_leaks_nothing(tmp_path: Path) -> None:
    from mcp_knecht.core.staging import ProposalStager
    from mcp_knecht.store.proposals import SqlProposalRepository

    async def broken_preview(args: CountIn, ctx: ToolContext) -> dict[str, object]:
        raise RuntimeError("/srv/secret/path: connection refused")

    fragile = Tool(name="fragile", description="Write.", scope="things:write",
         input_model=CountIn, handler=count, effect="write", preview=broken_preview)
    db = await open_database(f"sqlite:///{tmp_path / 's.db'}")
    audit = AuditLog(db, CHAIN)
    gate = Gate(Registry([fragile]), audit, stager=ProposalStager(SqlProposalRepository(db, CHAIN), CHAIN.keys))
    result = await gate.call_tool(Actor("alice", "cli", ALL), "fragile", {"n": 1})
    assert result.is_error and result.error_code == "internal" and "reference" in result.text
    assert "secret" not in result.text and "refused" not in result.text
    assert await db.fetch_all("SELECT id FROM proposals") == []
    assert [r["outcome"] for r in await audit_rows(db, audit)] == ["failed"]
    await audit.aclose()
    await db.close()

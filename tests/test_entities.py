"""Entities over the SDK client, on SQLite and PostgreSQL application databases: two roles on one
table, every masking rule of seed 000, injection attempts, limit edges, previews, staged changes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from mcp_knecht.app import App
from mcp_knecht.errors import StoreError
from tests.test_entities_support import (
    ORDERS,
    SHOP,
    actor,
    app_execute,
    app_rows,
    approve,
    call,
    client_for,
    entity_app,
    entity_env,
    make_app_database,
    make_config,
    rows,
)

pytestmark = pytest.mark.anyio

ADMIN_USERS = ["id", "username", "email", "role", "city", "created_at"]
SUPPORT_USERS = ["id", "username", "city"]


@pytest.fixture
async def app_url(database_url: str) -> str:
    """The APPLICATION database (not the server's store) on each engine."""
    await make_app_database(database_url)
    return database_url


@pytest.fixture
async def app(env: dict[str, str], app_url: str, tmp_path: Path) -> AsyncIterator[App]:
    async with entity_app(entity_env(env, make_config(tmp_path / "config", app_url))) as running:
        yield running


# --- tools and scopes ---------------------------------------------------------------------------


async def test_tools_follow_the_scopes_and_say_what_they_cannot_do(app: App) -> None:
    async with client_for(app, actor("support", scopes=["users:read", "orders:read"])) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == {"query_users", "query_orders"}
    description = tools["query_users"].description or ""
    assert "no ranges" in description and "no sorting" in description and "full-text" in description
    schema = tools["query_users"].input_schema
    assert set(schema["properties"]) == {"fields", "filters", "limit"}  # as_role is the server's
    assert schema["properties"]["limit"]["maximum"] == 50
    async with client_for(app, actor("admin")) as client:
        names = {t.name for t in (await client.list_tools()).tools}
    assert {"create_users", "update_users", "create_orders", "update_orders", "delete_orders"} <= names
    assert "delete_users" not in names  # no role may delete users


async def test_an_entities_only_server_has_no_ci_tables_and_says_nothing_about_ci(app: App) -> None:
    """The store holds only its own tables; the instructions describe the entities, not Knecht CI."""
    for knecht_table in ("projects", "runs", "workflows", "log_lines", "project_variables"):
        with pytest.raises(StoreError):
            await app.db.fetch_one(f"SELECT 1 FROM {knecht_table}")
    namespaces = {r["namespace"] for r in await app.db.fetch_all("SELECT namespace FROM applied_migrations")}
    assert namespaces == {"store"}
    async with client_for(app, actor("support")) as client:
        instructions = client.instructions
    assert instructions and "users" in instructions and "orders" in instructions
    assert "CI" not in instructions and "run" not in instructions.lower().split()


# --- reading: two roles on one table -------------------------------------------------------------


async def test_two_roles_read_the_same_table_through_different_masks(app: App) -> None:
    async with client_for(app, actor("admin")) as client:
        admin = await rows(client, "query_users", {})
    async with client_for(app, actor("support")) as client:
        support = await rows(client, "query_users", {})
    assert [list(r) for r in admin] == [ADMIN_USERS] * 3  # password_hash: the role reads it, list does not
    assert [list(r) for r in support] == [SUPPORT_USERS] * 3
    assert support[0] == {"id": 1, "username": "ada", "city": "London"}
    assert admin[0]["email"] == "ada@example.com"
    assert admin[0]["created_at"].startswith("2026-01-05")


async def test_a_field_the_role_may_not_read_is_silently_absent(app: App) -> None:
    async with client_for(app, actor("support")) as client:
        found = await rows(client, "query_users", {"fields": ["email", "username", "role"]})
        only_hidden = await rows(client, "query_users", {"fields": ["email"], "limit": 1})
    assert found[0] == {"id": 1, "username": "ada"}
    assert only_hidden == [{"id": 1}]  # the primary key is always there


async def test_an_unknown_field_is_an_error_naming_it(app: App) -> None:
    async with client_for(app, actor("admin")) as client:
        for arguments in ({"fields": ["username", "nickname"]}, {"fields": ["password_hash"]},
                          {"filters": {"nickname": "ada"}}):
            is_error, data, text = await call(client, "query_users", arguments)
            assert is_error
            name = "nickname" if "nickname" in str(arguments) else "password_hash"
            assert name in text and data["error"]["code"] == "invalid_arguments"


async def test_a_filter_on_a_field_the_role_may_not_read_is_an_error(app: App) -> None:
    async with client_for(app, actor("support")) as client:
        is_error, data, text = await call(client, "query_users", {"filters": {"email": "ada@example.com"}})
    assert is_error and "filters.email" in text and "may not read" in text
    assert "ada@example.com" not in str(data["error"].get("problems"))  # no echo of what matched


async def test_filters_match_exact_values_and_null(app: App) -> None:
    async with client_for(app, actor("admin")) as client:
        assert [r["username"] for r in await rows(client, "query_users", {"filters": {"city": "London"}})] == ["ada"]
        assert [r["username"] for r in await rows(client, "query_users", {"filters": {"city": None}})] == ["grace"]
        assert await rows(client, "query_users", {"filters": {"city": "lon"}}) == []  # no patterns
        both = await rows(client, "query_orders", {"filters": {"status": "paid", "user_id": 2}, "limit": 50})
        assert both and all(r["status"] == "paid" and r["user_id"] == 2 for r in both)
        is_error, _, text = await call(client, "query_orders", {"filters": {"user_id": "2"}})
        assert is_error and "filters.user_id" in text and "integer" in text
        is_error, _, text = await call(client, "query_orders", {"filters": {"created_at": 5}})
        assert is_error and "filters.created_at" in text


async def test_limit_defaults_to_20_and_stays_between_1_and_50(app: App) -> None:
    async with client_for(app, actor("admin")) as client:
        default = await call(client, "query_orders", {})
        assert len(default[1]["rows"]) == 20 and default[1]["more"] is True
        everything = await call(client, "query_orders", {"limit": 50})
        assert len(everything[1]["rows"]) == ORDERS and everything[1]["more"] is False
        one = await call(client, "query_orders", {"limit": 1})
        assert [r["id"] for r in one[1]["rows"]] == [1] and one[1]["more"] is True
        exact = await call(client, "query_orders", {"limit": ORDERS})
        assert len(exact[1]["rows"]) == ORDERS and exact[1]["more"] is False
        for bad in (0, -1, 51, 10**9, "5", True, 2.5, None):
            is_error, _, text = await call(client, "query_orders", {"limit": bad})
            assert is_error and "limit" in text, bad


# --- injection ------------------------------------------------------------------------------------


INJECTED_NAMES = [
    'username" FROM users; DROP TABLE orders; --',
    "username FROM users --",
    "*",
    "id, password_hash",
    '"password_hash"',
    "username\x00",
]


async def test_injected_field_names_and_filter_keys_are_refused(app: App, app_url: str) -> None:
    async with client_for(app, actor("admin")) as client:
        for name in INJECTED_NAMES:
            assert (await call(client, "query_users", {"fields": [name]}))[0], name
            assert (await call(client, "query_users", {"filters": {name: "x"}}))[0], name
            assert (await call(client, "update_users", {"id": 1, "fields": {name: "x"}}))[0], name
    assert len(await app_rows(app_url, "SELECT id FROM orders")) == ORDERS


async def test_injected_values_are_only_ever_compared_as_values(app: App, app_url: str) -> None:
    hostile = ["' OR '1'='1", "ada' --", "ada'; DROP TABLE users; --", '" OR 1=1 --', "%", "_da", "ada\\"]
    async with client_for(app, actor("admin")) as client:
        for value in hostile:
            assert await rows(client, "query_users", {"filters": {"username": value}}) == [], value
        is_error, _, text = await call(client, "query_orders", {"filters": {"id": "1 OR 1=1"}})
        assert is_error and "filters.id" in text
        is_error, data, _ = await call(client, "create_users", {"fields": {
            "username": "o'brien\"; DROP TABLE users; --", "email": "ob@example.com"}})
        assert not is_error
    await approve(app, data["id"])
    async with client_for(app, actor("admin")) as client:
        found = await rows(client, "query_users", {"filters": {"username": "o'brien\"; DROP TABLE users; --"}})
    assert [r["email"] for r in found] == ["ob@example.com"]
    assert len(await app_rows(app_url, "SELECT id FROM users")) == 4


# --- proposing changes: write masks ----------------------------------------------------------------


async def test_proposed_values_are_limited_by_the_role_write_mask_and_persist(app: App) -> None:
    async with client_for(app, actor("support")) as client:
        is_error, _, text = await call(client, "update_users", {"id": 1, "fields": {"email": "x@example.com"}})
        assert is_error and "fields.email" in text and "support" in text
        is_error, _, text = await call(client, "create_orders", {"fields": {"user_id": 1, "total_cents": 5}})
        assert is_error and "fields.user_id" in text and "fields.total_cents" in text
        assert (await call(client, "list_proposals", {}))[1] == {"proposals": []}
    async with client_for(app, actor("admin")) as client:
        # password_hash: the admin's role may not write it anyway, and it is outside persist
        is_error, _, text = await call(client, "update_users", {"id": 1, "fields": {"password_hash": "x"}})
        assert is_error and "password_hash" in text
        is_error, _, text = await call(client, "update_users", {"id": 1, "fields": {"username": 7}})
        assert is_error and "fields.username" in text
        is_error, _, text = await call(client, "update_users", {"id": 1, "fields": {}})
        assert is_error and "fields" in text


async def test_a_role_without_delete_cannot_propose_one(app: App) -> None:
    async with client_for(app, actor("support")) as client:
        is_error, data, text = await call(client, "delete_orders", {"id": 1})
    assert is_error and data["error"]["code"] == "denied" and "may not delete" in text


async def test_the_role_cannot_be_claimed_in_the_arguments(app: App) -> None:
    async with client_for(app, actor("support")) as client:
        is_error, _, text = await call(client, "update_orders", {"id": 1, "fields": {"note": "x"}, "as_role": "admin"})
        assert is_error and "as_role" in text
        is_error, _, text = await call(client, "query_users", {"as_role": "admin"})
        assert is_error and "as_role" in text


async def test_without_a_role_nothing_is_accessible(app: App) -> None:
    async with client_for(app, actor(None)) as client:
        for tool, arguments in (("query_users", {}), ("update_orders", {"id": 1, "fields": {"note": "x"}})):
            is_error, data, text = await call(client, tool, arguments)
            assert is_error and data["error"]["code"] == "denied" and "knecht_role" in text
    async with client_for(app, actor("intern")) as client:
        is_error, _, text = await call(client, "query_users", {})
        assert is_error and "'intern'" in text


# --- staged execution ------------------------------------------------------------------------------


async def test_an_approved_update_runs_exactly_the_frozen_values_as_the_proposers_role(
        app: App, app_url: str) -> None:
    async with client_for(app, actor("support")) as client:
        is_error, staged, text = await call(client, "update_orders", {"id": 5, "fields": {"status": "cancelled"}})
        assert not is_error and text.startswith(f"Submitted for approval (#{staged['id']}). ")
        assert (await app_rows(app_url, "SELECT status FROM orders WHERE id = 5"))[0]["status"] == "shipped"
        proposal = await app.proposals.get(staged["id"])
        assert proposal is not None and proposal.arguments["as_role"] == "support"
        assert proposal.preview == {"entity": "orders", "id": 5, "proposed": {"status": "cancelled"}, "current": {
            "id": 5, "user_id": 3, "status": "shipped", "note": "gift wrap", "created_at": proposal.preview[
                "current"]["created_at"]}}  # total_cents: not readable by support
        done = await approve(app, staged["id"])
        assert done.status == "succeeded", done.error
        assert done.result == {"entity": "orders", "id": 5, "updated": {**proposal.preview["current"],
                                                                         "status": "cancelled"}}
        followed = await call(client, "get_proposal", {"id": staged["id"]})
        assert followed[1]["status"] == "succeeded" and "total_cents" not in str(followed[1]["result"])
    after = await app_rows(app_url, "SELECT status, total_cents, note FROM orders WHERE id = 5")
    assert after == [{"status": "cancelled", "total_cents": 500, "note": "gift wrap"}]


async def test_create_and_delete_run_after_approval(app: App, app_url: str) -> None:
    async with client_for(app, actor("admin")) as client:
        _, created, _ = await call(client, "create_orders", {"fields": {"user_id": 2, "total_cents": 999,
                                                                        "note": "rush"}})
        assert (await app.proposals.get(created["id"])).preview == {  # type: ignore[union-attr]
            "entity": "orders", "proposed": {"user_id": 2, "total_cents": 999, "note": "rush"}}
        done = await approve(app, created["id"])
        assert done.status == "succeeded", done.error
        new = done.result["created"]  # type: ignore[index]
        assert (new["id"], new["status"], new["total_cents"]) == (ORDERS + 1, "new", 999)
        _, deleting, _ = await call(client, "delete_orders", {"id": new["id"]})
        assert (await approve(app, deleting["id"])).status == "succeeded"
    assert await app_rows(app_url, "SELECT id FROM orders WHERE id = ?", (ORDERS + 1,)) == []


async def test_the_preview_shows_only_readable_fields(app: App) -> None:
    async with client_for(app, actor("support")) as client:
        _, staged, _ = await call(client, "update_users", {"id": 1, "fields": {"city": "Paris"}})
    proposal = await app.proposals.get(staged["id"])
    assert proposal is not None and proposal.preview is not None
    assert proposal.preview["current"] == {"id": 1, "username": "ada", "city": "London"}


async def test_a_missing_row_and_an_unreadable_row_give_the_same_empty_preview(app: App) -> None:
    async with client_for(app, actor("intake")) as client:
        is_error, _, text = await call(client, "query_orders", {})
        assert is_error and "may read no field" in text
        _, existing, _ = await call(client, "update_orders", {"id": 3, "fields": {"note": "x"}})
        _, missing, _ = await call(client, "update_orders", {"id": 9999, "fields": {"note": "x"}})
        seen = [await call(client, "get_proposal", {"id": p["id"]}) for p in (existing, missing)]
        _, del_existing, _ = await call(client, "delete_orders", {"id": 3})
        _, del_missing, _ = await call(client, "delete_orders", {"id": 9999})
    previews = [(await app.proposals.get(p["id"])).preview for p in (existing, missing, del_existing, del_missing)]  # type: ignore[union-attr]
    assert previews[0] == {"entity": "orders", "id": 3, "current": {}, "proposed": {"note": "x"}}
    assert previews[1] == {**previews[0], "id": 9999}
    assert previews[2] == {"entity": "orders", "id": 3, "current": {}, "delete": True}
    assert previews[3] == {**previews[2], "id": 9999}

    def shape(answer: Any) -> Any:  # what the proposer sees, with the ids and hashes taken out
        public = dict(answer[1])
        for key in ("id", "arguments_hash", "created_at", "expires_at"):
            public.pop(key)
        arguments = dict(public.pop("arguments"))
        assert len(arguments.pop("row_version")) == 64
        arguments.pop("id")
        return public, arguments

    assert shape(seen[0]) == shape(seen[1])


async def test_a_stale_update_is_refused_at_execution(app: App, app_url: str) -> None:
    async with client_for(app, actor("support")) as client:
        _, staged, _ = await call(client, "update_orders", {"id": 2, "fields": {"note": "from the agent"}})
        # Somebody changes a field the proposer cannot even read (total_cents) meanwhile.
        await app_execute(app_url, "UPDATE orders SET total_cents = 1 WHERE id = 2")
        done = await approve(app, staged["id"])
        assert done.status == "failed" and "changed since" in (done.error or "")
        followed = await call(client, "get_proposal", {"id": staged["id"]})
        assert followed[1]["status"] == "failed"
    assert (await app_rows(app_url, "SELECT note, total_cents FROM orders WHERE id = 2")) == [
        {"note": None, "total_cents": 1}]


async def test_a_stale_delete_is_refused_and_an_unchanged_one_runs(app: App, app_url: str) -> None:
    async with client_for(app, actor("admin")) as client:
        _, stale, _ = await call(client, "delete_orders", {"id": 7})
        _, fresh, _ = await call(client, "delete_orders", {"id": 8})
    await app_execute(app_url, "UPDATE orders SET note = 'touched' WHERE id = 7")
    assert (await approve(app, stale["id"])).status == "failed"
    assert (await approve(app, fresh["id"])).status == "succeeded"
    assert [r["id"] for r in await app_rows(app_url, "SELECT id FROM orders WHERE id IN (7, 8)")] == [7]


async def test_an_update_of_a_missing_row_fails_after_approval_without_writing(app: App) -> None:
    async with client_for(app, actor("admin")) as client:
        _, staged, _ = await call(client, "update_orders", {"id": 9999, "fields": {"note": "x"}})
    done = await approve(app, staged["id"])
    assert done.status == "failed" and "does not exist" in (done.error or "")


async def test_a_constraint_violation_fails_cleanly(app: App) -> None:
    async with client_for(app, actor("admin")) as client:
        _, staged, _ = await call(client, "update_users", {"id": 2, "fields": {"username": "ada"}})  # UNIQUE
    done = await approve(app, staged["id"])
    assert done.status == "failed" and "refused" in (done.error or "") and "internal" not in (done.error or "")


async def test_the_role_comes_from_a_verified_token_claim(app: App, token_settings: Any) -> None:
    import jwt

    from mcp_knecht.core.auth import TokenVerifier, mint_token

    minted = mint_token(token_settings, subject="carol", scopes=SHOP, client="pytest")
    claims = {**jwt.decode(minted, options={"verify_signature": False}), "knecht_role": "support"}
    assert token_settings.secret is not None
    verified = TokenVerifier(token_settings).verify(jwt.encode(claims, token_settings.secret, algorithm="HS256"))
    async with client_for(app, verified) as client:
        assert [list(r) for r in await rows(client, "query_users", {"limit": 1})] == [SUPPORT_USERS]


@pytest.mark.slow
async def test_the_real_knecht_approve_executes_an_entity_proposal(app: App, app_url: str, env: dict[str, str],
                                                                   tmp_path: Path) -> None:
    """Another process executes it: same fingerprint key (the data dir's), same frozen role."""
    from tests.staging import acli

    async with client_for(app, actor("support")) as client:
        _, staged, _ = await call(client, "update_users", {"id": 2, "fields": {"city": "Espoo"}})
    cli_env = entity_env(env, tmp_path / "config")
    shown = await acli("knecht-approve", cli_env, "show", str(staged["id"]))
    assert shown.returncode == 0 and "Helsinki" in shown.stdout and "linus@example.com" not in shown.stdout
    approved = await acli("knecht-approve", cli_env, "approve", str(staged["id"]), "--as", "bob")
    assert approved.returncode == 0 and "succeeded" in approved.stdout, approved.stdout + approved.stderr
    assert await app_rows(app_url, "SELECT city FROM users WHERE id = 2") == [{"city": "Espoo"}]


async def test_an_exact_filter_cannot_confirm_a_masked_value(app: App, app_url: str) -> None:
    """Issue 11, item 1 for the entities' filters: a filter compares with what the caller may see,
    so a value shown masked (a secret the server knows) matches no row, and the answer for the right
    guess is the answer for a wrong one."""
    app.secrets.add(["Summer2026!"])
    await app_execute(app_url, "UPDATE orders SET note = ? WHERE id = 3", ("Summer2026!",))
    await app_execute(app_url, "UPDATE orders SET note = ? WHERE id = 4", ("password=hunter22",))
    async with client_for(app, actor("admin")) as client:
        shown = await rows(client, "query_orders", {"filters": {"id": 3}})
        assert shown[0]["note"] == "***"
        for right, wrong in (("Summer2026!", "Summer2026?"), ("password=hunter22", "password=hunter23")):
            assert await call(client, "query_orders", {"filters": {"note": right}}) == \
                await call(client, "query_orders", {"filters": {"note": wrong}})
            assert await rows(client, "query_orders", {"filters": {"note": right}}) == []
        assert [r["id"] for r in await rows(client, "query_orders", {"filters": {"note": "gift wrap"}, "limit": 50})]

"""Property: whatever fields, filters and limit a caller sends, no result ever holds a field
outside its effective read mask (role read mask ∧ list, plus the primary key), nor more rows than
the limit; and a value of a column nobody may read (password_hash) never leaves the server."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

from anyio.from_thread import start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_entities_support import actor, entity_app, entity_env, make_app_database, make_config

COLUMNS = {
    "users": ["id", "username", "email", "role", "city", "password_hash", "email_verified_at", "created_at"],
    "orders": ["id", "user_id", "status", "total_cents", "note", "created_at"],
}
EFFECTIVE: dict[tuple[str | None, str], set[str]] = {
    ("admin", "users"): {"id", "username", "email", "role", "city", "created_at"},
    ("support", "users"): {"id", "username", "city"},
    ("admin", "orders"): {"id", "user_id", "status", "total_cents", "note", "created_at"},
    ("support", "orders"): {"id", "user_id", "status", "note", "created_at"},
}  # every other (role, entity) — intake on users or orders, no role, an unknown role — reads nothing
ROLES = ["admin", "support", "intake", None, "intern"]
JUNK = ["nickname", "*", 'id" FROM users --', "id, password_hash", ""]
VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-2, 30), st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["ada", "London", "paid", "new", "gift wrap", "' OR 1=1 --", "2026-01-05 10:00:00"]),
    st.text(alphabet="abcdefgh' \";-%_", max_size=12),
)


@st.composite
def queries(draw: st.DrawFn) -> tuple[str, str | None, dict[str, Any]]:
    entity = draw(st.sampled_from(sorted(COLUMNS)))
    names = st.sampled_from(COLUMNS[entity] + JUNK)
    arguments: dict[str, Any] = {}
    if draw(st.booleans()):
        arguments["fields"] = draw(st.lists(names, max_size=8))
    if draw(st.booleans()):
        arguments["filters"] = draw(st.dictionaries(names, VALUES, max_size=3))
    if draw(st.booleans()):
        arguments["limit"] = draw(st.integers(-3, 60))
    return entity, draw(st.sampled_from(ROLES)), arguments


def test_no_result_ever_holds_a_field_outside_the_effective_read_mask(
        env: dict[str, str], database_url: str, tmp_path: Path) -> None:
    from mcp import Client

    from mcp_knecht.transports.mcp_server import server_for_app

    config = make_config(tmp_path / "config", database_url)
    with start_blocking_portal() as portal, ExitStack() as stack:
        portal.call(make_app_database, database_url)
        app = stack.enter_context(portal.wrap_async_context_manager(entity_app(entity_env(env, config))))
        clients = {}
        for role in ROLES:
            who = actor(role)
            clients[role] = stack.enter_context(portal.wrap_async_context_manager(
                Client(server_for_app(app, lambda ctx, who=who: who))))
        outcomes = {"rows": 0, "errors": 0}

        @settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
        @given(queries())
        def check(query: tuple[str, str | None, dict[str, Any]]) -> None:
            entity, role, arguments = query
            result = portal.call(clients[role].call_tool, f"query_{entity}", arguments)
            text = " ".join(getattr(part, "text", "") for part in result.content)
            assert "pbkdf2$" not in text
            if result.is_error:
                outcomes["errors"] += 1
                return
            allowed = EFFECTIVE.get((role, entity))
            assert allowed is not None, f"{role} read {entity}: {text}"
            found = result.structured_content["rows"]
            limit = arguments.get("limit", 20)
            assert 1 <= limit <= 50 and len(found) <= limit
            for row in found:
                assert set(row) <= allowed, (role, entity, arguments, row)
                assert "id" in row
            outcomes["rows"] += len(found)

        check()
    assert outcomes["rows"] > 0 and outcomes["errors"] > 0  # both branches were exercised

"""Issue 11, items 1-4: no secret can be probed, and no proposal can poison the masking.

The rule: every answer is computed on exactly the text the caller may see. Guessing a secret one
character at a time — through a search, a filter, or the echo of a guess — must get the same
answer for the right character as for a wrong one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from mcp_knecht import testing
from mcp_knecht.app import App
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.canonical import canonical_json
from mcp_knecht.core.scrub import MASK, Scrubber
from mcp_knecht.knecht import secret_values
from mcp_knecht.store import open_database
from tests.conftest import READONLY
from tests.knecht_harness import AGENT, Knecht, build

pytestmark = pytest.mark.anyio

EVE = testing.actor("eve", (*READONLY, "variables:read", "proposals:read"))  # a read-only token
_patterns = Scrubber()


@pytest.fixture
async def kn(app: App) -> AsyncIterator[Knecht]:
    yield await build(app)


def _wrong(char: str) -> str:
    """Another character of the same kind (so a guess keeps the shape of a key, a token, a URL)."""
    for alphabet in ("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz", "0123456789", "/+-_.:@"):
        if char in alphabet:
            return alphabet[(alphabet.index(char) + 1) % len(alphabet)]
    return "#" if char != "#" else "%"


def _normalised(value: Any, guess: str) -> Any:
    """An answer with the echo of the guess (as sent, or as the secret shapes mask it) taken out."""
    if isinstance(value, str):
        return value.replace(guess, "<GUESS>").replace(_patterns(guess), "<GUESS>")
    if isinstance(value, dict):
        return {_normalised(k, guess): _normalised(v, guess) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalised(v, guess) for v in value]
    return value


async def _answer(kn: Knecht, actor: Actor, tool: str, arguments: dict[str, Any], guess: str) -> Any:
    result = await kn.gate.call_tool(actor, tool, arguments)
    return result.is_error, _normalised(result.data, guess), _normalised(result.text, guess)


async def _demo_secrets(kn: Knecht) -> list[str]:
    """Every secret variable's value, and the database passwords inside the database URLs."""
    values = await secret_values(kn.app.db)
    passwords = {v.split(":")[2].split("@")[0] for v in values if v.startswith("postgres://")}
    return sorted(values | passwords)


async def _visible_log(kn: Knecht, run_id: int, action_id: int) -> list[str]:
    """Every line of a log as the caller may read it, page by page."""
    tool, where = ("get_run_log", {}) if action_id == 0 else ("get_action_log", {"action": action_id})
    lines: list[str] = []
    offset: int | None = 0
    while offset is not None:
        page = (await kn.gate.call_tool(EVE, tool, {"run_id": run_id, "offset": offset, "limit": 1000, **where})).data
        assert page is not None
        lines += [line["text"] for line in page["lines"]]
        offset = page["next_offset"]
    return lines


async def test_grep_cannot_read_a_secret_back_one_character_at_a_time(kn: Knecht) -> None:
    """Item 1: search, offsets and counts are those of the masked text; the echo tells nothing."""
    probed = compared = 0
    for secret in await _demo_secrets(kn):
        found = await kn.app.db.fetch_one(
            "SELECT run_id, action_id FROM log_lines WHERE instr(text, ?) > 0 ORDER BY run_id LIMIT 1", (secret,))
        if found is None:
            continue
        probed += 1
        run_id, action_id = found["run_id"], found["action_id"]
        tool, where = ("get_run_log", {}) if action_id == 0 else ("get_action_log", {"action": action_id})
        visible = [line.lower() for line in await _visible_log(kn, run_id, action_id)]
        for k in range(3, len(secret)):
            guesses = [secret[: k + 1], secret[:k] + _wrong(secret[k])]
            if secret[k].swapcase() != secret[k]:
                guesses.append(secret[:k] + secret[k].swapcase())
            if any(guess.lower() in line for guess in guesses for line in visible):
                continue  # this much of it is plainly visible (a URL's user, a key's prefix)
            for window in ({}, {"tail": 50}):
                answers = [await _answer(kn, EVE, tool, {"run_id": run_id, **where, "grep": g, **window}, g)
                           for g in guesses]
                assert all(a == answers[0] for a in answers), (secret[:4], k, answers)
                assert answers[0][1]["matches"] == 0
                compared += 1
    assert probed >= 10 and compared >= 300  # the demo logs echo keys, tokens, URLs and passwords


async def test_lookups_by_name_cannot_confirm_a_secret(kn: Knecht) -> None:
    """Item 1 for every tool that takes a filter or a name: a guess is echoed back as sent (its
    secret shapes masked, as for any input), never masked because it is a secret."""
    run = await kn.app.db.fetch_one("SELECT id FROM runs ORDER BY id LIMIT 1")
    assert run is not None
    secrets = await _demo_secrets(kn)
    for secret in secrets:
        for guess_of in (secret, secret[: len(secret) // 2 + 1]):
            wrong = guess_of[:-1] + _wrong(guess_of[-1])
            for tool, arguments in (
                ("get_project", {"project": "{}"}),
                ("list_workflows", {"project": "{}"}),
                ("get_workflow", {"workflow": "{}", "project": "payments-api"}),
                ("list_runs", {"branch": "{}"}),
                ("get_action_log", {"run_id": run["id"], "action": "{}"}),
                ("get_run_log", {"run_id": run["id"], "grep": "{}"}),
                ("project_variable", {"action": "get", "project": "{}", "name": "DEPLOY_TOKEN"}),
            ):
                answers = [await _answer(kn, EVE, tool, {k: (g if v == "{}" else v) for k, v in arguments.items()}, g)
                           for g in (guess_of, wrong)]
                assert answers[0] == answers[1], (tool, secret[:4])
    # and the echo of a whole secret is what was sent, not the mask
    shown = (await kn.gate.call_tool(EVE, "get_project", {"project": secrets[0]})).text
    assert MASK not in shown.replace(_patterns(secrets[0]), "")


async def test_a_proposed_secret_masks_nothing_until_it_is_real(kn: Knecht) -> None:
    """Item 2: staging (not approving) a secret variable must not change anybody's output."""
    alice = testing.actor("alice", AGENT)
    async with kn.connect("alice") as client:
        for value in ("failed", '": null'):
            staged = await client.call_tool("project_variable", {"action": "set", "project": "payments-api",
                                                                 "name": "POISON", "value": value, "secret": True})
            assert not staged.is_error, staged.content[0].text
    await kn.app.audit.flush()
    before = (await kn.app.db.fetch_one("SELECT COUNT(*) AS n FROM audit_log"))["n"]
    runs = (await kn.gate.call_tool(EVE, "list_runs", {"status": "failed", "limit": 5})).data
    assert runs is not None and {r["status"] for r in runs["runs"]} == {"failed"}  # not "***"
    for run in runs["runs"]:
        result = await kn.gate.call_tool(EVE, "get_run", {"run_id": run["id"]})
        assert not result.is_error and result.data is not None and json.loads(result.text) == result.data
    await kn.app.audit.flush()
    after = (await kn.app.db.fetch_one("SELECT COUNT(*) AS n FROM audit_log"))["n"]
    assert after - before == 1 + len(runs["runs"])  # every call audited
    # The proposer sees its own proposal with the value masked, and no hash it could test guesses on.
    mine = (await kn.gate.call_tool(alice, "list_proposals", {"limit": 2})).data
    assert mine is not None
    for proposal in mine["proposals"]:
        assert proposal["arguments"]["value"] == MASK


async def test_a_real_secret_masks_inside_values_and_never_breaks_a_result(kn: Knecht) -> None:
    """Item 2, after approval: the value `": null` is a real secret now; results keep their shape."""
    async with kn.connect("alice") as client:
        staged = await client.call_tool("project_variable", {"action": "set", "project": "payments-api",
                                                             "name": "QUOTE", "value": '": null', "secret": True})
    assert (await kn.approve(staged.structured_content["id"])).status == "succeeded"  # type: ignore[index]
    assert '": null' in kn.secrets.literals
    for run in (await kn.app.db.fetch_all("SELECT id FROM runs ORDER BY id LIMIT 20")):
        result = await kn.gate.call_tool(EVE, "get_run", {"run_id": run["id"]})
        assert not result.is_error, result.text
        assert json.loads(result.text) == result.data


async def test_secrets_with_quotes_backslashes_and_newlines_and_short_ones_are_masked(kn: Knecht) -> None:
    """Item 3: values are masked before serialisation, whatever characters they hold, and a secret
    written after the server started — by another process, here straight into the store, as the CI
    system would — is masked too. Short secrets are masked where they stand as whole tokens."""
    run = await kn.app.db.fetch_one("SELECT id FROM runs ORDER BY id LIMIT 1")
    assert run is not None
    odd = 'qu"ote\\back\nslash-secret'
    other = await open_database(kn.app.db.url, migrate=False)  # another process, writing directly
    try:
        async with other.transaction() as tx:
            for name, value in (("ODD", odd), ("SHORT", "k7Q2"), ("TINY", "q9")):
                await tx.execute("INSERT INTO project_variables (project_id, name, value, secret, updated_at,"
                                 " updated_by) VALUES (1, ?, ?, 1, '2026-01-01T00:00:00.000000Z', 'ci')", (name, value))
            await tx.execute("DELETE FROM log_lines WHERE run_id = ? AND action_id = 0", (run["id"],))
            await tx.execute_many(
                "INSERT INTO log_lines (run_id, action_id, line_no, text) VALUES (?, 0, ?, ?)",
                [(run["id"], 1, f"export X='{odd}'"), (run["id"], 2, odd.split("\n")[0]),
                 (run["id"], 3, "token k7Q2 used; k7Q2x and xk7Q2 are other words; q9 is too short")])
    finally:
        await other.close()
    await anyio.sleep(0.3)  # the documented bound: changes made elsewhere are seen within a quarter second
    page = await kn.gate.call_tool(EVE, "get_run_log", {"run_id": run["id"]})
    assert page.data is not None
    texts = [line["text"] for line in page.data["lines"]]
    assert odd not in page.text and odd not in "".join(texts) and json.dumps(odd)[1:-1] not in page.text
    assert texts[0] == f"export X='{MASK}'"
    assert texts[2] == f"token {MASK} used; k7Q2x and xk7Q2 are other words; q9 is too short"


async def test_a_secret_written_elsewhere_is_masked_on_both_stores(staged_app: App, database_url: str) -> None:
    """Item 3 on SQLite and PostgreSQL: the store's trigger tells every server process."""
    other = await open_database(database_url, migrate=False)
    try:
        async with other.transaction() as tx:
            await tx.execute("INSERT INTO projects (id, slug, name, description, repository_url, default_branch,"
                             " created_at) VALUES (99, 'p99', 'P', '', 'https://x', 'main', '2026-01-01')")
            await tx.execute("INSERT INTO project_variables (project_id, name, value, secret, updated_at, updated_by)"
                             " VALUES (99, 'NEW', 'written-by-the-ci-system', 1, '2026-01-01', 'ci')")
    finally:
        await other.close()
    await anyio.sleep(0.3)
    await staged_app.secrets.refresh()
    assert "written-by-the-ci-system" in staged_app.secrets.literals
    assert staged_app.gate._scrub("x written-by-the-ci-system y") == f"x {MASK} y"


async def test_the_hash_a_proposer_sees_cannot_confirm_a_guess_offline(kn: Knecht) -> None:
    """Item 4: the proposer reads its proposal's arguments (the value masked) and its hash; hashing
    the arguments with a guessed value offline must never reproduce that hash."""
    async with kn.connect("alice") as client:
        staged = await client.call_tool("project_variable", {"action": "set", "project": "payments-api",
                                                             "name": "DB_PASSWORD", "value": "Summer2026!",
                                                             "secret": True})
        shown = (await client.call_tool("get_proposal", {"id": staged.structured_content["id"]})).structured_content  # type: ignore[index]
    assert shown is not None and shown["arguments"]["value"] == MASK
    for guess in ("Summer2026!", "summer2026!", "Winter2026!"):
        candidate = canonical_json({**shown["arguments"], "value": guess})
        assert hashlib.sha256(candidate.encode()).hexdigest() != shown["arguments_hash"]
        assert not shown["arguments_hash"].startswith(hashlib.sha256(candidate.encode()).hexdigest()[:8])

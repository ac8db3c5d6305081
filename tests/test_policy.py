"""policies.toml: strict parsing that fails closed, hot reload that keeps the last good policy,
decisions that name their rule — seen through the server and the CLI."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from mcp_knecht.app import App
from mcp_knecht.core.policy_file import PolicySource, load_policy
from mcp_knecht.core.registry import Registry
from mcp_knecht.errors import ConfigError
from tests.conftest import REPO, server_env
from tests.staging import AGENT, TEST_TOOLSETS, acli, cli, make_config

pytestmark = pytest.mark.anyio

POLICY = """
[policy]
default = "approve"

[tools]
list_projects = "auto"
get_project = "deny"
slow_effect = "deny"
record_effect = "auto"
"memo.get" = "auto"
"memo.set" = "deny"
"""


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    return make_config(tmp_path / "config", POLICY)


@pytest.fixture
def staged_env(demo_env: dict[str, str], config_dir: Path) -> dict[str, str]:
    """Overrides conftest's: the demo data (SQLite) and this module's policy."""
    return {**demo_env, "KNECHT_CONFIG_DIR": str(config_dir), "KNECHT_TOOLSETS": TEST_TOOLSETS,
            "PYTHONPATH": str(REPO)}


@pytest.fixture
def app(staged_app: App) -> App:
    return staged_app


@pytest.fixture
def registry(app: App) -> Registry:
    """The tools the server serves: Knecht's and the test toolset."""
    return app.registry


async def test_deny_hides_auto_runs_at_once_and_the_default_stages(connect, app: App) -> None:  # type: ignore[no-untyped-def]
    async with connect("alice", AGENT) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert "get_project" not in names and "slow_effect" not in names
        assert {"list_projects", "record_effect", "memo", "list_runs"} <= names

        ran = await client.call_tool("record_effect", {"label": "now"})
        assert not ran.is_error and ran.structured_content == {"recorded": "now"}
        hidden = await client.call_tool("get_project", {"project": 1})
        assert hidden.is_error and "Unknown tool" in hidden.content[0].text
        denied = await client.call_tool("memo", {"action": "set", "text": "x"})
        assert denied.is_error and "denied by policy" in denied.content[0].text
        assert not (await client.call_tool("memo", {"action": "get"})).is_error
        staged = await client.call_tool("list_runs", {"limit": 1})  # the file's default: approve
        assert staged.content[0].text.startswith("Submitted for approval")
    assert [r["label"] for r in await app.db.fetch_all("SELECT label FROM test_effects")] == ["now"]
    await app.audit.flush()
    rules = {(r["tool"], r["outcome"], r["rule"]) for r in await app.db.fetch_all("SELECT * FROM audit_log")}
    assert ("memo", "denied", "policies.toml: memo.set") in rules
    assert ("list_runs", "staged", "policies.toml: default") in rules
    assert ("record_effect", "ran", "policies.toml: record_effect") in rules


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[tools\nrerun = 'auto'", "syntax error"),
        ("[tools]\nno_such_tool = 'auto'", "tools.no_such_tool: unknown tool 'no_such_tool'"),
        ("[tools]\n'memo.explode' = 'auto'", "tools.memo.explode: memo has no action 'explode'"),
        ("[tools]\nmemo = 'sometimes'", "tools.memo = 'sometimes': unknown value"),
        ("[policy]\ndefault = 'yes'", "policy.default = 'yes': unknown value"),
        ("[policy]\nfallback = 'auto'", "policy.fallback: unknown key"),
        ("[limits]\nmemo = 'auto'", "unknown key 'limits'"),
        ("[rules]\nmemo = 'auto'", "rules must be a list of tables, each written as [[rules]]"),
        ("[tools]\n'list_runs.get' = 'auto'", "list_runs has no action 'get'"),
    ],
)
async def test_a_broken_policy_file_is_refused_naming_file_key_and_problem(
    tmp_path: Path, registry: Registry, text: str, message: str
) -> None:
    path = tmp_path / "policies.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        load_policy(path, registry)
    assert str(path) in refused.value.message and message in refused.value.message


def test_a_broken_policy_file_stops_the_server_and_the_check(
    staged_env: dict[str, str], config_dir: Path, mint: Callable[..., str]
) -> None:
    (config_dir / "policies.toml").write_text("[tools]\nrerun_everything = 'auto'\n")
    check = cli("mcp-knecht", staged_env, "policy", "check")
    assert check.returncode == 2 and "rerun_everything" in check.stderr and "policies.toml" in check.stderr
    # A valid token, so that only the policy file can be what stops the server.
    serve = cli("mcp-knecht", {**staged_env, "KNECHT_TOKEN": mint()}, "serve")
    assert serve.returncode == 2 and "rerun_everything" in serve.stderr and "policies.toml" in serve.stderr


async def test_a_broken_reload_keeps_the_last_good_policy_and_says_so(
    tmp_path: Path, registry: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "policies.toml"
    path.write_text("[tools]\nmemo = 'deny'\n")
    source = PolicySource(path, registry)
    memo = registry.get("memo")
    assert memo is not None and source().decide(memo, "get").mode == "deny"

    path.write_text("[tools]\nmemo = 'auto'\n# grown\n")
    assert source.reload_if_changed()
    assert source().decide(memo, "get").mode == "auto"

    path.write_text("[tools]\nmemo = 'allow-all'\n")
    with caplog.at_level(logging.ERROR):
        assert not source.reload_if_changed()
    assert source().decide(memo, "get").mode == "auto"
    assert "keeping the last good policy" in caplog.text and "allow-all" in caplog.text
    assert source.last_error and "memo" in source.last_error


@pytest.mark.parametrize("breakage", ["deleted", "emptied", "unreadable", "renamed"])
async def test_a_policy_file_that_disappears_keeps_its_deny_rules(
    tmp_path: Path, registry: Registry, caplog: pytest.LogCaptureFixture, breakage: str
) -> None:
    path = tmp_path / "policies.toml"
    path.write_text("[tools]\nmemo = 'deny'\n")
    source = PolicySource(path, registry)
    memo = registry.get("memo")
    assert memo is not None and source().decide(memo, "set").mode == "deny"
    if breakage == "deleted":
        path.unlink()
    elif breakage == "emptied":
        path.write_text("  \n")
    elif breakage == "unreadable":
        path.unlink()
        path.mkdir()  # a directory where the file was: reading it fails
    else:
        path.rename(tmp_path / "policies.toml.bak")
    with caplog.at_level(logging.ERROR):
        assert not source.reload_if_changed()
    assert source().decide(memo, "set").mode == "deny"  # the last good policy, not the built-in default
    assert "keeping the last good policy" in caplog.text and source.last_error


def test_policy_check_reports_a_missing_policy_file(staged_env: dict[str, str], config_dir: Path) -> None:
    (config_dir / "policies.toml").unlink()
    check = cli("mcp-knecht", staged_env, "policy", "check")
    assert check.returncode == 0 and "is missing" in check.stderr and "last good policy" in check.stderr


def test_policies_and_scopes_never_come_from_the_working_directory(
    staged_env: dict[str, str], tmp_path: Path
) -> None:
    """Claude Code starts the server inside the repository it works on: a permissive policies.toml and
    scopes/ there must not switch approval off."""
    hostile = tmp_path / "some-repository"
    (hostile / "scopes").mkdir(parents=True)
    (hostile / "scopes" / "catalogue.toml").write_text('[scopes]\n"runs:write" = "x"\n')
    (hostile / "policies.toml").write_text('[policy]\ndefault = "auto"\n')
    env = {k: v for k, v in staged_env.items() if k != "KNECHT_CONFIG_DIR"}
    env.pop("KNECHT_TOOLSETS", None)
    done = subprocess.run([str(Path(sys.executable).parent / "mcp-knecht"), "policy", "explain", "dispatch_workflow"],
                          cwd=hostile, env=server_env(env), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "dispatch_workflow: approve" in done.stdout and "auto" not in done.stdout


async def test_a_changed_file_takes_effect_without_a_restart(connect, app: App, config_dir: Path) -> None:  # type: ignore[no-untyped-def]
    async with connect("alice", AGENT) as client:
        assert "get_project" not in {t.name for t in (await client.list_tools()).tools}
        (config_dir / "policies.toml").write_text(POLICY.replace('get_project = "deny"', 'get_project = "auto"'))
        app.policy.reload_if_changed()  # the server's watcher does this every second
        assert not (await client.call_tool("get_project", {"project": 1})).is_error


def test_policy_explain_names_the_rule(staged_env: dict[str, str]) -> None:
    explained = cli("mcp-knecht", staged_env, "policy", "explain", "memo")
    assert explained.returncode == 0
    assert "memo.get: auto  (rule: policies.toml: memo.get)" in explained.stdout
    assert "memo.set: deny  (rule: policies.toml: memo.set)" in explained.stdout
    default = cli("mcp-knecht", staged_env, "policy", "explain", "get_run")
    assert "get_run: approve  (rule: policies.toml: default)" in default.stdout
    assert cli("mcp-knecht", staged_env, "policy", "explain", "nothing").returncode == 2
    table = cli("mcp-knecht", staged_env, "policy", "check")
    assert table.returncode == 0 and "memo.set" in table.stdout and "deny" in table.stdout


async def test_audit_verify_names_an_edited_and_a_deleted_row(app: App, staged_env: dict[str, str]) -> None:
    from mcp_knecht.core.actor import Actor

    alice = Actor("alice", "pytest", frozenset(AGENT))
    for n in range(10):
        await app.gate.call_tool(alice, "record_effect", {"label": f"e{n}"})
    await app.audit.flush()
    assert (await acli("mcp-knecht", staged_env, "audit", "verify")).returncode == 0
    async with app.db.transaction() as tx:
        await tx.execute("UPDATE audit_log SET outcome = 'denied' WHERE id = 3")
        await tx.execute("DELETE FROM audit_log WHERE id = 7")
    verified = await acli("mcp-knecht", staged_env, "audit", "verify")
    assert verified.returncode == 1
    assert "row 3:" in verified.stdout and "row 7:" in verified.stdout
    listed = await acli("mcp-knecht", staged_env, "audit", "list", "--tool", "record_effect", "--json")
    assert listed.returncode == 0 and '"record_effect"' in listed.stdout

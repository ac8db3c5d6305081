"""Policy rules on arguments and callers: `[[rules]]` in policies.toml, strict at load, first match
in file order, decided on the call as it will run (validated, frozen, and the tool's facts)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import Field

from mcp_knecht.app import App, open_app
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.policy_file import PolicySource, parse_policy
from mcp_knecht.core.policy_text import policy_note, rule_warnings
from mcp_knecht.core.registry import Registry
from mcp_knecht.core.settings import load_settings
from mcp_knecht.core.tools import Tool, ToolContext, ToolInput
from mcp_knecht.errors import ConfigError
from tests.staging import cli

pytestmark = pytest.mark.anyio

WRITER = frozenset({"projects:read", "runs:read", "runs:write", "workflows:read", "workflows:write",
                    "variables:read", "variables:write", "proposals:read"})
PATH = Path("/etc/knecht/policies.toml")


# --- a small registry of the test's own ---------------------------------------------------------


class DeployIn(ToolInput):
    branch: str = Field(min_length=1)
    replicas: int = Field(default=1, ge=1, le=10)
    dry_run: bool = False
    target: Literal["staging", "production"] = "staging"


class SettingIn(ToolInput):
    action: Literal["get", "set"]
    key: str = "x"


async def _nothing(args: Any, ctx: ToolContext) -> dict[str, Any]:
    return {}


TOOLS = Registry([
    Tool(name="deploy", description="Deploy.", scope="s", input_model=DeployIn, handler=_nothing, effect="write"),
    Tool(name="delete_users", description="Delete.", scope="s", input_model=DeployIn, handler=_nothing,
         effect="write"),
    Tool(name="delete_orders", description="Delete.", scope="s", input_model=DeployIn, handler=_nothing,
         effect="write"),
    Tool(name="setting", description="Settings.", scope="s", input_model=SettingIn, handler=_nothing,
         action_effects={"get": "read", "set": "write"}),
])
DEPLOY, SETTING = TOOLS.get("deploy"), TOOLS.get("setting")
assert DEPLOY is not None and SETTING is not None


def caller(subject: str = "alice", client: str = "claude-code") -> Actor:
    return Actor(subject, client, frozenset({"s"}))


# --- the format, and how it fails closed ---------------------------------------------------------


def test_rules_match_in_file_order_before_the_tools_table() -> None:
    policy = parse_policy("""
[tools]
deploy = "deny"

[[rules]]
tool = "deploy"
when = { branch = ["main", "release/*"], target = "production" }
decision = "approve"
approvers = 2
reason = "protected branch"

[[rules]]
tool = "deploy"
when = { branch = "feature/*" }
decision = "auto"

[[rules]]
tool = "deploy"
when = { branch = "feature/*" }
decision = "deny"
""", PATH, TOOLS)
    release = policy.decide(DEPLOY, None, {"branch": "release/2.1", "target": "production"}, caller())
    assert (release.mode, release.approvers, release.reason) == ("approve", 2, "protected branch")
    assert release.rule == 'policies.toml rule 1: deploy where branch = ["main", "release/*"], target = "production"'
    assert policy.decide(DEPLOY, None, {"branch": "feature/x", "target": "staging"}, caller()).mode == "auto"
    on_staging = policy.decide(DEPLOY, None, {"branch": "main", "target": "staging"}, caller())
    assert (on_staging.mode, on_staging.rule) == ("deny", "policies.toml: deploy")  # no rule: the table
    assert rule_warnings(policy, TOOLS)[0].message.startswith("rule 3 can never match: rule 2 before it")


def test_the_precedence_after_the_rules_is_unchanged() -> None:
    policy = parse_policy("""
[policy]
default = "deny"
[tools]
"setting.set" = "approve"
[[rules]]
tool = "setting"
action = "get"
subject = "ci-*"
decision = "auto"
""", PATH, TOOLS)
    by_rule = policy.decide(SETTING, "get", {}, caller("ci-bot"))
    assert by_rule.rule == 'policies.toml rule 1: setting.get where subject = "ci-*"'
    assert policy.decide(SETTING, "get", {}, caller("alice")).rule == "policies.toml: default"
    assert policy.decide(SETTING, "set", {}, caller("ci-bot")).rule == "policies.toml: setting.set"
    assert parse_policy("", PATH, TOOLS).decide(DEPLOY, None).rule == "built-in: write effects are approve"
    # Visible to those a rule lets through; hidden from the others, for whom every call is denied.
    assert not policy.hides(SETTING, caller("ci-bot")) and policy.hides(DEPLOY, caller("ci-bot"))
    assert not policy.hides(SETTING, caller("alice"))  # setting.set is approved


def test_the_index_by_value_keeps_file_order() -> None:
    """Rules testing one argument against exact values are looked up by that value; rules that do not
    (a glob, another argument) stay candidates for every value, in their place."""
    text = "".join(f'[[rules]]\ntool = "deploy"\nwhen = {{ {when} }}\ndecision = "{mode}"\n' for when, mode in [
        ('branch = "main"', "deny"), ('branch = "ma*"', "auto"), ('branch = "main"', "approve"),
        ('branch = ["x", "main"], replicas = 2', "approve"), ("replicas = 3", "deny"), ('branch = "y"', "auto")])
    policy = parse_policy(text, PATH, TOOLS)
    for values, number in [({"branch": "main"}, 1), ({"branch": "mast"}, 2), ({"branch": "x", "replicas": 2}, 4),
                           ({"branch": "x", "replicas": 3}, 5), ({"branch": "y", "replicas": 3}, 5),
                           ({"branch": "y"}, 6), ({"replicas": 3}, 5)]:
        assert f"rule {number}:" in policy.decide(DEPLOY, None, values).rule, values
    assert policy.decide(DEPLOY, None, {"branch": "z"}).rule == "built-in: write effects are approve"


@pytest.mark.parametrize(("when", "values", "matches"), [
    ('{ branch = "release/*" }', {"branch": "release/"}, True),
    ('{ branch = "release/*" }', {"branch": "release/2/hotfix"}, True),  # * spans slashes
    ('{ branch = "release/*" }', {"branch": "Release/2"}, False),  # case matters
    ('{ branch = "*-rc" }', {"branch": "v2-rc"}, True),
    ('{ branch = "main" }', {"branch": "main2"}, False),  # no * means exact
    ('{ branch = ["a", "b*"] }', {"branch": "bee"}, True),
    ('{ replicas = [3, 4] }', {"replicas": 4}, True),
    ('{ replicas = 1 }', {"replicas": True}, False),  # true is not 1
    ('{ dry_run = true }', {"dry_run": True}, True),
    ('{ dry_run = false }', {"dry_run": None}, False),  # a missing value matches nothing
    ('{ branch = "x", dry_run = true }', {"branch": "x", "dry_run": False}, False),  # every entry must hold
])
def test_when_values_globs_and_any_of_lists(when: str, values: dict[str, Any], matches: bool) -> None:
    policy = parse_policy(f'[[rules]]\ntool = "deploy"\nwhen = {when}\ndecision = "deny"\n', PATH, TOOLS)
    assert (policy.decide(DEPLOY, None, values, caller()).mode == "deny") is matches


def test_subject_and_client_globs_match_the_verified_caller() -> None:
    policy = parse_policy("""
[[rules]]
tool = "deploy"
subject = "ci-*"
client = "github-*"
decision = "auto"
""", PATH, TOOLS)
    assert policy.decide(DEPLOY, None, {}, caller("ci-bot", "github-actions")).mode == "auto"
    assert policy.decide(DEPLOY, None, {}, caller("ci-bot", "claude-code")).mode == "approve"
    assert policy.decide(DEPLOY, None, {}, caller("alice", "github-actions")).mode == "approve"
    assert policy.decide(DEPLOY, None, {}, None).mode == "approve"  # no caller: no caller rule matches


def test_a_tool_glob_covers_every_tool_it_names() -> None:
    policy = parse_policy('[[rules]]\ntool = "delete_*"\ndecision = "deny"\nreason = "never"\n', PATH, TOOLS)
    assert {t.name for t in TOOLS if policy.decide(t, None).mode == "deny"} == {"delete_users", "delete_orders"}
    unused = parse_policy('[[rules]]\ntool = "drop_*"\ndecision = "deny"\n', PATH, TOOLS)
    [note] = rule_warnings(unused, TOOLS)
    assert not note.shadowed and "matches no tool" in note.message


@pytest.mark.parametrize(("rule", "message"), [
    ('tool = "nope"\ndecision = "auto"', "rule 1, tool: unknown tool 'nope'"),
    ('tool = "deploy"\naction = "set"\ndecision = "auto"', "rule 1, action: deploy has no action 'set'"),
    ('tool = "setting"\naction = "drop"\ndecision = "auto"', "setting has no action 'drop'; actions: get, set"),
    ('tool = "deploy"\nwhen = { brunch = "main" }\ndecision = "auto"',
     "rule 1, when.brunch: deploy has no argument 'brunch'; a rule on it can test: branch, dry_run"),
    ('tool = "deploy"\nwhen = { replicas = "3" }\ndecision = "auto"', "rule 1, when.replicas: '3' can never be"),
    ('tool = "deploy"\nwhen = { replicas = "1*" }\ndecision = "auto"', "a glob (with *) needs a text argument"),
    ('tool = "deploy"\nwhen = { replicas = 11 }\ndecision = "auto"', "less than or equal to 10"),
    ('tool = "deploy"\nwhen = { target = "prod" }\ndecision = "auto"', "'prod' can never be the value"),
    ('tool = "deploy"\nwhen = { dry_run = 1 }\ndecision = "auto"', "when.dry_run: 1 can never be"),
    ('tool = "deploy"\nwhen = { branch = [] }\ndecision = "auto"', "an empty list matches nothing"),
    ('tool = "deploy"\nwhen = { branch = { a = 1 } }\ndecision = "auto"', "text, numbers and true/false"),
    ('tool = "deploy"\nwhen = "branch"\ndecision = "auto"', "rule 1, when: expected a table"),
    ('tool = "deploy"\ndecision = "auto"\napprovers = 2', "rule 1, approvers: only an `approve` rule"),
    ('tool = "deploy"\ndecision = "approve"\napprovers = 0', "rule 1, approvers: expected a whole number"),
    ('tool = "deploy"\ndecision = "approve"\napprovers = true', "rule 1, approvers: expected a whole number"),
    ('tool = "deploy"\ndecision = "maybe"', "rule 1, decision: 'maybe' is not a decision"),
    ('tool = "deploy"', "rule 1: `decision` is missing"),
    ('decision = "auto"', "rule 1: `tool` is missing"),
    ('tool = "deploy"\ndecision = "auto"\nsubject = ""', "rule 1, subject: expected a non-empty string"),
    ('tool = "deploy"\ndecision = "auto"\nowner = "me"', "rule 1, owner: unknown key"),
])
def test_a_broken_rule_is_refused_naming_file_rule_and_key(rule: str, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_policy(f'[[rules]]\ntool = "setting"\naction = "get"\ndecision = "auto"\n\n[[rules]]\n{rule}\n'
                     .replace("rule 1", "rule 2"), PATH, TOOLS)
    assert str(PATH) in refused.value.message
    assert message.replace("rule 1", "rule 2") in refused.value.message


async def test_a_reload_with_a_broken_rule_keeps_the_last_good_policy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "policies.toml"
    path.write_text('[[rules]]\ntool = "deploy"\nwhen = { branch = "main" }\ndecision = "deny"\n')
    source = PolicySource(path, TOOLS)
    assert source().decide(DEPLOY, None, {"branch": "main"}).mode == "deny"
    path.write_text('[[rules]]\ntool = "deploy"\nwhen = { branch = "main" }\ndecision = "auto"\napprovers = 2\n')
    with caplog.at_level(logging.ERROR):
        assert not source.reload_if_changed()
    assert source().decide(DEPLOY, None, {"branch": "main"}).mode == "deny"
    assert "keeping the last good policy" in caplog.text and "rule 1, approvers" in caplog.text


def test_the_staged_note_says_which_arguments_stage_a_call() -> None:
    always = parse_policy("", PATH, TOOLS)
    assert policy_note(DEPLOY, always, caller()) == (
        "This tool is staged: calling it submits a proposal for human approval and returns "
        "'Submitted for approval (#ID)' immediately; it does not run until an operator approves it.")
    assert policy_note(DEPLOY, parse_policy('[tools]\ndeploy = "auto"', PATH, TOOLS), caller()) == ""
    sometimes = parse_policy("""
[[rules]]
tool = "deploy"
when = { target = "production" }
decision = "approve"
approvers = 2
reason = "production"
[[rules]]
tool = "deploy"
subject = "intern-*"
decision = "deny"
[tools]
deploy = "auto"
""", PATH, TOOLS)
    note = policy_note(DEPLOY, sometimes, caller())
    assert note.splitlines()[:3] == [
        "Whether a call is staged depends on it; the first case that applies decides:",
        '- where target = "production": staged for human approval by 2 different operators (production)',
        "- any other call: runs at once",
    ]
    assert "intern" not in note  # rules on other callers are not this caller's business
    assert "refused by policy" in policy_note(DEPLOY, sometimes, caller("intern-jo"))


# --- the property: decide equals a straightforward reference ------------------------------------


def _glob(pattern: str, text: str) -> bool:
    """`*` matches any run of characters: by recursion, not regular expressions."""
    if not pattern:
        return not text
    if pattern[0] == "*":
        return any(_glob(pattern[1:], text[i:]) for i in range(len(text) + 1))
    return bool(text) and text[0] == pattern[0] and _glob(pattern[1:], text[1:])


def _one(expected: Any, value: Any) -> bool:
    if value is None:
        return False
    if isinstance(expected, bool) or isinstance(value, bool):
        return isinstance(expected, bool) and isinstance(value, bool) and expected == value
    if isinstance(expected, str) != isinstance(value, str):
        return False
    if isinstance(expected, str) and "*" in expected:
        return _glob(expected, value)
    return bool(expected == value)


def reference(rules: list[dict[str, Any]], table: dict[str, str], tool: Tool, action: str | None,
              values: dict[str, Any], who: Actor) -> tuple[str, str, int]:
    for number, rule in enumerate(rules, start=1):
        if not _glob(rule["tool"], tool.name) or rule.get("action", action) != action:
            continue
        if any(key in rule and not _glob(rule[key], getattr(who, key)) for key in ("subject", "client")):
            continue
        if all(any(_one(e, values.get(name)) for e in (want if isinstance(want, list) else [want]))
               for name, want in rule.get("when", {}).items()):
            return rule["decision"], f"rule {number}:", rule.get("approvers", 1)
    for key in (f"{tool.name}.{action}", tool.name):
        if key in table:
            return table[key], f"policies.toml: {key}", 1
    mode = "auto" if tool.effect_of(action) == "read" else "approve"
    return mode, "built-in", 1


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return f'"{value}"' if isinstance(value, str) else str(value)


BRANCHES = ["main", "release/1", "release/*", "feat*", "*x", "x"]
branch_values = st.sampled_from(BRANCHES) | st.lists(st.sampled_from(BRANCHES), min_size=1, max_size=3)
conditions = st.fixed_dictionaries({}, optional={
    "branch": branch_values,
    "replicas": st.sampled_from([1, 2, 3]) | st.lists(st.sampled_from([1, 2, 3]), min_size=1, max_size=2),
    "dry_run": st.booleans(),
})


@st.composite
def rule_lists(draw: st.DrawFn) -> list[dict[str, Any]]:
    rules = []
    for _ in range(draw(st.integers(0, 12))):
        tool = draw(st.sampled_from(["deploy", "delete_*", "*", "setting"]))
        rule: dict[str, Any] = {"tool": tool, "decision": draw(st.sampled_from(["auto", "approve", "deny"]))}
        if tool == "setting":
            if draw(st.booleans()):
                rule["action"] = draw(st.sampled_from(["get", "set"]))
        elif tool != "*" and (when := draw(conditions)):
            rule["when"] = when
        for key, globs in (("subject", ["ci-*", "alice", "*"]), ("client", ["claude*", "cursor"])):
            if draw(st.integers(0, 3)) == 0:
                rule[key] = draw(st.sampled_from(globs))
        if rule["decision"] == "approve" and draw(st.booleans()):
            rule["approvers"] = draw(st.integers(1, 3))
        rules.append(rule)
    return rules


calls = st.tuples(
    st.sampled_from(["deploy", "delete_users", "setting"]),
    st.sampled_from(["get", "set"]),
    st.fixed_dictionaries({}, optional={"branch": st.sampled_from(["main", "release/1", "release/", "feature",
                                                                   "fix", "box", "*x"]),
                                        "replicas": st.integers(1, 4), "dry_run": st.booleans()}),
    st.sampled_from(["ci-bot", "alice", "bob"]),
    st.sampled_from(["claude-code", "cursor"]),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rules=rule_lists(), table=st.dictionaries(st.sampled_from(["deploy", "setting.get", "setting"]),
                                                  st.sampled_from(["auto", "approve", "deny"]), max_size=2),
       probes=st.lists(calls, min_size=1, max_size=10))
def test_decide_equals_a_straightforward_reference(
    rules: list[dict[str, Any]], table: dict[str, str], probes: list[Any]
) -> None:
    text = "[tools]\n" + "".join(f'"{k}" = "{v}"\n' for k, v in table.items())
    for rule in rules:
        text += "\n[[rules]]\n" + "".join(
            f"{key} = {{ {', '.join(f'{n} = {_toml(v)}' for n, v in value.items())} }}\n" if key == "when"
            else f"{key} = {_toml(value)}\n" for key, value in rule.items())
    policy = parse_policy(text, PATH, TOOLS)
    for name, action, values, subject, client in probes:
        tool = TOOLS.get(name)
        assert tool is not None
        act = action if tool.actions else None
        who = Actor(subject, client, frozenset())
        mode, where, approvers = reference(rules, table, tool, act, values, who)
        decided = policy.decide(tool, act, values, who)
        assert (decided.mode, decided.approvers) == (mode, approvers), (text, name, act, values, who)
        assert where in decided.rule if where != "built-in" else decided.rule.startswith("built-in")


# --- through the gate, on the demo data: rules see the call as it will run -----------------------


RULES = """
[[rules]]
tool = "rerun_run"
when = { branch = ["main", "release/*"] }
decision = "approve"
reason = "protected branch"

[[rules]]
tool = "cancel_run"
subject = "ci-*"
when = { own_run = true }
decision = "auto"

[[rules]]
tool = "dispatch_workflow"
when = { workflow = "release" }
decision = "approve"
approvers = 2
reason = "a release needs two people"

[[rules]]
tool = "project_variable"
action = "set"
when = { name = "PROD_*" }
decision = "deny"
reason = "production variables are managed by the platform team"

[[rules]]
tool = "update_workflow"
when = { base_version = 2 }
decision = "deny"
reason = "version 2 is frozen"

[tools]
rerun_run = "auto"
cancel_run = "approve"
dispatch_workflow = "auto"
"""


@pytest.fixture
async def rules_app(demo_env: dict[str, str]) -> AsyncIterator[App]:
    Path(demo_env["KNECHT_CONFIG_DIR"], "policies.toml").write_text(RULES, encoding="utf-8")
    async with open_app(load_settings(env=demo_env)) as running:
        yield running


async def _run(app: App, where: str) -> dict[str, Any]:
    row = await app.db.fetch_one(f"SELECT * FROM runs WHERE {where} ORDER BY id DESC LIMIT 1")
    assert row is not None
    return row


async def test_a_branch_rule_holds_for_the_branch_the_run_is_on(rules_app: App) -> None:
    """rerun_run has no branch argument: the rule sees the run's branch, derived after freezing."""
    alice = Actor("alice", "pytest", WRITER)
    on_main = await _run(rules_app, "branch = 'main' AND status = 'failed'")
    on_feature = await _run(rules_app, "branch LIKE 'feature/%' AND status = 'failed'")
    staged = await rules_app.gate.call_tool(alice, "rerun_run", {"run_id": on_main["id"]})
    assert staged.outcome == "staged" and staged.text.startswith(f"Submitted for approval (#{staged.data['id']}).")
    assert "Why: protected branch." in staged.text
    ran = await rules_app.gate.call_tool(alice, "rerun_run", {"run_id": on_feature["id"]})
    assert ran.outcome == "ran" and ran.data["run"]["branch"] == on_feature["branch"]
    proposal = await rules_app.proposals.get(staged.data["id"])
    assert proposal is not None and proposal.policy_reason == "protected branch"
    assert proposal.rule == 'policies.toml rule 1: rerun_run where branch = ["main", "release/*"]'
    await rules_app.audit.flush()
    audited = {(r["outcome"], r["rule"]) for r in await rules_app.db.fetch_all(
        "SELECT outcome, rule FROM audit_log WHERE tool = 'rerun_run'")}
    assert audited == {("staged", proposal.rule), ("ran", "policies.toml: rerun_run")}


async def test_a_rule_on_a_frozen_argument_sees_what_freezing_filled_in(rules_app: App) -> None:
    """The call never names a version: freezing fills in the workflow's current one, and the rule on
    `base_version` decides on that."""
    alice = Actor("alice", "pytest", WRITER)
    at_2 = await rules_app.db.fetch_one("SELECT id FROM workflows WHERE current_version = 2")
    at_3 = await rules_app.db.fetch_one("SELECT id FROM workflows WHERE current_version = 3")
    assert at_2 is not None and at_3 is not None
    definition = "name: x\nactions:\n  - name: build\n    run: make\n"
    denied = await rules_app.gate.call_tool(alice, "update_workflow", {"workflow": at_2["id"],
                                                                       "definition": definition})
    assert denied.outcome == "denied" and denied.text.endswith("denied by policy: version 2 is frozen.")
    staged = await rules_app.gate.call_tool(alice, "update_workflow", {"workflow": at_3["id"],
                                                                       "definition": definition})
    assert staged.outcome == "staged", staged.text


async def test_a_workflow_rule_holds_however_the_call_names_the_workflow(rules_app: App) -> None:
    alice = Actor("alice", "pytest", WRITER)
    release = await rules_app.db.fetch_one(
        "SELECT w.id, p.slug FROM workflows w JOIN projects p ON p.id = w.project_id WHERE w.name = 'release'")
    ci = await rules_app.db.fetch_one("SELECT id, project_id FROM workflows WHERE name = 'ci'")
    assert release is not None and ci is not None
    given = {"version": "2.4.0"}
    by_id = await rules_app.gate.call_tool(alice, "dispatch_workflow", {"workflow": release["id"], "branch": "main",
                                                                        "inputs": given})
    by_name = await rules_app.gate.call_tool(alice, "dispatch_workflow", {
        "workflow": "release", "project": release["slug"], "branch": "main", "inputs": given})
    assert by_id.outcome == by_name.outcome == "staged", (by_id.text, by_name.text)
    assert "2 approvals by different operators" in by_id.text
    ran = await rules_app.gate.call_tool(alice, "dispatch_workflow", {"workflow": ci["id"], "branch": "main"})
    assert ran.outcome == "ran", ran.text


async def test_caller_rules_and_a_deny_with_its_reason(rules_app: App) -> None:
    queued = await _run(rules_app, "status IN ('queued', 'running')")
    bot = Actor(queued["created_by"], "pytest", WRITER)
    assert queued["created_by"] != "ci-bot"
    staged = await rules_app.gate.call_tool(bot, "cancel_run", {"run_id": queued["id"]})
    assert staged.outcome == "staged"  # own run, but not a ci-* subject
    async with rules_app.db.transaction() as tx:
        await tx.execute("UPDATE runs SET created_by = 'ci-bot' WHERE id = ?", (queued["id"],))
    other_bot = Actor("ci-other", "pytest", WRITER)
    assert (await rules_app.gate.call_tool(other_bot, "cancel_run", {"run_id": queued["id"]})).outcome == "staged"
    ci_bot = Actor("ci-bot", "pytest", WRITER)
    assert (await rules_app.gate.call_tool(ci_bot, "cancel_run", {"run_id": queued["id"]})).outcome == "ran"

    alice = Actor("alice", "pytest", WRITER)
    denied = await rules_app.gate.call_tool(alice, "project_variable", {
        "action": "set", "project": 1, "name": "PROD_DB", "value": "x"})
    assert denied.outcome == "denied" and denied.text == (
        "project_variable.set is denied by policy: production variables are managed by the platform team.")
    assert await rules_app.db.fetch_one("SELECT * FROM project_variables WHERE name = 'PROD_DB'") is None


async def test_a_deny_runs_nothing_and_a_settled_deny_freezes_nothing(tmp_path: Path) -> None:
    from mcp_knecht.core.gate import Gate
    from mcp_knecht.core.keys import ServerKeys
    from mcp_knecht.store import open_database
    from mcp_knecht.store.audit_log import AuditChain, AuditLog

    happened: list[str] = []

    async def freeze(args: DeployIn, ctx: ToolContext) -> DeployIn:
        happened.append("freeze")
        return args

    async def facts(args: DeployIn, ctx: ToolContext) -> dict[str, Any]:
        happened.append("facts")
        return {"env": "prod" if args.branch == "main" else "dev"}

    async def run(args: DeployIn, ctx: ToolContext) -> dict[str, Any]:
        happened.append("run")
        return {}

    from mcp_knecht.core.tools import Fact

    tool = Tool(name="deploy", description="d", scope="s", input_model=DeployIn, handler=run, effect="write",
                freeze=freeze, facts=facts, fact_fields={"env": Fact(str, "where it goes")})
    async def freeze_switch(args: SettingIn, ctx: ToolContext) -> SettingIn:
        happened.append("freeze switch")
        return args

    switch = Tool(name="switch", description="s", scope="s", input_model=SettingIn, handler=_nothing,
                  action_effects={"get": "read", "set": "write"}, freeze=freeze_switch)
    registry = Registry([tool, switch])
    db = await open_database(f"sqlite:///{tmp_path / 'gate.db'}")
    audit = AuditLog(db, AuditChain(ServerKeys(b"k" * 32)))
    holder = {"text": '[[rules]]\ntool = "deploy"\nsubject = "mallory"\ndecision = "deny"\n'
                      '[[rules]]\ntool = "deploy"\nwhen = { env = "prod" }\ndecision = "deny"\n'
                      '[tools]\ndeploy = "auto"\n"switch.set" = "deny"\n'}
    gate = Gate(registry, audit, policy=lambda: parse_policy(holder["text"], PATH, registry))
    try:
        # Every call mallory could make is denied: the tool is hidden from mallory, and nothing looked at.
        assert (await gate.call_tool(caller("mallory"), "deploy", {"branch": "dev"})).outcome == "forbidden"
        assert happened == []
        # A deny no argument can change is decided before freezing: nothing looked at either.
        assert (await gate.call_tool(caller(), "switch", {"action": "set"})).outcome == "denied"
        assert happened == []
        assert (await gate.call_tool(caller(), "deploy", {"branch": "main"})).outcome == "denied"
        assert happened == ["freeze", "facts"]  # decided on the frozen call: frozen, but nothing ran
        assert (await gate.call_tool(caller(), "deploy", {"branch": "dev"})).outcome == "ran"
        assert happened[-1] == "run"
        happened.clear()
        holder["text"] = '[tools]\ndeploy = "auto"\n'
        assert (await gate.call_tool(caller(), "deploy", {"branch": "main"})).outcome == "ran"
        assert happened == ["freeze", "run"]  # no rule tests a fact: none looked up
    finally:
        await audit.aclose()
        await db.close()


def test_policy_check_and_explain_on_the_command_line(demo_env: dict[str, str]) -> None:
    config = Path(demo_env["KNECHT_CONFIG_DIR"])
    (config / "policies.toml").write_text(RULES + """
[[rules]]
tool = "rerun_run"
when = { branch = "release/1.0" }
decision = "deny"
""", encoding="utf-8")
    check = cli("mcp-knecht", demo_env, "policy", "check")
    assert check.returncode == 0, check.stderr
    assert 'rule 1: rerun_run where branch = ["main", "release/*"] → approve: protected branch' in check.stdout
    assert "warning: rule 6 can never match: rule 1 before it matches every call it does" in check.stdout
    assert "approve|auto" in check.stdout

    explained = cli("mcp-knecht", demo_env, "policy", "explain", "rerun_run", "--args", '{"branch": "release/2"}')
    assert explained.returncode == 0, explained.stderr
    assert explained.stdout.startswith("rerun_run: approve: protected branch  (rule: policies.toml rule 1:")
    assert "taken as given" in explained.stdout
    feature = cli("mcp-knecht", demo_env, "policy", "explain", "rerun_run", "--args", '{"run_id": 1}', "--json")
    assert feature.returncode == 0, feature.stderr
    assert '"branch": ' in feature.stdout and '"own_run": false' in feature.stdout
    as_bot = cli("mcp-knecht", demo_env, "policy", "explain", "cancel_run", "--args",
                 '{"branch": "x", "own_run": true}', "--as", "ci-bot")
    assert "cancel_run: auto  (rule: policies.toml rule 2: cancel_run where own_run = true" in as_bot.stdout
    assert cli("mcp-knecht", demo_env, "policy", "explain", "rerun_run", "--args", '{"brunch": 1}').returncode == 2
    listed = cli("mcp-knecht", demo_env, "policy", "explain", "rerun_run")
    assert "depends on the call" in listed.stdout and "branch (fact: the branch the run is on)" in listed.stdout

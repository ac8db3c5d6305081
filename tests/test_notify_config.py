"""`[notify]` in knecht.toml and the webhook variables: parsed strictly, failing closed with the
file and the key named; secrets only from the environment; routing from the specific to the
general."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mcp_knecht.core.settings import Settings
from mcp_knecht.errors import ConfigError
from mcp_knecht.notify.channels import check_apprise_url
from mcp_knecht.notify.config import (
    WEBHOOK,
    Delivery,
    NotifyConfig,
    NotifyEnvironment,
    load_notify_config,
    notify_environment,
    parse_notify,
    served_calls,
)
from tests.receivers import new_webhook_secret

REPO = Path(__file__).resolve().parent.parent
PATH = Path("/etc/knecht/knecht.toml")

EXAMPLE = """
[models]                              # another feature's table: not read here
default = "anthropic:claude"

[notify]
public_url = "https://knecht.example.com/"
pending  = ["ops"]
proposer = ["dev"]

[notify.tools]
rerun_run = ["release"]
"project_variable.set" = ["security", "ops"]

[notify.channels]
ops      = "mailto://${SMTP_USER}:${SMTP_PASSWORD}@smtp.example.com?to=ops@example.com"
release  = "slack://${SLACK_TOKEN}/#releases"
security = { url = "ntfy://${NTFY_TOPIC}" }
dev      = "json://hooks.example.com/knecht"

[notify.delivery]
timeout = "5s"
max_attempts = 4
backoff = 0.5
max_backoff = "2m"
"""
ENV = {"SMTP_USER": "knecht", "SMTP_PASSWORD": "pw-Zq8sK2vY", "SLACK_TOKEN": "T0000/B0000/XXXXXXXXXXXXXXXX",
       "NTFY_TOPIC": "knecht-security-7d1f"}


def environment(env: dict[str, str]) -> NotifyEnvironment:
    return NotifyEnvironment(webhook_url=env.get("KNECHT_WEBHOOK_URL"), webhook_secret=env.get("KNECHT_WEBHOOK_SECRET"),
                             values=env)


def settings_for(config_dir: Path, **values: str) -> Settings:
    return Settings(data_dir=config_dir, config_dir=config_dir, database_url="sqlite:///unused.db", **values)


def parse(text: str, env: dict[str, str] | None = None, **checks: object) -> NotifyConfig:
    return parse_notify(text, PATH, environment(env if env is not None else ENV), **checks)  # type: ignore[arg-type]


def refused(text: str, env: dict[str, str] | None = None, **checks: object) -> str:
    with pytest.raises(ConfigError) as caught:
        parse(text, env, **checks)
    return caught.value.message


def test_the_example_parses_with_its_secrets_from_the_environment() -> None:
    config = parse(EXAMPLE, check_channel=check_apprise_url)
    assert list(config.channels) == ["ops", "release", "security", "dev"]
    assert config.channels["ops"].url == (
        "mailto://knecht:pw-Zq8sK2vY@smtp.example.com?to=ops@example.com")
    assert config.secrets == {"knecht", "pw-Zq8sK2vY", "T0000/B0000/XXXXXXXXXXXXXXXX", "knecht-security-7d1f"}
    assert "pw-Zq8sK2vY" not in repr(config)
    assert config.public_url == "https://knecht.example.com"
    assert config.delivery == Delivery(timeout=5.0, max_attempts=4, backoff=0.5, max_backoff=120.0)
    assert config.routes.tools == {"rerun_run": ("release",), "project_variable.set": ("security", "ops")}
    assert config.webhook is None


def test_a_missing_file_means_no_channels(tmp_path: Path) -> None:
    config = load_notify_config(settings_for(tmp_path))
    assert config.channels == {} and config.destinations == [] and config.webhook is None


def test_the_shipped_config_dir_has_none() -> None:
    assert load_notify_config(settings_for(REPO)).destinations == []


def test_the_webhook_comes_from_the_settings(tmp_path: Path) -> None:
    secret = new_webhook_secret()
    settings = settings_for(tmp_path, webhook_url="https://hooks.example.com/k", webhook_secret=secret)
    assert notify_environment(settings).webhook_secret == secret
    config = load_notify_config(settings)
    assert config.webhook is not None and config.webhook.url == "https://hooks.example.com/k"


def test_pending_proposals_route_from_the_most_specific_setting_to_the_default() -> None:
    routes = parse(EXAMPLE).routes
    variable_set = {"call": "project_variable.set", "tool": "project_variable", "rule": "tools.project_variable"}
    assert routes.channels_for("proposal.pending", variable_set).destinations == ("security", "ops")
    assert routes.channels_for("proposal.pending", variable_set).because == "notify.tools.project_variable.set"
    rerun = {"call": "rerun_run", "tool": "rerun_run", "rule": "builtin"}
    assert routes.channels_for("proposal.pending", rerun).because == "notify.tools.rerun_run"
    other = {"call": "cancel_run", "tool": "cancel_run", "rule": "builtin"}
    assert routes.channels_for("proposal.pending", other).destinations == ("ops",)
    for event in ("proposal.decided", "proposal.executed", "proposal.failed", "proposal.expired"):
        assert routes.channels_for(event, rerun).destinations == ("dev",)


def test_a_per_rule_route_would_win_over_every_tool_route() -> None:
    """Policy rules (`[[rules]]`) can hand their channels to the router; nothing sets them yet."""
    from msgspec.structs import replace

    routes = replace(parse(EXAMPLE).routes, rules={"rules[1]": ("dev",)})
    facts = {"call": "rerun_run", "tool": "rerun_run", "rule": "rules[1]"}
    assert routes.channels_for("proposal.pending", facts).destinations == ("dev",)
    assert routes.channels_for("proposal.pending", facts).because == "rule.rules[1]"


def test_the_webhook_hears_every_event(tmp_path: Path) -> None:
    env = {**ENV, "KNECHT_WEBHOOK_URL": "https://hooks.example.com/knecht",
           "KNECHT_WEBHOOK_SECRET": new_webhook_secret()}
    config = parse(EXAMPLE, env)
    assert config.destinations[-1] == WEBHOOK
    assert config.route("proposal.pending", {"call": "cancel_run", "tool": "cancel_run"}) == ("ops", WEBHOOK)
    assert config.route("proposal.expired", {}) == ("dev", WEBHOOK)
    assert env["KNECHT_WEBHOOK_SECRET"] in config.secrets
    only_webhook = load_notify_config(settings_for(tmp_path, webhook_url=env["KNECHT_WEBHOOK_URL"],
                                                   webhook_secret=env["KNECHT_WEBHOOK_SECRET"]))
    assert only_webhook.route("proposal.pending", {"call": "x", "tool": "x"}) == (WEBHOOK,)


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"KNECHT_WEBHOOK_URL": "https://h.example.com/x"}, "KNECHT_WEBHOOK_SECRET is not"),
        ({"KNECHT_WEBHOOK_SECRET": "whsec_" + "A" * 40}, "KNECHT_WEBHOOK_URL is not"),
        ({"KNECHT_WEBHOOK_URL": "https://h.example.com/x", "KNECHT_WEBHOOK_SECRET": "whsec_c2hvcnQ="},
         "at least 24 random bytes"),
        ({"KNECHT_WEBHOOK_URL": "https://h.example.com/x", "KNECHT_WEBHOOK_SECRET": "not base64 at all!"},
         "at least 24 random bytes"),
        ({"KNECHT_WEBHOOK_URL": "ftp://h.example.com/x", "KNECHT_WEBHOOK_SECRET": "whsec_" + "A" * 40},
         "http:// or https://"),
    ],
)
def test_the_webhook_needs_an_http_url_and_a_real_signing_secret(env: dict[str, str], problem: str) -> None:
    message = refused("", env)
    assert problem in message
    assert "A" * 40 not in message


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ('[notify]\npending = ["ops"]', "notify.pending", "unknown channel 'ops'"),
        ('[notify]\nchannels = { ops = "json://h.example.com" }\nproposer = "opps"', "notify.proposer",
         "unknown channel 'opps'; channels: ops"),
        ("[notify]\nsend_to = []", "notify.send_to", "unknown key"),
        ('[notify.channels]\nops = "mailto://me:hunter2@smtp.example.com"', "notify.channels.ops",
         "literal password"),
        ('[notify.channels]\nops = "ntfy://topic?token=tk_live_123456"', "notify.channels.ops",
         "query parameter 'token' holds a literal secret"),
        ('[notify.channels]\nops = "slack://${NOT_SET_ANYWHERE}"', "notify.channels.ops",
         "environment variable NOT_SET_ANYWHERE is not set"),
        ('[notify.channels]\nwebhook = "json://h.example.com"', "notify.channels.webhook", "not 'webhook'"),
        ('[notify.channels]\n"Ops Team" = "json://h.example.com"', "notify.channels.Ops Team", "lower-case"),
        ('[notify.channels]\nops = { url = "json://h.example.com", tags = [] }', "notify.channels.ops.tags",
         "unknown key"),
        ('[notify.channels]\nops = "just text"', "notify.channels.ops", "expected an apprise URL"),
        ('[notify.delivery]\ntimeout = "soon"', "notify.delivery.timeout", "Invalid duration"),
        ("[notify.delivery]\nmax_attempts = 0", "notify.delivery.max_attempts", "from 1 to 100"),
        ("[notify.delivery]\nbackoff = -1", "notify.delivery.backoff", "longer than zero"),
        ('[notify]\npublic_url = "knecht.example.com"', "notify.public_url", "base URL"),
        ("[notify", "syntax error", ""),
    ],
)
def test_a_wrong_setting_is_refused_naming_the_file_and_the_key(text: str, key: str, problem: str) -> None:
    message = refused(text)
    assert message.startswith(f"{PATH}: {key}")
    assert problem in message


def test_a_malformed_channel_url_is_refused_with_what_apprise_said() -> None:
    message = refused('[notify.channels]\nops = "mailto://127.0.0.1:25?from=a@b.c&to=${SMTP_USER}@x.y"',
                      check_channel=check_apprise_url)
    assert message.startswith(f"{PATH}: notify.channels.ops: apprise cannot use this URL")
    unknown = refused('[notify.channels]\nops = "nosuchscheme://x"', check_channel=check_apprise_url)
    assert "notify.channels.ops" in unknown


def test_a_tool_route_must_name_a_served_call() -> None:
    class FakeTool:
        def __init__(self, name: str, actions: tuple[str, ...] = ()) -> None:
            self.name, self.actions = name, actions

    check = served_calls([FakeTool("rerun_run"), FakeTool("project_variable", ("get", "set"))])
    base = '[notify.channels]\nops = "json://h.example.com"\n[notify.tools]\n'
    assert parse(base + 'rerun_run = ["ops"]', check_call=check).routes.tools == {"rerun_run": ("ops",)}
    assert "no tool named 'rerun_runn'" in refused(base + 'rerun_runn = ["ops"]', check_call=check)
    message = refused(base + '"project_variable.sett" = ["ops"]', check_call=check)
    assert "notify.tools.project_variable.sett" in message and "actions: get, set" in message


def test_the_readme_documents_a_config_that_parses() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```toml\n(\[notify\].*?)```", readme, re.DOTALL)
    assert block is not None, "README has no [notify] example"
    names = set(re.findall(r"\$\{([A-Z_]+)\}", block[1]))
    samples = {"SLACK_TOKEN": "T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7FQ", "NTFY_TOPIC": "knecht-dev"}
    env = {name: samples.get(name, "s3cretValue42") for name in names}
    config = parse(block[1], env, check_channel=check_apprise_url)
    assert config.channels and config.routes.pending and config.routes.tools

"""Nothing secret leaves through a notification: a secret variable's value in a proposal, secrets
in arguments, in a rejection's reason and in an execution's error never appear in any delivered
webhook body or mail — only the masked form does."""

from __future__ import annotations

import re
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from mcp_knecht.app import App, open_app
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.settings import load_settings
from mcp_knecht.knecht import secret_values
from mcp_knecht.notify import NotifyWorker, notify_config
from mcp_knecht.notify.channels import destinations
from mcp_knecht.testing import approve, reject
from tests.receivers import Mailbox, WebhookReceiver, text_of
from tests.staging import TEST_TOOLSETS, make_config
from tests.test_knecht_secrets import SECRET_SHAPES
from tests.toolsets import EFFECTS_TABLE

pytestmark = pytest.mark.anyio

AGENT = ("projects:read", "variables:read", "variables:write", "runs:write", "proposals:read")


@pytest.fixture
async def app(demo_env: dict[str, str], tmp_path: Path, webhook_receiver: WebhookReceiver,
              mailbox: Mailbox) -> AsyncIterator[App]:
    config = make_config(tmp_path / "config")
    (config / "knecht.toml").write_text(f"""
[notify]
pending = ["ops"]
proposer = ["ops"]
[notify.channels]
ops = "{mailbox.url()}"
""", encoding="utf-8")
    env = {**demo_env, "KNECHT_CONFIG_DIR": str(config), "KNECHT_TOOLSETS": TEST_TOOLSETS,
           "KNECHT_WEBHOOK_URL": webhook_receiver.url, "KNECHT_WEBHOOK_SECRET": webhook_receiver.secret}
    async with open_app(load_settings(env=env), watch_policy=False) as running:
        async with running.db.transaction() as tx:
            await tx.execute(EFFECTS_TABLE)
        yield running


async def test_no_secret_reaches_any_channel(app: App, webhook_receiver: WebhookReceiver, mailbox: Mailbox) -> None:
    alice = Actor("alice", "claude-code", frozenset(AGENT))
    known = await secret_values(app.db)
    demo_secret = sorted(known)[0]
    new_secret = "sk_live_" + secrets.token_urlsafe(24)
    leaks = {new_secret, "Sup3rS3cretPw", "hunter2hunter2", "ghp_" + "a1B2" * 9, demo_secret}
    slug = (await app.db.fetch_one("SELECT slug FROM projects ORDER BY id LIMIT 1"))["slug"]  # type: ignore[index]

    async def stage(tool: str, arguments: dict[str, object]) -> int:
        staged = await app.gate.call_tool(alice, tool, arguments)
        assert staged.outcome == "staged", staged.text
        return int(staged.data["id"])  # type: ignore[index]

    kept_secret = await stage("project_variable", {"action": "set", "project": slug, "name": "DEPLOY_TOKEN",
                                                   "value": new_secret, "secret": True})
    in_url = await stage("project_variable", {"action": "set", "project": slug, "name": "MIRROR_URL",
                                              "value": "postgres://app:Sup3rS3cretPw@db.internal:5432/app"})
    known_value = await stage("record_effect", {"label": f"rotate {demo_secret}"})
    in_error = await stage("fail_effect", {"label": "password=hunter2hunter2"})
    await approve(app, kept_secret, "bob")
    await reject(app, in_url, f"never paste ghp_{'a1B2' * 9} or password=hunter2hunter2 here", "bob")
    await approve(app, known_value, "bob")
    await approve(app, in_error, "bob")
    failed = await app.proposals.get(in_error)
    assert failed is not None and failed.status == "failed"

    config = notify_config(app.settings, app.registry)
    async with httpx.AsyncClient() as client:
        worker = NotifyWorker(app.db, config, destinations(config, client), scrub=app.secrets)
        assert await worker.run_once() == 2 * 11  # 4 pending, 4 decided, 2 executed, 1 failed; mail and webhook

    bodies = [d.body for d in await webhook_receiver.wait_for(11)]
    mails = [text_of(mail) for mail in await mailbox.wait_for(11)]
    stored = [row["payload_json"] for row in await app.db.fetch_all("SELECT payload_json FROM notify_outbox")]
    for where, text in [*(("webhook", b) for b in bodies), *(("mail", m) for m in mails),
                        *(("outbox", s) for s in stored)]:
        for secret in leaks:
            assert secret not in text, f"a secret reached the {where}: {text}"
        shaped = SECRET_SHAPES.search(text)
        assert shaped is None, f"secret-shaped text in the {where}: {shaped.group(0)!r}"
    everything = "\n".join(bodies + mails)
    assert "DEPLOY_TOKEN" in everything and 'value=\\"***\\"' in everything  # masked, not left out
    assert re.search(r"postgres://app:\*\*\*@db\.internal", everything)
    assert "password=***" in everything

"""Composition root: settings, store, toolsets, policy, gate — assembled once, used by every
transport and by the approval CLI."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio
import msgspec

from mcp_knecht.ai.settings import load_ai_settings
from mcp_knecht.ai.tables import AI_MIGRATIONS
from mcp_knecht.core.approval import ApprovalService
from mcp_knecht.core.audit import Observer
from mcp_knecht.core.changes import ChangeFeed
from mcp_knecht.core.gate import Gate
from mcp_knecht.core.keys import ServerKeys, load_server_keys
from mcp_knecht.core.policy_file import PolicySource
from mcp_knecht.core.prompts import Prompt
from mcp_knecht.core.proposal_watch import ProposalWatcher
from mcp_knecht.core.registry import Registry
from mcp_knecht.core.scopes import ScopeCatalogue, load_scopes
from mcp_knecht.core.scrub import SecretRegistry
from mcp_knecht.core.settings import Settings
from mcp_knecht.core.staging import ProposalStager
from mcp_knecht.core.tools import Tool
from mcp_knecht.core.toolset import Toolset, ToolsetContext, build_toolset, load_factory
from mcp_knecht.errors import ConfigError
from mcp_knecht.features import Features
from mcp_knecht.notify import OutboxWriter, notification_worker
from mcp_knecht.store import Database, open_database
from mcp_knecht.store.audit_log import AuditChain, AuditLog
from mcp_knecht.store.changes import open_change_feed
from mcp_knecht.store.migrations import apply_migrations
from mcp_knecht.store.proposals import SqlProposalRepository

if TYPE_CHECKING:
    from mcp_knecht.ai.runtime import AiRuntime
    from mcp_knecht.chat import ChatService

logger = logging.getLogger(__name__)

FOLLOWUP_TOOLSET = "mcp_knecht.followup:toolset"

SERVER_INSTRUCTIONS = (
    "mcp-knecht gives you tools over the data of the systems named below. You only see the tools your "
    "token allows, and every call is audited."
)


class App(msgspec.Struct, frozen=True):
    """The assembled server: store, audit log, registry, policy, gate and services."""
    settings: Settings
    db: Database
    audit: AuditLog
    registry: Registry
    policy: PolicySource
    proposals: SqlProposalRepository
    gate: Gate
    watcher: ProposalWatcher
    catalogue: ScopeCatalogue
    prompts: tuple[Prompt, ...]
    secrets: SecretRegistry
    changes: ChangeFeed
    toolsets: tuple[Toolset, ...]
    keys: ServerKeys
    approvals: ApprovalService
    features: Features
    """The AI runtime and the chat, built on first use (`mcp_knecht.features`)."""

    @property
    def ai(self) -> AiRuntime:
        """AI features over this gate (issue 14): model roles, the loop, the failure diagnosis."""
        return self.features.ai

    @property
    def chat(self) -> ChatService:
        """The chat (issue 15): owned conversations over the gate, and the follow-up after each decision."""
        return self.features.chat

    @property
    def instructions(self) -> str:
        """The MCP instructions: what the server is, then what each toolset adds."""
        return "\n\n".join([SERVER_INSTRUCTIONS, *(t.instructions for t in self.toolsets if t.instructions)])

    async def close_toolsets(self) -> None:
        await _close(self.toolsets)


async def _close(toolsets: Iterable[Toolset]) -> None:
    for toolset in toolsets:
        if toolset.close is not None:
            await toolset.close()


async def load_toolsets(context: ToolsetContext) -> list[Toolset]:
    """Build each toolset, create its tables, start it; on any failure release what was opened."""
    loaded: list[Toolset] = []
    try:
        for spec in (*context.settings.toolsets, FOLLOWUP_TOOLSET):
            loaded.append(await build_toolset(load_factory(spec), context))
        await apply_migrations(context.store, *(t.migrations for t in loaded if t.migrations is not None))
        for toolset in loaded:
            if toolset.start is not None:
                await toolset.start()
    except BaseException:
        await _close(loaded)
        raise
    return loaded


async def assemble(
    settings: Settings, db: Database, audit: AuditLog, changes: ChangeFeed, *, extra_tools: Iterable[Tool] = (),
    observe: Observer | None = None,
) -> App:
    """Everything but the background tasks; fails closed on any config problem (and then releases
    whatever the toolsets had opened)."""
    catalogue = load_scopes(settings.scopes_dir)
    secrets = SecretRegistry()
    keys = audit.chain.keys
    proposals = SqlProposalRepository(db, audit.chain, on_status=OutboxWriter(secrets))  # notify: same transaction
    toolsets = await load_toolsets(ToolsetContext(store=db, settings=settings, scrubber=secrets, changes=changes,
                                                  proposals=proposals))
    try:
        registry = Registry([*(tool for ts in toolsets for tool in ts.tools), *extra_tools])
        registry.check_scopes(catalogue.scopes)
        prompts = tuple(prompt for ts in toolsets for prompt in ts.prompts)
        for prompt in prompts:
            catalogue.check_known([prompt.scope], f"prompt {prompt.name}")
            if missing := [name for name in prompt.tools if name not in registry]:
                raise ConfigError(f"Prompt {prompt.name} names tools this server does not serve: "
                                  f"{', '.join(missing)}.")
        policy = PolicySource(settings.policy_file, registry)
        ai_settings = load_ai_settings(settings)
    except BaseException:
        await _close(toolsets)
        raise
    stager = ProposalStager(proposals, keys, ttl=settings.proposal_ttl, scrub=secrets)
    gate = Gate(registry, audit, policy=policy, stager=stager, scrub=secrets,
                hash_arguments=lambda text: keys.mac("arguments", text), observe=observe)
    # The watcher reads what the store names as changed (NOTIFY on PostgreSQL, the outbox on SQLite).
    watcher = ProposalWatcher(proposals, changes)
    features = Features(ai_settings, gate=gate, db=db, audit=audit, proposals=proposals, changes=changes,
                        secrets=secrets, keys=keys)
    if features.serves_diagnosis:  # the AI layer's tables, where there are runs to diagnose
        await apply_migrations(db, AI_MIGRATIONS)
    return App(settings, db, audit, registry, policy, proposals, gate, watcher, catalogue, prompts, secrets,
               changes, tuple(toolsets), keys, ApprovalService(proposals, gate, audit, keys), features)


EXPIRY_SWEEP_SECONDS = 30.0


async def _expire_proposals(app: App) -> None:
    """Write (and audit) the expiry of overdue proposals; every reader sees them expired at once anyway."""
    while True:
        try:
            await app.approvals.expire_due()
        except Exception:
            logger.exception("Expiring overdue proposals failed; retrying")
        await anyio.sleep(EXPIRY_SWEEP_SECONDS)


@asynccontextmanager
async def open_app(settings: Settings, *, extra_tools: Iterable[Tool] = (),
                   watch_policy: bool = True, observe: Observer | None = None,
                   blocking_store: bool = False) -> AsyncIterator[App]:
    """The assembled app with its background tasks; `observe` sees every gate outcome (monitoring).
    `blocking_store`: for a CLI that does one thing at a time (`mcp_knecht.store.open_database`)."""
    keys = load_server_keys(settings)
    db = await open_database(settings.database_url, blocking=blocking_store)
    changes = open_change_feed(db)
    try:
        audit = AuditLog(db, AuditChain(keys))
        app = await assemble(settings, db, audit, changes, extra_tools=extra_tools, observe=observe)
        try:  # servers deliver notifications ([notify] checked now: fails closed); the CLIs only write the outbox
            notifications = notification_worker(app) if watch_policy else None
        except BaseException:
            await app.close_toolsets()
            raise
        failure: Exception | None = None
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(audit.run)
            if watch_policy:
                tasks.start_soon(app.policy.watch)
                tasks.start_soon(app.watcher.run)
                tasks.start_soon(_expire_proposals, app)
                tasks.start_soon(app.features.run)  # with a model: diagnoses, the chat's follow-ups
            if notifications is not None:
                tasks.start_soon(notifications)
            try:
                yield app
            except Exception as exc:  # re-raised below as itself, not wrapped in an ExceptionGroup
                failure = exc
            finally:
                tasks.cancel_scope.cancel()
                await audit.aclose()
                await app.close_toolsets()
                await app.features.aclose()
        if failure is not None:
            raise failure
    finally:
        await changes.aclose()
        await db.close()

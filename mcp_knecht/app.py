"""Composition root: config, store, toolsets, policy, gate — assembled once, used by every
transport and by the approval CLI."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio

from mcp_knecht.config import Settings
from mcp_knecht.core.gate import Gate
from mcp_knecht.core.policy_file import PolicySource
from mcp_knecht.core.prompts import Prompt
from mcp_knecht.core.proposal_watch import ProposalWatcher
from mcp_knecht.core.registry import Registry
from mcp_knecht.core.scopes import ScopeCatalogue, load_scopes
from mcp_knecht.core.scrub import SecretRegistry
from mcp_knecht.core.staging import ProposalStager
from mcp_knecht.core.tools import Tool
from mcp_knecht.core.toolset import Toolset, ToolsetContext, build_toolset, load_factory
from mcp_knecht.notify import OutboxWriter, notification_worker
from mcp_knecht.store import Database, open_database
from mcp_knecht.store.audit_log import AuditLog
from mcp_knecht.store.notify import decision_notifier
from mcp_knecht.store.proposals import SqlProposalRepository

FOLLOWUP_TOOLSET = "mcp_knecht.followup:toolset"


@dataclass(frozen=True)
class App:
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
    toolsets: tuple[Toolset, ...]

    async def close_toolsets(self) -> None:
        await _close(self.toolsets)


async def _close(toolsets: Iterable[Toolset]) -> None:
    for toolset in toolsets:
        if toolset.close is not None:
            await toolset.close()


async def load_toolsets(settings: Settings, db: Database, secrets: SecretRegistry) -> list[Toolset]:
    context = ToolsetContext(db=db, secrets=secrets, config_dir=settings.config_dir, env=settings.env)
    loaded: list[Toolset] = []
    try:
        for spec in (*settings.toolsets, FOLLOWUP_TOOLSET):
            loaded.append(await build_toolset(load_factory(spec), context))
    except BaseException:
        await _close(loaded)
        raise
    return loaded


async def assemble(
    settings: Settings, db: Database, audit: AuditLog, *, extra_tools: Iterable[Tool] = ()
) -> App:
    """Everything but the background tasks; fails closed on any config problem (and then releases
    whatever the toolsets had opened)."""
    catalogue = load_scopes(settings.scopes_dir)
    secrets = SecretRegistry()
    toolsets = await load_toolsets(settings, db, secrets)
    try:
        registry = Registry([*(tool for ts in toolsets for tool in ts.tools), *extra_tools])
        registry.check_scopes(catalogue.scopes)
        prompts = tuple(prompt for ts in toolsets for prompt in ts.prompts)
        for prompt in prompts:
            catalogue.check_known([prompt.scope], f"prompt {prompt.name}")
        policy = PolicySource(settings.policy_file, registry)
    except BaseException:
        await _close(toolsets)
        raise
    proposals = SqlProposalRepository(db, on_status=OutboxWriter(secrets))  # notifications: same transaction
    stager = ProposalStager(proposals, ttl=settings.proposal_ttl, scrub=secrets)
    gate = Gate(registry, audit, policy=policy, stager=stager, scrub=secrets)
    watcher = _proposal_watcher(proposals, db)
    return App(settings, db, audit, registry, policy, proposals, gate, watcher, catalogue, prompts, secrets,
               tuple(toolsets))


def _proposal_watcher(proposals: SqlProposalRepository, db: Database) -> ProposalWatcher:
    """On PostgreSQL a NOTIFY wakes the watcher at once (and it still looks every 5 s); elsewhere
    it looks twice a second."""
    if db.dialect != "postgresql":
        return ProposalWatcher(proposals)
    notifier = decision_notifier(db)
    return ProposalWatcher(proposals, interval=5.0, wakeups=lambda: notifier.watching(None))


@asynccontextmanager
async def open_app(settings: Settings, *, extra_tools: Iterable[Tool] = (),
                   watch_policy: bool = True) -> AsyncIterator[App]:
    db = await open_database(settings.database_url)
    try:
        audit = AuditLog(db)
        app = await assemble(settings, db, audit, extra_tools=extra_tools)
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
        if failure is not None:
            raise failure
    finally:
        await db.close()

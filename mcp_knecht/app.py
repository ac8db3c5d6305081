"""Composition root: config, store, toolsets, gate — assembled once, used by every transport."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio

from mcp_knecht.config import Settings
from mcp_knecht.core.gate import Gate
from mcp_knecht.core.registry import Registry
from mcp_knecht.core.scopes import ScopeCatalogue, load_scopes
from mcp_knecht.core.tools import Tool
from mcp_knecht.store import Database, open_database
from mcp_knecht.store.audit_log import AuditLog


@dataclass(frozen=True)
class App:
    settings: Settings
    db: Database
    audit: AuditLog
    registry: Registry
    gate: Gate
    catalogue: ScopeCatalogue


def build_registry(db: Database, extra_tools: Iterable[Tool] = ()) -> Registry:
    from mcp_knecht.knecht.tools import knecht_tools

    return Registry([*knecht_tools(db), *extra_tools])


@asynccontextmanager
async def open_app(settings: Settings, *, extra_tools: Iterable[Tool] = ()) -> AsyncIterator[App]:
    catalogue = load_scopes(settings.scopes_dir)
    db = await open_database(settings.database_url)
    try:
        registry = build_registry(db, extra_tools)
        registry.check_scopes(catalogue.scopes)
        audit = AuditLog(db)
        gate = Gate(registry, audit)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(audit.run)
            try:
                yield App(settings, db, audit, registry, gate, catalogue)
            finally:
                tasks.cancel_scope.cancel()
                await audit.aclose()
    finally:
        await db.close()

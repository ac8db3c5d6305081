"""The server's AI features — the AI runtime (issue 14) and the chat (issue 15) — built on first use.

A stdio server that answers an MCP client uses neither: it never imports them (about 35 ms of its
cold start). What the server must know at start is known without them: the AI settings (checked
then, so a bad one stops the server; the API keys join the output scrubber then) and whether the
failure diagnosis is served (its tables are created then). Their background work — the diagnosis
worker, the chat's follow-ups — exists only where a model is configured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from mcp_knecht.ai.settings import AiSettings
from mcp_knecht.ai.tables import DIAGNOSIS_TOOLS
from mcp_knecht.core.audit import AuditSink
from mcp_knecht.core.changes import ChangeFeed
from mcp_knecht.core.database import Database
from mcp_knecht.core.gate import Gate
from mcp_knecht.core.keys import ServerKeys
from mcp_knecht.core.proposals import ProposalRepository
from mcp_knecht.core.scrub import SecretRegistry

if TYPE_CHECKING:
    from mcp_knecht.ai.runtime import AiRuntime
    from mcp_knecht.chat import ChatService


class Features:
    def __init__(self, settings: AiSettings, *, gate: Gate, db: Database, audit: AuditSink,
                 proposals: ProposalRepository, changes: ChangeFeed, secrets: SecretRegistry, keys: ServerKeys) -> None:
        self.settings = settings
        self._keys = keys
        self._gate = gate
        self._db = db
        self._audit = audit
        self._proposals = proposals
        self._changes = changes
        self._secrets = secrets
        secrets.add(settings.secret_values())
        self._ai: AiRuntime | None = None
        self._chat: ChatService | None = None

    @property
    def serves_diagnosis(self) -> bool:
        """True when the gate serves the failure diagnosis's tools (the Knecht toolset is loaded)."""
        return all(name in self._gate.registry for name in DIAGNOSIS_TOOLS)

    @property
    def ai(self) -> AiRuntime:
        if self._ai is None:
            from mcp_knecht.ai.runtime import AiRuntime

            # Not `AiRuntime.create`: the keys joined the scrubber at start (another add recompiles it).
            self._ai = AiRuntime(self.settings, gate=self._gate, db=self._db, scrub=self._secrets)
        return self._ai

    @property
    def chat(self) -> ChatService:
        if self._chat is None:
            from mcp_knecht.chat import ChatService

            self._chat = ChatService(db=self._db, gate=self._gate, audit=self._audit, proposals=self._proposals,
                                     changes=self._changes, models=self.ai.models, keys=self._keys, scrub=self._secrets,
                                     timeout=self.settings.timeout)
        return self._chat

    async def run(self) -> None:
        """Background work until cancelled, in a server's task group: the diagnosis worker (when on)
        and on-demand diagnoses, the chat's follow-ups. Without a model there is none: nothing can
        be diagnosed, no chat needs following up."""
        if not self.settings.configured:
            return
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self.ai.run)
            tasks.start_soon(self.chat.followups.run)

    async def aclose(self) -> None:
        """Release the providers' HTTP clients, where a feature was used."""
        if self._ai is not None:
            await self._ai.aclose()

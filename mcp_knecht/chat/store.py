"""Conversations, their messages, and the follow-ups owed to them, in the store.

    chat_conversations   one row per conversation, owned by the subject who started it
    chat_messages        what the person and the assistant said (never tool calls)
    chat_followups       per proposal a conversation staged: waiting → done, with a worker's claim

A turn's messages commit in one transaction, with the conversation (when it is new) and the
follow-up its proposal will need: a conversation never holds a question without its answer. A
follow-up is delivered under a claim — one conditional `UPDATE` that sets an owner and a lease —
and its messages commit in the same transaction as its `done` mark, which is conditional on the
owner still holding the claim: of any number of workers, replicas and restarts, exactly one
delivery commits.

The tables are the chat's (namespace `chat`, sql/<dialect>/), applied on first use, so a server
without a model (and without a chat) never creates them.
"""

from __future__ import annotations

import json
import secrets
from typing import Any, Literal

import anyio
import msgspec

from mcp_knecht.core import clock
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.canonical import canonical_json
from mcp_knecht.core.database import Database, Row, Transaction
from mcp_knecht.core.keys import ServerKeys
from mcp_knecht.core.schema import Migrations
from mcp_knecht.core.stored_json import UNREADABLE, json_object
from mcp_knecht.store.migrations import apply_migrations
from mcp_knecht.store.written_around import as_text

CHAT_MIGRATIONS = Migrations("chat", "mcp_knecht.chat")

Role = Literal["user", "assistant"]
Kind = Literal["message", "followup"]
_TOKEN_TIMES = frozenset({"exp", "iat", "nbf", "jti"})


def new_conversation_id() -> str:
    """Opaque and unguessable: an id says nothing about whose conversation it is, or how many exist."""
    return secrets.token_urlsafe(16)


class Conversation(msgspec.Struct, frozen=True):
    id: str
    subject: str
    title: str
    created_at: str
    updated_at: str

    def shown(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "createdAt": self.created_at, "updatedAt": self.updated_at}


class Message(msgspec.Struct, frozen=True):
    role: Role
    content: str
    kind: Kind = "message"
    at: str = ""
    proposal_id: int | None = None
    action: dict[str, Any] | None = None

    def shown(self) -> dict[str, Any]:
        """`{"role", "content", "at"}`, plus `followUp` on Knecht's follow-ups and `action` (the page it
        opened) on an assistant message that staged a proposal."""
        shown: dict[str, Any] = {"role": self.role, "content": self.content, "at": self.at}
        if self.kind == "followup":
            shown["followUp"] = True
        if self.action is not None:
            shown["action"] = self.action
        return shown


class Exchange(msgspec.Struct, frozen=True):
    """What one turn adds to a conversation: the message it answered, the reply, and the proposal the
    reply staged (with who will be followed up when it is decided)."""

    asked: str
    reply: str
    asked_kind: Kind = "message"
    proposal_id: int | None = None
    action: dict[str, Any] | None = None
    actor: Actor | None = None
    """Who the follow-up turn runs as, when `proposal_id` is set: the person who chatted."""


class FollowUp(msgspec.Struct, frozen=True):
    proposal_id: int
    conversation_id: str
    actor: Actor | None
    """None when its seal does not hold: the row was written around the store, and no turn runs as it."""
    status: str
    attempts: int
    owner: str | None


def _actor_json(actor: Actor) -> str:
    claims = {k: v for k, v in actor.claims.items() if k not in _TOKEN_TIMES}
    return json.dumps({"subject": actor.subject, "client": actor.client, "scopes": sorted(actor.scopes),
                       "claims": claims}, ensure_ascii=False, default=str)


FOLLOWUP_SEAL = "chat-followup"


def _sealed(proposal_id: object, conversation_id: object, actor_json: object) -> str:
    """What a follow-up's seal covers: who its turn runs as, for which proposal, in which conversation."""
    return canonical_json([proposal_id, conversation_id, actor_json])


def _actor(text: str) -> Actor:
    data = json.loads(text)
    return Actor(data["subject"], data["client"], frozenset(data["scopes"]), claims=dict(data.get("claims") or {}))


def _conversation(row: Row) -> Conversation:
    return Conversation(row["id"], row["subject"], row["title"], row["created_at"], row["updated_at"])


def _message(row: Row) -> Message:
    action = json_object(row["action_json"])
    if action is not None and set(action) == {UNREADABLE}:  # written around the store: no action to offer
        action = None
    return Message(row["role"], row["content"], row["kind"], row["created_at"], row["proposal_id"], action)


class ChatStore:
    def __init__(self, db: Database, keys: ServerKeys) -> None:
        self.db = db
        self._keys = keys
        self._ready = False
        self._lock = anyio.Lock()

    async def ready(self) -> None:
        """Apply the chat's migrations, once per process, on first use."""
        if not self._ready:
            async with self._lock:
                if not self._ready:
                    await apply_migrations(self.db, CHAT_MIGRATIONS)
                    self._ready = True

    # --- conversations, as their owner sees them ------------------------------------------------------

    async def conversation(self, conversation_id: str, subject: str) -> Conversation | None:
        """The conversation if `subject` owns it; another subject's is None, exactly like a missing one."""
        row = await self.db.fetch_one("SELECT * FROM chat_conversations WHERE id = ? AND subject = ?",
                                      (conversation_id, subject))
        return _conversation(row) if row else None

    async def conversations(self, subject: str, limit: int) -> list[Conversation]:
        """The subject's conversations, the most recently active first."""
        rows = await self.db.fetch_all(
            "SELECT * FROM chat_conversations WHERE subject = ? ORDER BY updated_at DESC, id LIMIT ?", (subject, limit))
        return [_conversation(row) for row in rows]

    async def messages(self, conversation_id: str, limit: int | None = None) -> list[Message]:
        """Oldest first; with `limit`, the newest `limit` of them."""
        if limit is None:
            rows = await self.db.fetch_all(
                "SELECT * FROM chat_messages WHERE conversation_id = ? ORDER BY id", (conversation_id,))
            return [_message(row) for row in rows]
        rows = await self.db.fetch_all(
            "SELECT * FROM chat_messages WHERE conversation_id = ? ORDER BY id DESC LIMIT ?", (conversation_id, limit))
        return [_message(row) for row in reversed(rows)]

    async def history(self, conversation_id: str, subject: str, limit: int) -> list[Message] | None:
        """The newest `limit` messages of a conversation `subject` owns (oldest first), in one query; None
        for an unknown or another subject's conversation (every conversation holds its first exchange)."""
        rows = await self.db.fetch_all(
            "SELECT m.* FROM chat_messages m JOIN chat_conversations c ON c.id = m.conversation_id"
            " WHERE c.id = ? AND c.subject = ? ORDER BY m.id DESC LIMIT ?", (conversation_id, subject, limit))
        return [_message(row) for row in reversed(rows)] if rows else None

    async def record_turn(self, conversation_id: str | None, subject: str, title: str, exchange: Exchange) -> str:
        """Store a turn; a new conversation (`conversation_id` None) is created with it. Returns its id."""
        now = clock.timestamp()
        async with self.db.transaction() as tx:
            if conversation_id is None:
                conversation_id = new_conversation_id()
                # `subject` first: PostgreSQL's store takes `INSERT … (id, …` for explicit numeric ids.
                await tx.execute(
                    "INSERT INTO chat_conversations (subject, id, title, created_at, updated_at)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (subject, conversation_id, title, now, now))
            await self._append(tx, conversation_id, exchange, now)
        return conversation_id

    async def _append(self, tx: Transaction, conversation_id: str, exchange: Exchange, now: str) -> None:
        action = json.dumps(exchange.action, ensure_ascii=False) if exchange.action is not None else None
        await tx.execute(
            "INSERT INTO chat_messages (conversation_id, role, kind, content, proposal_id, action_json, created_at)"
            " VALUES (?, 'user', ?, ?, NULL, NULL, ?), (?, 'assistant', 'message', ?, ?, ?, ?)",
            (conversation_id, exchange.asked_kind, exchange.asked, now,
             conversation_id, exchange.reply, exchange.proposal_id, action, now))
        await tx.execute("UPDATE chat_conversations SET updated_at = ? WHERE id = ?", (now, conversation_id))
        if exchange.proposal_id is not None and exchange.actor is not None:
            # "Already pending" points at a proposal another turn staged: that turn's follow-up stands.
            actor_json = _actor_json(exchange.actor)
            await tx.execute(
                "INSERT INTO chat_followups (proposal_id, conversation_id, actor_json, actor_seal, created_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (proposal_id) DO NOTHING",
                (exchange.proposal_id, conversation_id, actor_json,
                 self._keys.mac(FOLLOWUP_SEAL, _sealed(exchange.proposal_id, conversation_id, actor_json)), now))

    # --- follow-ups --------------------------------------------------------------------------------------

    async def due(self, now: str, limit: int) -> list[int]:
        """Waiting follow-ups whose proposal is decided (succeeded, failed, rejected, expired — also an
        overdue pending one, which every reader sees as expired) and that nobody holds a claim on."""
        rows = await self.db.fetch_all(
            "SELECT f.proposal_id FROM chat_followups f JOIN proposals p ON p.id = f.proposal_id"
            " WHERE f.status = 'waiting' AND (f.lease_until IS NULL OR f.lease_until < ?)"
            " AND (p.status IN ('succeeded', 'failed', 'rejected', 'expired')"
            "      OR (p.status = 'pending' AND p.expires_at <= ?))"
            " ORDER BY f.proposal_id LIMIT ?", (now, now, limit))
        return [int(row["proposal_id"]) for row in rows]

    async def followup(self, proposal_id: int) -> FollowUp | None:
        row = await self.db.fetch_one("SELECT * FROM chat_followups WHERE proposal_id = ?", (proposal_id,))
        if row is None:
            return None
        row = as_text(row)
        covered = _sealed(row["proposal_id"], row["conversation_id"], row["actor_json"])
        sealed = self._keys.verify(FOLLOWUP_SEAL, covered, row["actor_seal"])
        return FollowUp(int(row["proposal_id"]), row["conversation_id"], _actor(row["actor_json"]) if sealed else None,
                        row["status"], int(row["attempts"]), row["owner"])

    async def claim(self, proposal_id: int, owner: str, *, now: str, lease_until: str) -> bool:
        """Make `owner` the one to deliver this follow-up until `lease_until`: True for exactly one of any
        racing claimants (a lapsed lease — its worker stopped — may be taken over)."""
        async with self.db.transaction() as tx:
            return await tx.execute(
                "UPDATE chat_followups SET owner = ?, lease_until = ?, attempts = attempts + 1"
                " WHERE proposal_id = ? AND status = 'waiting' AND (lease_until IS NULL OR lease_until < ?)",
                (owner, lease_until, proposal_id, now)) == 1

    async def deliver(self, proposal_id: int, owner: str, conversation_id: str, exchange: Exchange, *,
                      error: str | None = None) -> bool:
        """Commit the follow-up's messages with its `done` mark, only while `owner` holds the claim.
        False (and nothing written) when the claim was lost or the follow-up was delivered already."""
        now = clock.timestamp()
        async with self.db.transaction() as tx:
            if await tx.execute(
                "UPDATE chat_followups SET status = 'done', owner = NULL, lease_until = NULL, done_at = ?, error = ?"
                " WHERE proposal_id = ? AND owner = ? AND status = 'waiting'",
                (now, error, proposal_id, owner)) != 1:
                return False
            await self._append(tx, conversation_id, exchange, now)
        return True

    async def abandon(self, proposal_id: int, owner: str, *, error: str) -> None:
        """Nothing can be delivered (the proposal or the conversation is gone): done, without messages."""
        async with self.db.transaction() as tx:
            await tx.execute(
                "UPDATE chat_followups SET status = 'done', owner = NULL, lease_until = NULL, done_at = ?, error = ?"
                " WHERE proposal_id = ? AND owner = ? AND status = 'waiting'",
                (clock.timestamp(), error, proposal_id, owner))

    async def retry_later(self, proposal_id: int, owner: str, *, until: str, error: str) -> None:
        """Give the claim up, and let nobody take it before `until` (a failed model: back off)."""
        async with self.db.transaction() as tx:
            await tx.execute(
                "UPDATE chat_followups SET owner = NULL, lease_until = ?, error = ?"
                " WHERE proposal_id = ? AND owner = ? AND status = 'waiting'", (until, error, proposal_id, owner))

    async def release(self, proposal_id: int, owner: str) -> None:
        """Hand a claim back at once (shutdown): the next worker need not wait for the lease, and the
        attempt does not count."""
        async with self.db.transaction() as tx:
            await tx.execute(
                "UPDATE chat_followups SET owner = NULL, lease_until = NULL, attempts = attempts - 1"
                " WHERE proposal_id = ? AND owner = ? AND status = 'waiting'", (proposal_id, owner))

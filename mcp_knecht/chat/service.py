"""The chat: owned conversations, one turn per message, and the follow-up after each decision.

    reply = await chat.send(actor, "Why did the last nightly run fail?")        # a new conversation
    reply = await chat.send(actor, "Re-run it, please.", reply.conversation_id)  # ends with a proposal
    reply.action   # {"path": "/proposals/12", "queryParams": {"aiAction": "create", …}}
    …an operator approves #12…  → the follow-up worker appends "Update from Knecht on proposal #12 …"
                                   and the assistant's answer to it, once

Turns run as the caller (the token's or the web session's actor) with the model of role `default`.
A conversation is the subject's: another subject's id is refused exactly like an unknown one.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import msgspec

from mcp_knecht.ai.errors import FeatureError, FeatureUnavailable
from mcp_knecht.ai.models import ModelResolver, ResolvedModel
from mcp_knecht.ai.settings import Role
from mcp_knecht.chat.actions import action_for
from mcp_knecht.chat.errors import ChatError, ConversationNotFound, RoundLimitError
from mcp_knecht.chat.followups import FollowUpWorker
from mcp_knecht.chat.store import ChatStore, Conversation, Exchange, Kind, Message
from mcp_knecht.chat.texts import follow_up_message, gave_up_reply, staged_reply
from mcp_knecht.core import clock
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.audit import AuditEntry, AuditSink
from mcp_knecht.core.changes import ChangeFeed
from mcp_knecht.core.database import Database
from mcp_knecht.core.gate import Gate
from mcp_knecht.core.keys import ServerKeys
from mcp_knecht.core.proposals import ProposalRepository

logger = logging.getLogger(__name__)

CHAT_SCOPE = "ai:chat"
CHAT_ROLE: Role = "default"
HISTORY_LIMIT = 40
HISTORY_CHARS = 60_000
"""What of a conversation goes with a new message: its newest messages, at most this many, this long."""
MAX_MESSAGE_CHARS = 8_000
MAX_REPLY_CHARS = 16_000
MAX_ATTEMPTS = 3
"""Tries of a follow-up turn before the follow-up is delivered with a note instead of an answer."""
RETRY_AFTER = timedelta(seconds=30)
_TITLE_CHARS = 60


def recent(messages: list[Message]) -> list[Message]:
    """The newest messages that fit `HISTORY_CHARS` (the turn drops a cut that begins with a reply)."""
    kept: list[Message] = []
    size = 0
    for message in reversed(messages):
        size += len(message.content)
        if size > HISTORY_CHARS:
            break
        kept.append(message)
    return kept[::-1]


def title_of(message: str) -> str:
    words = " ".join(message.split())
    return words if len(words) <= _TITLE_CHARS else words[:_TITLE_CHARS - 1].rstrip() + "…"


class ChatReply(msgspec.Struct, frozen=True):
    conversation_id: str
    reply: str
    action: dict[str, Any] | None = None
    proposal_id: int | None = None

    def shown(self) -> dict[str, Any]:
        """The contract's shape: `{"conversationId", "reply", "action"?}`."""
        shown: dict[str, Any] = {"conversationId": self.conversation_id, "reply": self.reply}
        if self.action is not None:
            shown["action"] = self.action
        return shown


class ChatService:
    def __init__(self, *, db: Database, gate: Gate, audit: AuditSink, proposals: ProposalRepository,
                 changes: ChangeFeed, models: ModelResolver, keys: ServerKeys,
                 scrub: Callable[[str], str] = lambda text: text,
                 timeout: float = 60.0, retry_after: timedelta = RETRY_AFTER,
                 worker_options: Mapping[str, Any] | None = None) -> None:
        """`retry_after`: the back-off after a failed follow-up turn (times the tries so far)."""
        self.store = ChatStore(db, keys)
        self.gate = gate
        self.models = models
        self.proposals = proposals
        self._audit = audit
        self._scrub = scrub
        self.timeout = timeout
        self.retry_after = retry_after
        self.followups = FollowUpWorker(self, changes, **dict(worker_options or {}))

    @property
    def configured(self) -> bool:
        """A model is set for the chat (role `default`): the endpoint answers, the worker runs."""
        return self.models.configured(CHAT_ROLE)

    def model(self) -> ResolvedModel:
        """The chat's model; `FeatureUnavailable` (naming the variable to set) when there is none."""
        return self.models.resolve(CHAT_ROLE)

    # --- the person's side -------------------------------------------------------------------------------

    async def send(self, actor: Actor, message: str, conversation_id: str | None = None) -> ChatReply:
        """One turn on `message`, in a new conversation or one of `actor`'s own."""
        resolved = self.model()
        await self.store.ready()
        history: list[Message] = []
        if conversation_id is not None:
            found = await self.store.history(conversation_id, actor.subject, HISTORY_LIMIT)
            if found is None:
                raise _not_found(conversation_id)
            history = recent(found)
        exchange = await self._turn(resolved, history, message, actor, asked_kind="message")
        stored = await self.store.record_turn(conversation_id, actor.subject, title_of(message), exchange)
        return ChatReply(stored, exchange.reply, exchange.action, exchange.proposal_id)

    async def conversations(self, actor: Actor, limit: int = 50) -> list[Conversation]:
        await self.store.ready()
        return await self.store.conversations(actor.subject, limit)

    async def conversation(self, actor: Actor, conversation_id: str) -> tuple[Conversation, list[Message]]:
        await self.store.ready()
        return await self._own(actor, conversation_id), await self.store.messages(conversation_id)

    async def _own(self, actor: Actor, conversation_id: str) -> Conversation:
        found = await self.store.conversation(conversation_id, actor.subject)
        if found is None:
            raise _not_found(conversation_id)
        return found

    async def _turn(self, resolved: ResolvedModel, history: Sequence[Message], message: str, actor: Actor, *,
                    asked_kind: Kind) -> Exchange:
        from mcp_knecht.chat.turn import run_turn  # pydantic-ai loads only when a turn runs

        outcome = await run_turn(history, message, actor, gate=self.gate, audit=self._audit, model=resolved.model,
                                 model_name=resolved.name, settings=resolved.settings, timeout=resolved.timeout,
                                 scrub=self._scrub)
        if outcome.staged is None:
            reply = self._scrub(outcome.reply or "")[:MAX_REPLY_CHARS]
            return Exchange(message, reply, asked_kind)
        proposal_id = int((outcome.staged.data or {})["id"])
        proposal = await self.proposals.get(proposal_id)
        if proposal is None:  # staged a moment ago, in a committed transaction
            raise ChatError(f"Proposal #{proposal_id} was staged but cannot be read back.")
        created = outcome.staged.text.startswith("Submitted for approval")
        return Exchange(message, staged_reply(proposal, created=created), asked_kind, proposal_id=proposal_id,
                        action=action_for(proposal, self.gate.registry.get(proposal.tool)), actor=actor)

    # --- the follow-up (run by the worker, under its claim) -------------------------------------------------

    async def follow_up(self, proposal_id: int, owner: str) -> bool:
        """Deliver the follow-up of a decided proposal that `owner` has claimed: the follow-up message and
        the assistant's turn on it, committed with the `done` mark while the claim holds. True when this
        call delivered it. A turn that fails is tried again later, at most `MAX_ATTEMPTS` times; then the
        follow-up is delivered with a note in place of the answer, so the person still learns the outcome."""
        followup = await self.store.followup(proposal_id)
        if followup is None or followup.owner != owner or followup.status != "waiting":
            return False
        if followup.actor is None:
            return await self._refuse(proposal_id, owner)
        proposal = await self.proposals.get(proposal_id)
        conversation = await self.store.conversation(followup.conversation_id, followup.actor.subject)
        if proposal is None or conversation is None:
            logger.error("Follow-up of proposal #%s: its proposal or conversation is gone", proposal_id)
            await self.store.abandon(proposal_id, owner, error="the proposal or the conversation is gone")
            return False
        note = follow_up_message(proposal, self._scrub)
        error: str | None = None
        try:
            history = recent(await self.store.messages(conversation.id, HISTORY_LIMIT))
            exchange = await self._turn(self.model(), history, note, followup.actor, asked_kind="followup")
        except Exception as exc:
            error = _why(exc, proposal_id)
            if followup.attempts < MAX_ATTEMPTS:
                until = clock.timestamp(clock.now() + self.retry_after * followup.attempts)
                await self.store.retry_later(proposal_id, owner, until=until, error=error)
                return False
            exchange = Exchange(note, gave_up_reply(error), "followup")
        delivered = await self.store.deliver(proposal_id, owner, conversation.id, exchange, error=error)
        if delivered:
            try:  # the proposer's agent has seen this outcome: it leaves the MCP inbox (list_proposals unseen)
                await self.proposals.mark_seen(proposal_id)
            except Exception:
                logger.exception("Marking proposal #%s seen failed", proposal_id)
        return delivered

    async def _refuse(self, proposal_id: int, owner: str) -> bool:
        """A follow-up whose seal does not hold: who its turn would run as was written around the store
        (or before follow-ups were sealed). No turn runs; the refusal is audited, and it is done."""
        logger.error("Follow-up of proposal #%s fails its seal: its row was changed outside mcp-knecht; it is "
                     "not followed up (check the database and `mcp-knecht audit verify`)", proposal_id)
        self._audit.record(AuditEntry(source="chat", subject="mcp-knecht", client="follow-up", tool="chat",
                                      outcome="tampered", proposal_id=proposal_id,
                                      detail={"problem": "follow-up seal broken"}))
        await self.store.abandon(proposal_id, owner, error="its seal does not hold: changed outside mcp-knecht")
        return False


def _not_found(conversation_id: str) -> ConversationNotFound:
    """The same answer for an unknown conversation and for another subject's."""
    return ConversationNotFound(f"Conversation {conversation_id[:64]!r} does not exist.")


def _why(exc: Exception, proposal_id: int) -> str:
    """Why a follow-up turn failed, in words fit for the conversation (details go to the log)."""
    if isinstance(exc, FeatureUnavailable):
        return exc.message
    if isinstance(exc, RoundLimitError):
        return "it needed too many steps"
    reference = uuid.uuid4().hex[:12]
    if isinstance(exc, FeatureError):
        logger.warning("Follow-up turn of proposal #%s: %s (reference %s)", proposal_id, exc.message, reference)
        return f"the model did not answer (reference {reference})"
    logger.error("Follow-up turn of proposal #%s failed (reference %s)", proposal_id, reference, exc_info=exc)
    return f"an internal error (reference {reference})"

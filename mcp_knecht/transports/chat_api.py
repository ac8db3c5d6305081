"""The chat over HTTP, beside /mcp (SPEC, "Chat"): the web page's assistant, or any client whose
token holds scope `ai:chat`.

    POST /api/ai/chat                  {"conversationId"?: str, "message": str}
                                       → {"conversationId", "reply", "action"?}
    GET  /api/ai/conversations         → {"conversations": [{"id", "title", "createdAt", "updatedAt"}]}
    GET  /api/ai/conversations/{id}    → {"id", "title", "createdAt", "updatedAt",
                                          "messages": [{"role", "content", "at", "followUp"?, "action"?}]}

Who: `Authorization: Bearer <JWT>` (verified exactly as for /mcp), else the web session (a POST also
needs the page's `X-CSRF-Token`, from this site). Checked in this order; errors are
`{"error": {"code", "message"}}`, and a 5xx message carries a reference to the server log, never
internals:

    401 unauthenticated     no token and no session, or a token we refuse
    403 insufficient_scope  the caller lacks ai:chat
    400 bad_request         invalid JSON, not an object, unknown field, empty or overlong message,
                            a conversationId that is not a string
    503 ai_unavailable      no model configured for the chat (or no key for its provider)
    404 not_found           an unknown conversation, and another subject's: the same answer
    500 chat_round_limit    the model asked for tools a sixth time in one turn (audited)
    500 ai_model/ai_output  the model failed, timed out, or answered nothing
    500 internal            anything else
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from mcp_knecht.ai.errors import FeatureError, FeatureUnavailable
from mcp_knecht.app import App
from mcp_knecht.chat import CHAT_SCOPE, ChatService
from mcp_knecht.chat.errors import ConversationNotFound, RoundLimitError
from mcp_knecht.chat.service import MAX_MESSAGE_CHARS
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.auth import TokenVerifier
from mcp_knecht.transports.decisions_api import ApiError, caller
from mcp_knecht.web import session_actor

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 65_536
MAX_LIST = 100
_NO_STORE = {"Cache-Control": "no-store"}


def _error(status: int, code: str, message: str) -> JSONResponse:
    headers = dict(_NO_STORE)
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer error="invalid_token"'
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def _referenced(status: int, code: str, message: str, *, detail: str,
                trace: BaseException | None = None) -> JSONResponse:
    """A 5xx: the caller gets `message` and a reference; the log gets the detail (and the traceback of
    an unexpected error) under that reference."""
    reference = uuid.uuid4().hex[:12]
    logger.log(logging.ERROR if status == 500 else logging.WARNING, "Chat: %s (reference %s)", detail, reference,
               exc_info=trace)
    return _error(status, code, f"{message} (reference {reference})")


async def _body(request: Request) -> tuple[str, str | None]:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise ApiError(400, "bad_request", f"The body is larger than {MAX_BODY_BYTES} bytes.")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "bad_request", "The body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise ApiError(400, "bad_request", 'The body must be a JSON object: {"message": "…", "conversationId"?: "…"}.')
    if unknown := sorted(set(body) - {"message", "conversationId"}):
        raise ApiError(400, "bad_request", f"Unknown field {unknown[0][:40]!r}; this route takes message and "
                                           "conversationId.")
    message, conversation = body.get("message"), body.get("conversationId")
    if not isinstance(message, str) or not message.strip():
        raise ApiError(400, "bad_request", "`message` must be a non-empty string.")
    if len(message) > MAX_MESSAGE_CHARS:
        raise ApiError(400, "bad_request", f"`message` is longer than {MAX_MESSAGE_CHARS} characters.")
    if conversation is not None and not isinstance(conversation, str):
        raise ApiError(400, "bad_request", "`conversationId` must be a string (or left out for a new conversation).")
    return message.strip(), conversation


class ChatApi:
    def __init__(self, app: App, verifier: TokenVerifier, chat: ChatService) -> None:
        self._app = app
        self._verifier = verifier
        self._chat = chat

    async def _caller(self, request: Request) -> Actor:
        """The bearer token's actor when the request carries one, else the web session's."""
        if "authorization" in request.headers:
            actor = await caller(request, self._verifier)
        elif (found := await session_actor(self._app, request)) is not None:
            actor = found
        else:
            raise ApiError(401, "unauthenticated",
                           "Sign in on the web page (a script also sends the page's X-CSRF-Token), or send "
                           f"`Authorization: Bearer <token>` with scope {CHAT_SCOPE}.")
        if not actor.holds(CHAT_SCOPE):
            raise ApiError(403, "insufficient_scope", f"The assistant needs scope {CHAT_SCOPE}.")
        return actor

    def _available(self) -> None:
        self._chat.model()  # FeatureUnavailable → 503

    async def chat(self, request: Request, actor: Actor) -> JSONResponse:
        message, conversation_id = await _body(request)
        self._available()
        reply = await self._chat.send(actor, message, conversation_id)
        return JSONResponse(reply.shown(), headers=_NO_STORE)

    async def conversations(self, request: Request, actor: Actor) -> JSONResponse:
        raw = request.query_params.get("limit", "50")
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIST:
            raise ApiError(400, "bad_request", f"`limit` must be an integer from 1 to {MAX_LIST}.")
        self._available()
        found = await self._chat.conversations(actor, int(raw))
        return JSONResponse({"conversations": [c.shown() for c in found]}, headers=_NO_STORE)

    async def conversation(self, request: Request, actor: Actor) -> JSONResponse:
        self._available()
        found, messages = await self._chat.conversation(actor, request.path_params["conversation_id"])
        return JSONResponse({**found.shown(), "messages": [m.shown() for m in messages]}, headers=_NO_STORE)

    def _endpoint(self, handler: Callable[[Request, Actor], Awaitable[JSONResponse]]) -> Callable[
            [Request], Awaitable[JSONResponse]]:
        async def endpoint(request: Request) -> JSONResponse:
            try:
                return await handler(request, await self._caller(request))
            except ApiError as exc:
                return _error(exc.status, exc.code, exc.message)
            except ConversationNotFound as exc:
                return _error(404, "not_found", exc.message)
            except FeatureUnavailable as exc:
                return _referenced(503, exc.code, f"The assistant is unavailable: {exc.message}", detail=exc.message)
            except RoundLimitError as exc:
                return _referenced(500, exc.code, exc.message, detail=exc.message)
            except FeatureError as exc:
                return _referenced(500, exc.code, "The assistant's model could not answer; try again in a moment.",
                                   detail=exc.message)
            except Exception as exc:
                return _referenced(500, "internal", "Internal error; the server log has details.",
                                   detail=f"{request.method} {request.url.path[:200]} failed", trace=exc)

        return endpoint

    def routes(self) -> list[Route]:
        return [
            Route("/api/ai/chat", self._endpoint(self.chat), methods=["POST"]),
            Route("/api/ai/conversations", self._endpoint(self.conversations), methods=["GET"]),
            Route("/api/ai/conversations/{conversation_id}", self._endpoint(self.conversation), methods=["GET"]),
        ]


def chat_routes(app: App, verifier: TokenVerifier, *, chat: ChatService | None = None) -> list[Route]:
    """The chat's routes over `app` (its own `ChatService` unless one is given: tests give a scripted model)."""
    return ChatApi(app, verifier, chat or app.chat).routes()


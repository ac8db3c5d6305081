"""What a client without a valid token learns over HTTP.

- The RFC 9728 protected-resource metadata names an authorization server only when there is one:
  `KNECHT_JWT_ISSUER` given as an `https://` (or `http://`) URL, i.e. an identity provider. A
  server that verifies tokens it minted itself names none, so clients do not try OAuth dynamic
  client registration against endpoints this server does not have.
- A 401 from `/mcp` keeps the RFC 6750 shape (`error`, `error_description`, `WWW-Authenticate`)
  but its description says what was wrong (no token, or why the token was refused) and how to get
  one.
"""

from __future__ import annotations

import json
from contextvars import ContextVar
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcp_knecht.core.settings import Settings

_refusal: ContextVar[str | None] = ContextVar("knecht_token_refusal", default=None)


def note_refusal(reason: str) -> None:
    """Remember why this request's token was refused, for the 401 answer."""
    _refusal.set(reason)


def issuer_url(settings: Settings) -> str | None:
    """The token issuer, when it is an authorization server a client can find (a URL)."""
    issuer = settings.jwt_issuer.strip()
    return issuer.rstrip("/") if issuer.startswith(("https://", "http://")) else None


def protected_resource_metadata(resource_url: str, settings: Settings, scopes: list[str]) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "resource": resource_url,
        "scopes_supported": scopes,
        "bearer_methods_supported": ["header"],
        "resource_name": "mcp-knecht",
    }
    if (issuer := issuer_url(settings)) is not None:
        metadata["authorization_servers"] = [issuer]
    return metadata


def token_hint(settings: Settings) -> str:
    if (issuer := issuer_url(settings)) is not None:
        return (f"Tokens come from the identity provider {issuer}; send one as 'Authorization: Bearer <token>' "
                "(e.g. claude mcp add --transport http knecht <url> --header \"Authorization: Bearer $TOKEN\").")
    return ("Send 'Authorization: Bearer <token>' with every request (e.g. claude mcp add --transport http knecht "
            "<url> --header \"Authorization: Bearer $TOKEN\"). This server does not hand out tokens over HTTP: "
            "an admin mints one with `mcp-knecht token mint --sub NAME --profile claude-code`.")


class ExplainUnauthorized:
    """Wraps the ASGI app: a 401 from `path` gets a description a person can act on."""

    def __init__(self, app: ASGIApp, *, path: str, hint: str) -> None:
        self._app = app
        self._path = path
        self._hint = hint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path != self._path and not path.startswith(self._path + "/"):
            await self._app(scope, receive, send)
            return
        _refusal.set(None)
        has_token = any(name == b"authorization" for name, _ in scope.get("headers", ()))
        held: Message | None = None

        async def explaining_send(message: Message) -> None:
            nonlocal held
            if message["type"] == "http.response.start" and message["status"] == 401:
                held = message
                return
            if held is None or message["type"] != "http.response.body":
                await send(message)
                return
            if message.get("more_body", False):
                return  # the SDK's own body is replaced; wait for its end
            body = json.dumps({"error": "invalid_token", "error_description": self._describe(has_token)}).encode()
            headers = [(k, v) for k, v in held.get("headers", []) if k.lower() != b"content-length"]
            await send({**held, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})

        await self._app(scope, receive, explaining_send)

    def _describe(self, has_token: bool) -> str:
        if not has_token:
            return f"No bearer token. {self._hint}"
        reason = _refusal.get()
        return f"The bearer token was refused{': ' + reason.rstrip('.') if reason else ''}. {self._hint}"

"""Web sessions: a signed, expiring cookie that carries a subject and scopes as a token would.

    cookie  = base64url(payload) "." HMAC(server key → "web-session", payload)
    payload = {"sid": …, "sub": …, "scp": [...], "iat": …, "exp": …}
    csrf    = HMAC(server key → "web-csrf", sid)     in every form, and in `X-CSRF-Token` from scripts

The cookie is `HttpOnly`, `SameSite=Strict`, `Path=/`, expires with the session, and over TLS is
`Secure` and named with the `__Host-` prefix. A session is also a row in the store: signing out ends
it on every replica, even if someone kept a copy of the cookie. The key is the server key every
replica already shares, so any replica can check any session.

`Sessions.actor(request)` is the one way a request becomes an `Actor` from a session. Routes outside
the web pages that accept sessions (the chat endpoint: `POST /api/ai/chat` "or a web session holding
ai:chat") call it too: for an unsafe method it also demands the CSRF token.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from mcp_knecht.core import clock
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.keys import ServerKeys
from mcp_knecht.web.store import Grant, SessionRows, WebSchema

WEB_CLIENT = "web"
"""The client name of every session's actor: the audit log shows page reads as `web`."""
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_MAX_COOKIE = 4096


class Session(msgspec.Struct, frozen=True):
    id: str
    subject: str
    scopes: frozenset[str]
    expires: int
    """Unix time."""

    @property
    def actor(self) -> Actor:
        return Actor(self.subject, WEB_CLIENT, self.scopes, claims={"sid": self.id, "exp": self.expires})


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Sessions:
    def __init__(self, schema: WebSchema, keys: ServerKeys, *, ttl: timedelta, public_url: str | None = None) -> None:
        self._rows = SessionRows(schema)
        self._keys = keys
        self._ttl = ttl
        self._public_tls = bool(public_url and public_url.lower().startswith("https://"))

    # --- the cookie ----------------------------------------------------------------------------------

    def secure(self, request: Request) -> bool:
        """Served over TLS (directly, through a proxy uvicorn trusts, or behind an https public URL)."""
        return request.url.scheme == "https" or self._public_tls

    def cookie_name(self, request: Request) -> str:
        return "__Host-knecht-session" if self.secure(request) else "knecht-session"

    def _encode(self, session: Session, issued: int) -> str:
        payload = _b64(json.dumps({"sid": session.id, "sub": session.subject, "scp": sorted(session.scopes),
                                   "iat": issued, "exp": session.expires}, separators=(",", ":")).encode())
        return f"{payload}.{self._keys.mac('web-session', payload)}"

    def _decode(self, value: str) -> Session | None:
        payload, dot, mac = value.partition(".")
        if not dot or len(value) > _MAX_COOKIE or not self._keys.verify("web-session", payload, mac):
            return None
        try:
            data: dict[str, Any] = json.loads(_unb64(payload))
            session = Session(str(data["sid"]), str(data["sub"]), frozenset(map(str, data["scp"])), int(data["exp"]))
        except (ValueError, KeyError, TypeError, binascii.Error):
            return None
        return session if session.expires > int(clock.now().timestamp()) else None

    # --- starting, reading, ending ---------------------------------------------------------------------

    async def start(self, grant: Grant, request: Request, response: Response) -> Session:
        """A new session for `grant`, stored, and its cookie set on `response`."""
        now = clock.now()
        ends = now + self._ttl
        if grant.not_after is not None:
            ends = min(ends, grant.not_after)
        session = Session(secrets.token_urlsafe(18), grant.subject, grant.scopes, int(ends.timestamp()))
        await self._rows.start(session.id, session.subject, clock.timestamp(ends))
        response.set_cookie(
            self.cookie_name(request), self._encode(session, int(now.timestamp())),
            max_age=max(1, int((ends - now).total_seconds())), path="/", httponly=True, samesite="strict",
            secure=self.secure(request),
        )
        return session

    async def current(self, request: Request) -> Session | None:
        """The request's session: signed by us, not expired, not ended."""
        value = request.cookies.get(self.cookie_name(request))
        if not value or (session := self._decode(value)) is None:
            return None
        return session if await self._rows.live(session.id) else None

    async def end(self, session: Session) -> None:
        """End `session` on every replica (its cookie, if someone kept it, is refused from now on)."""
        await self._rows.end(session.id)

    def forget(self, request: Request, response: Response) -> None:
        response.delete_cookie(self.cookie_name(request), path="/", httponly=True, samesite="strict",
                               secure=self.secure(request))

    # --- CSRF ------------------------------------------------------------------------------------------

    def csrf_token(self, session: Session) -> str:
        return self._keys.mac("web-csrf", session.id)

    def csrf_ok(self, session: Session, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(self.csrf_token(session), str(token))

    async def actor(self, request: Request) -> Actor | None:
        """The actor of the request's session, or None. For a state-changing method the request must
        also carry the session's CSRF token in `X-CSRF-Token` (scripts) — forms are checked by the page
        that reads them — and come from our own origin."""
        session = await self.current(request)
        if session is None:
            return None
        if request.method not in SAFE_METHODS and not (
            same_origin(request) and self.csrf_ok(session, request.headers.get(CSRF_HEADER))
        ):
            return None
        return session.actor


def same_origin(request: Request) -> bool:
    """False when the browser says the request came from another origin (`Origin`, else `Referer`)."""
    origin = request.headers.get("origin") or request.headers.get("referer")
    if not origin:
        return True  # not a browser, or a browser that sends neither: the CSRF token still decides
    own = f"{request.url.scheme}://{request.url.netloc}".lower()
    forwarded = {f"https://{request.url.netloc}".lower(), own}
    return any(origin.lower() == o or origin.lower().startswith(o + "/") for o in forwarded)


def expiry_of(claims: dict[str, Any]) -> datetime | None:
    exp = claims.get("exp")
    return datetime.fromtimestamp(exp, UTC) if isinstance(exp, int | float) else None

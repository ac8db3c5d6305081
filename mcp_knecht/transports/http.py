"""Streamable HTTP at /mcp: a bearer token per request, verified by our own verifier.

Without a valid token the SDK answers 401 with `WWW-Authenticate` pointing at the RFC 9728
protected-resource metadata, which we serve at `/.well-known/oauth-protected-resource` (and
at the path-suffixed form the SDK derives); `http_auth` says what goes into both. Stateless mode
keeps no session in memory, so replicas behind a load balancer can answer any request. `/metrics`
(`metrics_route`) has a token of its own.

Sessions (protocol 2025-11-25, stateful mode) are bounded three ways, all settings: per
subject (`KNECHT_SESSIONS_PER_SUBJECT`, beyond it 429), in all (`KNECHT_MAX_SESSIONS`, 503), and
by idleness (`KNECHT_SESSION_IDLE_TIMEOUT`): one subject cannot fill the table for the others.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from typing import TYPE_CHECKING, Any

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcp_knecht.app import App
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.auth import TokenVerifier
from mcp_knecht.core.auth.verifier import VERIFIED_CACHE_SIZE
from mcp_knecht.core.validation import label
from mcp_knecht.errors import AuthError, ConfigError
from mcp_knecht.transports.ai_routes import ai_routes
from mcp_knecht.transports.chat_api import chat_routes
from mcp_knecht.transports.decisions_api import DecisionApi
from mcp_knecht.transports.http_auth import ExplainUnauthorized, note_refusal, protected_resource_metadata, token_hint
from mcp_knecht.transports.mcp_server import server_for_app
from mcp_knecht.transports.metrics_route import metrics_route
from mcp_knecht.web import web_routes

if TYPE_CHECKING:
    from mcp_knecht.observe.metrics import Metrics

MCP_PATH = "/mcp"
logger = logging.getLogger(__name__)


class _SdkTokenVerifier:
    """Adapts our verifier to the SDK's protocol: `None` means "refuse with 401"."""

    def __init__(self, verifier: TokenVerifier) -> None:
        self._verifier = verifier
        self._built: OrderedDict[str, tuple[Actor, AccessToken]] = OrderedDict()

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            actor = await self._verifier.averify(token)
        except AuthError as exc:
            note_refusal(exc.message)
            return None
        # The same Actor object as last time means the verifier's cache vouched for the token again:
        # its AccessToken is the same too (a pydantic model: building one is 20 µs a request).
        built = self._built.get(token)
        if built is not None and built[0] is actor:
            return built[1]
        access = self._access_token(token, actor)
        self._built[token] = (actor, access)
        while len(self._built) > VERIFIED_CACHE_SIZE:
            self._built.popitem(last=False)
        return access

    @staticmethod
    def _access_token(token: str, actor: Actor) -> AccessToken:
        exp = actor.claims.get("exp")
        return AccessToken(
            token=token,
            client_id=actor.client,
            scopes=sorted(actor.scopes),
            expires_at=exp if isinstance(exp, int) else None,
            subject=actor.subject,
            claims=actor.claims,
        )


def _actor_from(token: AccessToken) -> Actor:
    return Actor(
        subject=token.subject or "",
        client=token.client_id,
        scopes=frozenset(token.scopes),
        claims=token.claims or {},
    )


def _resolve_actor(ctx: ServerRequestContext[Any]) -> Actor | None:
    request = ctx.request
    user = request.scope.get("user") if isinstance(request, Request) else None
    if isinstance(user, AuthenticatedUser):
        return _actor_from(user.access_token)
    token = get_access_token()
    return _actor_from(token) if token else None


class SessionLimit:
    """In front of the SDK's session manager: a request that would open a session (no session id,
    protocol 2025-11-25) is refused with 429 once its subject holds `per_subject` sessions — open
    ones and ones being opened — so one subject can never take the table from the others."""

    def __init__(self, app: ASGIApp, manager: StreamableHTTPSessionManager, per_subject: int) -> None:
        self._app = app
        self._manager = manager
        self._per_subject = per_subject
        self._opening: Counter[str] = Counter()

    def open_sessions(self, subject: str) -> int:
        # The SDK keeps who opened each session (to refuse it to anyone else); count from there, so
        # sessions that end by DELETE, idle timeout or a crash are never counted twice or kept.
        owners = self._manager._session_owners  # read only; mcp is pinned to 2.3.x
        return sum(1 for owner in list(owners.values()) if owner.get("subject") == subject) + self._opening[subject]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        subject = _opening_subject(scope)
        if subject is None:
            await self._app(scope, receive, send)
            return
        if self.open_sessions(subject) >= self._per_subject:
            logger.warning("Refused a new session for %s: %d open", label(subject), self._per_subject)
            await _too_many(subject, self._per_subject)(scope, receive, send)
            return
        self._opening[subject] += 1  # counted before any await: concurrent openings see each other
        counted = True

        def uncount() -> None:
            nonlocal counted
            if counted:
                counted = False
                self._opening[subject] -= 1
                if not self._opening[subject]:
                    del self._opening[subject]

        async def send_uncounting(message: Message) -> None:
            # The SDK has put the new session into its table before it answers: from here on the
            # session is counted there (the client may send its next request before this call returns).
            if message["type"] == "http.response.start":
                uncount()
            await send(message)

        try:
            await self._app(scope, receive, send_uncounting)
        finally:
            uncount()


def _opening_subject(scope: Scope) -> str | None:
    """The subject of a request that would open a stateful session, else None."""
    if scope.get("type") != "http":
        return None
    user = scope.get("user")
    if not isinstance(user, AuthenticatedUser):
        return None  # refused with 401 further in
    headers = dict(scope.get("headers") or ())
    if MCP_SESSION_ID_HEADER.encode() in headers:
        return None
    version = headers.get(MCP_PROTOCOL_VERSION_HEADER.encode())
    if version is not None and version.decode("latin-1") not in HANDSHAKE_PROTOCOL_VERSIONS:
        return None  # the sessionless protocol (2026-07-28) opens no session
    return user.access_token.subject or ""


def _too_many(subject: str, limit: int) -> JSONResponse:
    message = (f"Too many open sessions for {label(subject)!r} ({limit}): end one (HTTP DELETE with its "
               "Mcp-Session-Id) or wait until an idle one expires.")
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}}
    return JSONResponse(body, status_code=429, headers={"Retry-After": "60"})


def build_http_app(
    app: App,
    verifier: TokenVerifier,
    *,
    public_url: str,
    stateless: bool = False,
    host: str = "127.0.0.1",
    metrics: Metrics | None = None,
) -> Starlette:
    """The ASGI app. `public_url` is the base URL clients use (it names the protected resource)."""
    settings = app.settings
    server = server_for_app(app, _resolve_actor)
    resource_url = public_url.rstrip("/") + MCP_PATH
    metadata = protected_resource_metadata(resource_url, app.settings, sorted(app.catalogue.scopes))

    async def resource_metadata(request: Request) -> JSONResponse:
        return JSONResponse(metadata)

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    asgi = server.streamable_http_app(
        streamable_http_path=MCP_PATH,
        stateless_http=stateless,
        host=host,
        auth=AuthSettings(
            issuer_url=public_url.rstrip("/"),  # type: ignore[arg-type]
            resource_server_url=resource_url,  # type: ignore[arg-type]
            validate_token_resource=False,  # our verifier checks the audience itself
        ),
        token_verifier=_SdkTokenVerifier(verifier),
        custom_starlette_routes=[
            Route("/healthz", health, methods=["GET"]),
            *ai_routes(app, verifier),
            *chat_routes(app, verifier),
            metrics_route(metrics, app.settings.metrics_token, sessions_open=lambda: _sessions_open(server)),
            *web_routes(app, verifier, public_url=public_url),  # the web page for people
        ],
        max_sessions=settings.max_sessions,
        session_idle_timeout=settings.session_idle_timeout.total_seconds(),
    )
    if not stateless:
        for route in asgi.router.routes:
            if isinstance(route, Route) and route.path == MCP_PATH:  # behind authentication: the user is known
                route.app = SessionLimit(route.app, server.session_manager, settings.sessions_per_subject)
    # Ours first, so both well-known paths describe the same resource with its scopes.
    for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource" + MCP_PATH):
        asgi.router.routes.insert(0, Route(path, resource_metadata, methods=["GET"]))
    asgi.add_middleware(ExplainUnauthorized, path=MCP_PATH, hint=token_hint(app.settings))
    asgi.add_middleware(ServedFirst, prefix=DECISIONS_PREFIX, routes=DecisionApi(app, verifier).routes())
    return asgi


DECISIONS_PREFIX = "/api/proposals"


class ServedFirst:
    """Routes under `prefix` that verify their caller's token themselves, served before the SDK's
    authentication middleware, which would verify the same bearer token once more on every request
    (the decision API: eight racing operators make eight requests per decision)."""

    def __init__(self, app: ASGIApp, *, prefix: str, routes: list[Route]) -> None:
        self._app = app
        self._prefix = prefix
        self._router = Router(routes=routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path == self._prefix or path.startswith(self._prefix + "/"):
            await self._router(scope, receive, send)
            return
        await self._app(scope, receive, send)


def _sessions_open(server: Any) -> int:
    """Stateful sessions the SDK's session manager holds (0 when stateless)."""
    return len(getattr(server.session_manager, "_server_instances", {}))


def _graceful_server(config: Any) -> Any:
    """A uvicorn server that, on SIGTERM or SIGINT, stops serving and returns. uvicorn itself raises
    the signal again once it has shut down, which ends the process at once — before the app's own
    cleanup writes the audit log's last rows (held back, say, while another process locks the store)."""
    import signal
    import threading
    from collections.abc import Iterator
    from contextlib import contextmanager

    import uvicorn

    class GracefulServer(uvicorn.Server):
        @contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            originals = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in originals.items():
                    signal.signal(sig, handler)

    return GracefulServer(config)


async def serve_http(app: App, verifier: TokenVerifier, *, host: str, port: int, stateless: bool,
                     public_url: str | None = None, metrics: Metrics | None = None, json_logs: bool = False) -> None:
    import uvicorn

    base = public_url or f"http://{host}:{port}"
    asgi = build_http_app(app, verifier, public_url=base, stateless=stateless, host=host, metrics=metrics)
    # With JSON logs uvicorn's own records go through the root logger's JSON handler.
    log_config = None if json_logs else uvicorn.config.LOGGING_CONFIG
    # Open live streams (the web page's) must not hold a shutdown forever.
    config = uvicorn.Config(asgi, host=host, port=port, log_level="warning", lifespan="on", log_config=log_config,
                            timeout_graceful_shutdown=5)
    try:
        await _graceful_server(config).serve()
    except SystemExit as exc:  # uvicorn exits when it cannot bind
        raise ConfigError(f"The HTTP server could not start on {host}:{port} (is the port in use?).") from exc

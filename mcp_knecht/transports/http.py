"""Streamable HTTP at /mcp: a bearer token per request, verified by our own verifier.

Without a valid token the SDK answers 401 with `WWW-Authenticate` pointing at the RFC 9728
protected-resource metadata, which we serve at `/.well-known/oauth-protected-resource` (and
at the path-suffixed form the SDK derives); `http_auth` says what goes into both. Stateless mode
keeps no session in memory, so replicas behind a load balancer can answer any request. `/metrics`
(`metrics_route`) has a token of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.context import ServerRequestContext
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from mcp_knecht.app import App
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.auth import TokenVerifier
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


class _SdkTokenVerifier:
    """Adapts our verifier to the SDK's protocol: `None` means "refuse with 401"."""

    def __init__(self, verifier: TokenVerifier) -> None:
        self._verifier = verifier

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            actor = await self._verifier.averify(token)
        except AuthError as exc:
            note_refusal(exc.message)
            return None
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
            *DecisionApi(app, verifier).routes(),
            *ai_routes(app, verifier),
            *chat_routes(app, verifier),
            metrics_route(metrics, app.settings.metrics_token, sessions_open=lambda: _sessions_open(server)),
            *web_routes(app, verifier, public_url=public_url),  # the web page for people
        ],
    )
    # Ours first, so both well-known paths describe the same resource with its scopes.
    for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource" + MCP_PATH):
        asgi.router.routes.insert(0, Route(path, resource_metadata, methods=["GET"]))
    asgi.add_middleware(ExplainUnauthorized, path=MCP_PATH, hint=token_hint(app.settings))
    return asgi


def _sessions_open(server: Any) -> int:
    """Stateful sessions the SDK's session manager holds (0 when stateless)."""
    return len(getattr(server.session_manager, "_server_instances", {}))


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
        await uvicorn.Server(config).serve()
    except SystemExit as exc:  # uvicorn exits when it cannot bind
        raise ConfigError(f"The HTTP server could not start on {host}:{port} (is the port in use?).") from exc

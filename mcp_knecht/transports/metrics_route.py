"""`GET /metrics` on the HTTP server, for Prometheus: behind a token of its own.

The scraper sends `Authorization: Bearer <KNECHT_METRICS_TOKEN>`; MCP tokens (JWTs) do not open it,
and the metrics token opens nothing else. Without KNECHT_METRICS_TOKEN the route answers 404 and
says how to switch it on.

    scrape_configs:
      - job_name: mcp-knecht
        authorization: {credentials_file: /etc/prometheus/knecht-metrics-token}
        static_configs: [{targets: ["knecht-mcp.internal:8765"]}]
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

if TYPE_CHECKING:  # prometheus-client is imported only when metrics are on
    from mcp_knecht.observe.metrics import Metrics

METRICS_PATH = "/metrics"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def _bearer(request: Request) -> str:
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else ""


def metrics_route(metrics: Metrics | None, token: str | None, *,
                  sessions_open: Callable[[], int] | None = None) -> Route:
    if metrics is not None and sessions_open is not None:
        metrics.sessions_open = sessions_open

    async def scrape(request: Request) -> Response:
        if metrics is None or not token:
            return _error(404, "not_found", "Metrics are off: set KNECHT_METRICS_TOKEN on the server and scrape "
                                            f"{METRICS_PATH} with it as a bearer token.")
        if not hmac.compare_digest(_bearer(request).encode(), token.encode()):
            return _error(401, "unauthenticated",
                          f"{METRICS_PATH} needs 'Authorization: Bearer <KNECHT_METRICS_TOKEN>'.",
                          {"WWW-Authenticate": 'Bearer realm="metrics"'})
        return Response(await metrics.render(), media_type=CONTENT_TYPE)

    return Route(METRICS_PATH, scrape, methods=["GET"])

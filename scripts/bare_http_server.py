"""A bare low-level MCP SDK server over Streamable HTTP with one tool: the HTTP baseline.

    python scripts/bare_http_server.py --port 8766 [--stateless] [--arguments '{"project": "payments-api"}']

`scripts/bench_http.py` runs it next to `mcp-knecht serve --transport http`. Its only tool is
`get_project`, served by `build_bare_server` of `scripts/bench_gate.py`: the very same Knecht handler
on the same database (`KNECHT_DATABASE_URL`), arguments parsed once up front, no validation, no
policy, no audit, and no authentication (a bearer token, if sent, is ignored). The HTTP stack is the
real server's: the SDK's `streamable_http_app` with the same session limits, served by uvicorn with
the same settings (one worker, lifespan on, log level warning, graceful shutdown 5 s).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gate import TOOL, build_bare_server, mint


def build_app(app: Any, arguments: dict[str, Any], *, stateless: bool, host: str) -> Any:
    """The SDK's Streamable-HTTP Starlette app of a bare server, plus `/healthz`."""
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from mcp_knecht.core.tools import ToolContext

    tool = app.registry.get(TOOL)
    _, actor = mint(dict(os.environ), "bench-bare", "readonly")
    server = build_bare_server(tool, tool.input_model.model_validate(arguments), ToolContext(actor=actor, source="mcp"))

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    settings = app.settings
    return server.streamable_http_app(
        streamable_http_path="/mcp",
        stateless_http=stateless,
        host=host,
        custom_starlette_routes=[Route("/healthz", health, methods=["GET"])],
        max_sessions=settings.max_sessions,
        session_idle_timeout=settings.session_idle_timeout.total_seconds(),
    )


async def serve(args: argparse.Namespace) -> None:
    import uvicorn

    from mcp_knecht.app import open_app
    from mcp_knecht.core.settings import load_settings

    # The app only for its registry and store: no policy watcher, no proposal or notification workers.
    async with open_app(load_settings(), watch_policy=False) as app:
        asgi = build_app(app, json.loads(args.arguments), stateless=args.stateless, host=args.host)
        config = uvicorn.Config(asgi, host=args.host, port=args.port, log_level="warning", lifespan="on",
                                log_config=uvicorn.config.LOGGING_CONFIG, timeout_graceful_shutdown=5)
        print(f"bare: serving MCP at http://{args.host}:{args.port}/mcp "
              f"({'stateless' if args.stateless else 'sessions'})", file=sys.stderr, flush=True)
        await uvicorn.Server(config).serve()


def main() -> None:
    import anyio

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--stateless", action="store_true")
    parser.add_argument("--arguments", default='{"project": "payments-api"}', metavar="JSON")
    from mcp_knecht.cli.event_loop import FAST_LOOP  # the same event loop as the gated server

    anyio.run(serve, parser.parse_args(), backend_options=FAST_LOOP)


if __name__ == "__main__":
    main()

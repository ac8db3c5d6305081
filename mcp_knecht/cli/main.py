"""`mcp-knecht`: serve, mint tokens, fill demo data.

Imports are local to each command: a stdio server's cold start pays only for what it uses.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from mcp_knecht.cli.errors import EXIT_OK, EXIT_USAGE, report, say
from mcp_knecht.cli.event_loop import FAST_LOOP
from mcp_knecht.errors import KnechtError

if TYPE_CHECKING:
    from mcp_knecht.core.settings import LogFormat

_EPILOG = """\
examples:
  mcp-knecht quickstart                       demo data, a token, client config, HTTP server
  mcp-knecht demo-data                        fill the default SQLite database
  mcp-knecht token mint --sub alice --profile claude-code
  KNECHT_TOKEN=... mcp-knecht serve           stdio (what Claude Code and Cursor launch)
  mcp-knecht serve --transport http --port 8765
  mcp-knecht policy explain rerun_run        which rule decides, and why
  mcp-knecht audit verify                    check the audit hash chain
  mcp-knecht login-link --sub bob --profile operator   sign a person in to the web page
  mcp-knecht diagnose 42                     why run 42 failed (needs KNECHT_MODEL_DEFAULT)
  mcp-knecht notify test                     a test message to every notification channel
"""


def _settings(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from mcp_knecht.core.settings import load_settings

    return load_settings(db=getattr(args, "db", None), config=getattr(args, "config", None))


def _token_settings(settings, *, announce: bool = True):  # type: ignore[no-untyped-def]
    from mcp_knecht.core.auth import load_token_settings

    token_settings = load_token_settings(settings, create_dev_secret=True)
    if announce and token_settings.dev_secret_created:
        say(f"mcp-knecht: generated a dev signing secret at {token_settings.dev_secret_path} (mode 0600).")
    return token_settings


# --- serve -------------------------------------------------------------------------------------


def _cmd_serve(args: argparse.Namespace) -> int:
    import anyio

    from mcp_knecht.cli.startup_heap import collect_later

    collect_later()
    settings = _settings(args)
    log_format = args.log_format or settings.log_format
    token_settings = _token_settings(settings)
    if args.transport == "stdio" and token_settings.key_kind == "secret":
        from mcp_knecht.core.auth.hmac_only import import_jwt_without_cryptography

        import_jwt_without_cryptography()  # 20 ms of the cold start a client waits for at every launch
    from mcp_knecht.core.auth import TokenVerifier

    verifier = TokenVerifier(token_settings)
    if args.transport == "stdio":
        from mcp_knecht.errors import AuthError

        token = (settings.token or "").strip()
        if not token:
            return _refuse_stdio("KNECHT_TOKEN is not set")
        try:
            actor = verifier.verify(token)
        except AuthError as exc:
            return _refuse_stdio(f"KNECHT_TOKEN was refused: {exc.message.rstrip('.')}")
        return anyio.run(_serve_stdio, settings, actor, token_settings.leeway_seconds, log_format)
    return anyio.run(_serve_http, settings, verifier, args, log_format, backend_options=FAST_LOOP)


def _refuse_stdio(problem: str) -> int:
    """No usable token: say so on stderr, and to the client in-band (a session that only explains),
    since clients such as Claude Code show "connection closed" and not the server's stderr."""
    import anyio

    from mcp_knecht.cli.quickstart import renew_hint
    from mcp_knecht.transports.stdio import serve_refusal

    message = (f"mcp-knecht cannot serve: {problem}.\nMint a new token and put it into this client's "
               f"configuration (KNECHT_TOKEN):\n  {renew_hint()}")
    say(message)
    anyio.run(serve_refusal, message)
    return EXIT_USAGE


async def _serve_stdio(  # type: ignore[no-untyped-def]
    settings, actor, leeway_seconds: int, log_format: LogFormat
) -> int:
    from mcp_knecht.app import open_app
    from mcp_knecht.cli.startup_heap import serving
    from mcp_knecht.observe import build_telemetry
    from mcp_knecht.transports.stdio import serve_stdio

    telemetry = build_telemetry(settings, log_format=log_format)
    try:
        async with open_app(settings, observe=telemetry.observe) as app:
            telemetry.attach(app)
            serving()
            await serve_stdio(app, actor, leeway_seconds=leeway_seconds)
    finally:
        telemetry.close()
    return EXIT_OK


async def _serve_http(  # type: ignore[no-untyped-def]
    settings, verifier, args: argparse.Namespace, log_format: LogFormat
) -> int:
    from mcp_knecht.app import open_app
    from mcp_knecht.cli.startup_heap import serving
    from mcp_knecht.observe import build_telemetry
    from mcp_knecht.transports.http import serve_http

    telemetry = build_telemetry(settings, log_format=log_format, metrics=bool(settings.metrics_token))
    try:
        async with open_app(settings, observe=telemetry.observe) as app:
            telemetry.attach(app)
            monitoring = ", /metrics on" if telemetry.metrics else ""
            announce = (f"mcp-knecht: serving MCP at http://{args.host}:{args.port}/mcp "
                        f"({'stateless' if args.stateless else 'sessions'}{monitoring}; "
                        f"database {settings.database_url})")
            if log_format == "json":
                import logging

                logging.getLogger("mcp_knecht.serve").info(announce)
            else:
                say(announce)
            serving()
            await serve_http(app, verifier, host=args.host, port=args.port, stateless=args.stateless,
                             public_url=args.public_url, metrics=telemetry.metrics, json_logs=log_format == "json")
    finally:
        telemetry.close()
    return EXIT_OK


# --- token -------------------------------------------------------------------------------------


def _cmd_token_mint(args: argparse.Namespace) -> int:
    from mcp_knecht.core.auth import mint_token, parse_ttl
    from mcp_knecht.core.scopes import load_scopes

    settings = _settings(args)
    catalogue = load_scopes(settings.scopes_dir)
    scopes: list[str] = list(catalogue.profile(args.profile).scopes) if args.profile else []
    scopes += args.scope or []
    if not scopes:
        say("mcp-knecht: give --profile NAME or at least one --scope S.")
        return EXIT_USAGE
    catalogue.check_known(scopes, "token mint")
    private_key = None
    if args.private_key:
        with open(args.private_key, "rb") as handle:
            private_key = handle.read()
    extra: dict[str, str] = {}
    for claim in args.claim or []:
        name, sep, value = claim.partition("=")
        if not sep or not name.strip():
            say(f"mcp-knecht: --claim needs NAME=VALUE, got {claim!r}.")
            return EXIT_USAGE
        extra[name.strip()] = value
    token = mint_token(
        _token_settings(settings),
        subject=args.sub,
        scopes=scopes,
        client=args.client,
        ttl=parse_ttl(args.ttl),
        private_key_pem=private_key,
        extra_claims=extra,
    )
    print(token)
    return EXIT_OK


# --- demo-data ---------------------------------------------------------------------------------


def _cmd_demo_data(args: argparse.Namespace) -> int:
    import anyio

    settings = _settings(args)

    async def fill() -> int:
        from mcp_knecht.knecht import open_store
        from mcp_knecht.knecht.demo import fill_demo_data

        db = await open_store(settings.database_url)
        try:
            summary = await fill_demo_data(db, seed=args.seed, runs=args.runs, log_mb=args.log_mb,
                                           run_logs=not args.no_run_logs, progress=say)
        finally:
            await db.close()
        say(f"mcp-knecht: demo data written to {settings.database_url}")
        print(summary.describe() if hasattr(summary, "describe") else summary)
        return EXIT_OK

    return anyio.run(fill)


# --- quickstart --------------------------------------------------------------------------------


def _cmd_quickstart(args: argparse.Namespace) -> int:
    import anyio

    from mcp_knecht.cli.quickstart import prepare, print_client_config
    from mcp_knecht.core.auth import parse_ttl

    settings = _settings(args)
    ttl = parse_ttl(args.ttl)
    token_settings = _token_settings(settings)
    token = anyio.run(prepare, settings, token_settings, args.sub, ttl)
    print_client_config(settings, token, host=args.host, port=args.port, ttl=ttl)
    if args.no_serve:
        return EXIT_OK
    from mcp_knecht.core.auth import TokenVerifier

    args.stateless, args.public_url = False, None
    return anyio.run(_serve_http, settings, TokenVerifier(token_settings), args, settings.log_format,
                     backend_options=FAST_LOOP)


# --- parser ------------------------------------------------------------------------------------


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", metavar="URL", help="database URL (sqlite:///PATH or postgresql://…); "
                        "default $KNECHT_DATABASE_URL or knecht.db in the data dir")
    parser.add_argument("--config", metavar="DIR", help="folder with policies.toml and scopes/; "
                        "default $KNECHT_CONFIG_DIR, else the installation's own")


def build_parser(*, serve_only: bool = False) -> argparse.ArgumentParser:
    """All commands; `serve_only`: just `serve`, for the command line a client launches at every start
    (the other fifteen subparsers are 4 ms of its cold start)."""
    parser = argparse.ArgumentParser(
        prog="mcp-knecht",
        description="A gated MCP server over Knecht CI data: scoped tools, staged writes, audit.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_serve(commands)
    if not serve_only:
        _add_other_commands(commands)
    return parser


def _add_serve(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = commands.add_parser("serve", help="run the MCP server (stdio by default)")
    serve.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8765)
    serve.add_argument("--stateless", action="store_true",
                       help="HTTP without server-side sessions, for replicas behind a load balancer")
    serve.add_argument("--public-url", help="base URL clients use, if not http://HOST:PORT")
    serve.add_argument("--log-format", choices=("text", "json"),
                       help="stderr log: text (default, $KNECHT_LOG_FORMAT) or json, one event per gate outcome")
    _common(serve)
    serve.set_defaults(handler=_cmd_serve)


def _add_other_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    token = commands.add_parser("token", help="tokens for MCP clients")
    token_commands = token.add_subparsers(dest="token_command", required=True, metavar="COMMAND")
    mint = token_commands.add_parser(
        "mint", help="print a signed JWT",
        epilog="examples:\n  mcp-knecht token mint --sub alice --profile readonly --ttl 7d\n"
               "  mcp-knecht token mint --sub bob --scope users:read --claim knecht_role=support",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mint.add_argument("--sub", required=True, help="the subject: who the token acts for")
    who = mint.add_argument_group("scopes (one of)")
    who.add_argument("--profile", help="a profile from scopes/profiles.toml")
    who.add_argument("--scope", action="append", help="a scope from scopes/catalogue.toml (repeatable)")
    mint.add_argument("--ttl", default="8h", help="lifetime such as 30m, 8h, 7d (default 8h)")
    mint.add_argument("--client", default="cli", help="client name recorded in the audit log")
    mint.add_argument("--private-key", metavar="PEM", help="signing key when verification uses a public key")
    mint.add_argument("--claim", action="append", metavar="NAME=VALUE",
                      help="an extra claim, e.g. knecht_role=support for the entities toolset (repeatable)")
    _common(mint)
    mint.set_defaults(handler=_cmd_token_mint)

    demo = commands.add_parser("demo-data", help="fill a database with deterministic demo data")
    demo.add_argument("--seed", type=int, default=7)
    demo.add_argument("--runs", type=int, default=600, help="number of runs (default 600; up to 1,000,000)")
    demo.add_argument("--log-mb", type=int, default=0, metavar="N",
                      help="also write one very large action log of about N MB (for benchmarks)")
    demo.add_argument("--no-run-logs", action="store_true",
                      help="skip the per-run logs (fast fills of a million runs for benchmarks)")
    _common(demo)
    demo.set_defaults(handler=_cmd_demo_data)

    quick = commands.add_parser(
        "quickstart", help="demo data + a token + client config, then serve over HTTP"
    )
    quick.add_argument("--sub", default=os.environ.get("USER") or "developer")
    quick.add_argument("--host", default="127.0.0.1")
    quick.add_argument("--port", type=int, default=8765)
    quick.add_argument("--ttl", default="30d", help="lifetime of the printed token (default 30d)")
    quick.add_argument("--no-serve", action="store_true", help="print the config and exit")
    _common(quick)
    quick.set_defaults(handler=_cmd_quickstart)

    from mcp_knecht.cli import notify
    from mcp_knecht.cli.admin import add_commands
    from mcp_knecht.cli.diagnose import add_command as add_diagnose
    from mcp_knecht.cli.web import add_commands as add_web_commands

    add_commands(commands, _common)
    add_web_commands(commands, _common)
    add_diagnose(commands, _common)
    notify.add_commands(commands, _common)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(serve_only=argv[:1] == ["serve"])
    args = parser.parse_args(argv)
    if args.command in ("serve", "quickstart"):  # stdout may carry MCP itself: left as it is
        return _run(args)
    from mcp_knecht.cli.terminal import safe_output  # its pattern is 0.7 ms of a stdio server's start

    with safe_output():  # audit rows and proposals carry text callers chose: it must not rewrite the terminal
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.handler(args))
    except KnechtError as exc:
        return report("mcp-knecht", exc)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

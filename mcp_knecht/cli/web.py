"""`mcp-knecht login-link`: a one-time URL that signs a person in to the web page."""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import urlencode

from mcp_knecht.cli.errors import EXIT_OK, EXIT_USAGE, say

DEFAULT_BASE_URL = "http://127.0.0.1:8765"
_EPILOG = """\
examples:
  mcp-knecht login-link --sub bob --profile operator
  mcp-knecht login-link --sub alice --scope projects:read --scope runs:read --base-url https://knecht.internal

The URL works once, for 10 minutes, on every replica that shares the database and the server key.
"""


def cmd_login_link(args: argparse.Namespace) -> int:
    import anyio

    from mcp_knecht.core.keys import load_server_keys
    from mcp_knecht.core.scopes import load_scopes
    from mcp_knecht.core.settings import load_settings
    from mcp_knecht.store import open_database
    from mcp_knecht.web.store import LINK_TTL, LoginLinks, WebSchema

    settings = load_settings(db=args.db, config=args.config)
    catalogue = load_scopes(settings.scopes_dir)
    scopes: list[str] = list(catalogue.profile(args.profile).scopes) if args.profile else []
    scopes += args.scope or []
    if not scopes:
        say("mcp-knecht: give --profile NAME or at least one --scope S.")
        return EXIT_USAGE
    catalogue.check_known(scopes, "login-link")
    subject = args.sub.strip()
    if not subject:
        say("mcp-knecht: --sub needs a name.")
        return EXIT_USAGE
    base = args.base_url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        say(f"mcp-knecht: --base-url must start with http:// or https://, not {base[:60]!r}.")
        return EXIT_USAGE
    keys = load_server_keys(settings)

    async def create() -> str:
        db = await open_database(settings.database_url)
        try:
            return await LoginLinks(WebSchema(db), keys).create(subject, scopes)
        finally:
            await db.close()

    secret = anyio.run(create)
    print(f"{base}/login?{urlencode({'link': secret})}")
    minutes = int(LINK_TTL.total_seconds() // 60)
    say(f"mcp-knecht: signs in {subject} with {' '.join(sorted(set(scopes)))}; works once, for {minutes} minutes.")
    return EXIT_OK


def add_commands(commands: Any, common: Any) -> None:
    link = commands.add_parser("login-link", help="print a one-time URL that signs a person in to the web page",
                               epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    link.add_argument("--sub", required=True, help="who signs in (their subject, as in a token)")
    who = link.add_argument_group("scopes (one of)")
    who.add_argument("--profile", help="a profile from scopes/profiles.toml (e.g. operator)")
    who.add_argument("--scope", action="append", help="a scope from scopes/catalogue.toml (repeatable)")
    link.add_argument("--base-url", default=DEFAULT_BASE_URL, metavar="URL",
                      help=f"the server's address as people reach it (default {DEFAULT_BASE_URL})")
    common(link)
    link.set_defaults(handler=cmd_login_link)

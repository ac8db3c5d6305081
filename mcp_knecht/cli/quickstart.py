"""`mcp-knecht quickstart`: everything a newcomer needs to connect a client, printed once."""

from __future__ import annotations

import json
import shutil
import sys

from mcp_knecht.core.auth import TokenSettings, mint_token
from mcp_knecht.core.scopes import load_scopes
from mcp_knecht.core.settings import CONFIG_DIR, DATABASE_URL, TOKEN, Settings

PROFILE = "claude-code"


async def prepare(settings: Settings, token_settings: TokenSettings, subject: str) -> str:
    """Fill demo data into an empty database and mint a claude-code token."""
    from mcp_knecht.knecht import open_store
    from mcp_knecht.knecht.demo import fill_demo_data

    db = await open_store(settings.database_url)
    try:
        if await db.fetch_one("SELECT 1 AS present FROM projects LIMIT 1") is None:
            print("mcp-knecht: filling demo data…", file=sys.stderr)
            await fill_demo_data(db)
    finally:
        await db.close()
    scopes = load_scopes(settings.scopes_dir).profile(PROFILE).scopes
    return mint_token(token_settings, subject=subject, scopes=scopes, client="quickstart")


def print_client_config(settings: Settings, token: str, *, host: str, port: int) -> None:
    executable = shutil.which("mcp-knecht") or "mcp-knecht"
    env = {TOKEN.name: token, DATABASE_URL.name: settings.database_url, CONFIG_DIR.name: str(settings.config_dir)}
    url = f"http://{host}:{port}/mcp"
    cursor = {"mcpServers": {"knecht": {"command": executable, "args": ["serve"], "env": env}}}
    cursor_http = {"mcpServers": {"knecht": {"url": url, "headers": {"Authorization": f"Bearer {token}"}}}}
    env_flags = " ".join(f"--env {key}={value}" for key, value in env.items())
    print(f"""
Database: {settings.database_url}
Token (profile {PROFILE}, 8 h):
  {token}

Claude Code, local over stdio:
  claude mcp add knecht {env_flags} -- {executable} serve

Claude Code, over HTTP (this server, once it runs):
  claude mcp add --transport http knecht {url} --header "Authorization: Bearer {token}"

Cursor (~/.cursor/mcp.json or .cursor/mcp.json), stdio:
{json.dumps(cursor, indent=2)}

Cursor, over HTTP:
{json.dumps(cursor_http, indent=2)}
""", flush=True)

"""`mcp-knecht quickstart`: everything a newcomer needs to connect a client, printed once.

Every snippet names the executable by its absolute path, and the data dir, database and config
dir too: Claude Code and Cursor start the server from their own environment, where this
installation's virtualenv is not on PATH.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from datetime import timedelta
from pathlib import Path

from mcp_knecht.core import clock
from mcp_knecht.core.auth import TokenSettings, mint_token
from mcp_knecht.core.scopes import load_scopes
from mcp_knecht.core.settings import CONFIG_DIR, DATA_DIR, DATABASE_URL, JWT_SECRET, TOKEN, Settings

PROFILE = "claude-code"
QUICKSTART_TTL = timedelta(days=30)
"""Local quickstart tokens live this long (a plain `token mint` 8 hours)."""


def knecht_command() -> list[str]:
    """How to start this installation's `mcp-knecht` from anywhere, without PATH: the script beside
    this Python (a virtualenv's bin/, pipx), else the one PATH finds now, else `python -m`."""
    names = ("mcp-knecht.exe", "mcp-knecht") if sys.platform == "win32" else ("mcp-knecht",)
    for name in names:
        beside = Path(sys.executable).parent / name
        if beside.is_file():
            return [str(beside.absolute())]
    found = shutil.which("mcp-knecht")
    if found:
        return [str(Path(found).absolute())]
    return [str(Path(sys.executable).absolute()), "-m", "mcp_knecht.cli.main"]


def renew_hint(subject: str = "$USER") -> str:
    """What to run for a new token, with this installation's absolute path."""
    command = shlex.join(knecht_command())
    return (f"{command} quickstart --no-serve        (a new token and the client lines, all printed)\n"
            f"  or: {command} token mint --sub {subject} --profile {PROFILE} --ttl 30d")


async def prepare(settings: Settings, token_settings: TokenSettings, subject: str,
                  ttl: timedelta = QUICKSTART_TTL) -> str:
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
    return mint_token(token_settings, subject=subject, scopes=scopes, client="quickstart", ttl=ttl)


def _lifetime(ttl: timedelta) -> str:
    if ttl % timedelta(days=1) == timedelta(0):
        return f"{ttl.days} days" if ttl.days != 1 else "1 day"
    hours = ttl.total_seconds() / 3600
    return f"{hours:g} hours" if hours >= 1 else f"{ttl.total_seconds() / 60:g} minutes"


def print_client_config(settings: Settings, token: str, *, host: str, port: int,
                        ttl: timedelta = QUICKSTART_TTL) -> None:
    command = knecht_command()
    env = {
        TOKEN.name: token,
        DATABASE_URL.name: settings.database_url,
        CONFIG_DIR.name: str(settings.config_dir),
        DATA_DIR.name: str(settings.data_dir.absolute()),
    }
    url = f"http://{host}:{port}/mcp"
    cursor = {"mcpServers": {"knecht": {"command": command[0], "args": [*command[1:], "serve"], "env": env}}}
    cursor_http = {"mcpServers": {"knecht": {"url": url, "headers": {"Authorization": f"Bearer {token}"}}}}
    env_flags = " ".join(f"--env {shlex.quote(f'{key}={value}')}" for key, value in env.items())
    until = clock.timestamp(clock.now() + ttl)[:16].replace("T", " ")
    secret_note = (
        f"\nNote: {JWT_SECRET.name} is set in this shell; the server your client starts needs it too.\n"
        if settings.jwt_secret else ""
    )
    print(f"""
Database: {settings.database_url}
Token (profile {PROFILE}, valid {_lifetime(ttl)}, until {until} UTC; a new one: quickstart --no-serve):
  {token}

Claude Code, local over stdio:
  claude mcp add knecht {env_flags} -- {shlex.join([*command, "serve"])}

Claude Code, over HTTP (this server, once it runs):
  claude mcp add --transport http knecht {url} --header "Authorization: Bearer {token}"

Cursor (~/.cursor/mcp.json or .cursor/mcp.json), stdio:
{json.dumps(cursor, indent=2)}

Cursor, over HTTP:
{json.dumps(cursor_http, indent=2)}
{secret_note}""", flush=True)

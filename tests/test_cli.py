"""The `mcp-knecht` command as a user meets it: help, tokens, demo data, quickstart."""

from __future__ import annotations

import stat
from pathlib import Path

from mcp_knecht.core.auth import TokenSettings, TokenVerifier
from tests.staging import cli


def test_help_shows_examples_for_every_program(env: dict[str, str]) -> None:
    for program, args in (("mcp-knecht", ["--help"]), ("mcp-knecht", ["token", "mint", "--help"]),
                          ("knecht-approve", ["--help"])):
        shown = cli(program, env, *args)
        assert shown.returncode == 0 and "example" in shown.stdout


def test_serve_has_its_own_help_and_refuses_what_it_does_not_know(env: dict[str, str]) -> None:
    shown = cli("mcp-knecht", env, "serve", "--help")
    assert shown.returncode == 0
    assert "--transport {stdio,http}" in shown.stdout and "--stateless" in shown.stdout
    refused = cli("mcp-knecht", env, "serve", "--transport", "carrier-pigeon")
    assert refused.returncode == 2 and "invalid choice: 'carrier-pigeon'" in refused.stderr
    refused = cli("mcp-knecht", env, "serve", "--bogus")
    assert refused.returncode == 2 and "unrecognized arguments: --bogus" in refused.stderr
    listed = cli("mcp-knecht", env, "--help")
    assert all(command in listed.stdout for command in ("serve", "token", "demo-data", "audit", "notify"))


def test_a_minted_token_carries_the_profile_and_extra_claims(env: dict[str, str], secret: str) -> None:
    minted = cli("mcp-knecht", env, "token", "mint", "--sub", "dora", "--profile", "readonly",
                 "--claim", "knecht_role=support", "--ttl", "30m")
    assert minted.returncode == 0, minted.stderr
    actor = TokenVerifier(TokenSettings(secret=secret)).verify(minted.stdout.strip())
    assert actor.subject == "dora"
    assert actor.scopes == {"projects:read", "workflows:read", "runs:read", "logs:read"}
    assert actor.claims["knecht_role"] == "support"


def test_minting_refuses_what_it_cannot_honour(env: dict[str, str]) -> None:
    def mint(*args: str) -> tuple[int, str]:
        done = cli("mcp-knecht", env, "token", "mint", "--sub", "dora", *args)
        return done.returncode, done.stderr

    code, message = mint("--profile", "superuser")
    assert code == 2 and "No token profile named 'superuser'" in message
    code, message = mint("--scope", "everything:write")
    assert code == 2 and "unknown scope" in message
    code, message = mint("--profile", "readonly", "--claim", "scope=admin")
    assert code == 2 and "cannot be given" in message
    code, message = mint("--profile", "readonly", "--ttl", "forever")
    assert code == 2 and "Invalid duration" in message
    assert mint()[0] == 2


def test_without_a_configured_key_a_dev_secret_is_made_private_and_reported(env: dict[str, str]) -> None:
    del env["KNECHT_JWT_SECRET"]
    first = cli("mcp-knecht", env, "token", "mint", "--sub", "dora", "--profile", "readonly")
    secret_file = Path(env["KNECHT_DATA_DIR"]) / "jwt-secret"
    assert first.returncode == 0 and str(secret_file) in first.stderr
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    again = cli("mcp-knecht", env, "token", "mint", "--sub", "dora", "--profile", "readonly")
    assert again.returncode == 0 and "generated" not in again.stderr
    verifier = TokenVerifier(TokenSettings(secret=secret_file.read_text().strip()))
    assert verifier.verify(first.stdout.strip()).subject == "dora"


def test_demo_data_fills_an_empty_database_once(env: dict[str, str]) -> None:
    filled = cli("mcp-knecht", env, "demo-data", "--runs", "60")
    assert filled.returncode == 0, filled.stderr
    assert "60" in filled.stdout
    again = cli("mcp-knecht", env, "demo-data", "--runs", "60")
    assert again.returncode == 1 and "already holds" in again.stderr


def test_quickstart_prints_working_client_configuration(env: dict[str, str], secret: str) -> None:
    shown = cli("mcp-knecht", env, "quickstart", "--no-serve", "--sub", "erin")
    assert shown.returncode == 0, shown.stderr
    assert "claude mcp add knecht --env KNECHT_TOKEN=" in shown.stdout
    assert "claude mcp add --transport http knecht http://127.0.0.1:8765/mcp" in shown.stdout
    assert '"mcpServers"' in shown.stdout
    token = shown.stdout.split("KNECHT_TOKEN=", 1)[1].split()[0]
    assert TokenVerifier(TokenSettings(secret=secret)).verify(token).subject == "erin"

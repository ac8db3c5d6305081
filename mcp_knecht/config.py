"""Settings: declared once with their defaults; flags win over environment variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from mcp_knecht.errors import ConfigError
from mcp_knecht.store.url import normalise

DATA_DIR_ENV = "KNECHT_DATA_DIR"
DATABASE_URL_ENV = "KNECHT_DATABASE_URL"
CONFIG_DIR_ENV = "KNECHT_CONFIG_DIR"
TOOLSETS_ENV = "KNECHT_TOOLSETS"
PROPOSAL_TTL_ENV = "KNECHT_PROPOSAL_TTL"
DEFAULT_TOOLSETS = ("mcp_knecht.knecht:toolset",)


def default_data_dir(env: Mapping[str, str]) -> Path:
    if explicit := env.get(DATA_DIR_ENV):
        return Path(explicit).expanduser()
    base = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "mcp-knecht"


def _has_config(folder: Path) -> bool:
    return (folder / "scopes" / "catalogue.toml").is_file()


def find_config_dir(flag: str | None, env: Mapping[str, str]) -> Path:
    """--config, then KNECHT_CONFIG_DIR, then the working directory, then the source checkout."""
    for explicit in (flag, env.get(CONFIG_DIR_ENV)):
        if explicit:
            folder = Path(explicit).expanduser()
            if not _has_config(folder):
                raise ConfigError(f"Config dir {folder} has no scopes/catalogue.toml.")
            return folder.resolve()
    for candidate in (Path.cwd(), Path(__file__).resolve().parent.parent):
        if _has_config(candidate):
            return candidate
    raise ConfigError(
        "No config dir found: pass --config DIR or set KNECHT_CONFIG_DIR to a folder holding "
        "policies.toml and scopes/ (the repository's root is one)."
    )


@dataclass(frozen=True)
class Settings:
    data_dir: Path
    database_url: str
    config_dir: Path
    env: Mapping[str, str]
    toolsets: tuple[str, ...] = DEFAULT_TOOLSETS
    """Import paths `module:function` of the domain toolsets to serve."""
    proposal_ttl: timedelta = timedelta(hours=24)
    """How long a proposal waits for a decision before it expires."""

    @property
    def scopes_dir(self) -> Path:
        return self.config_dir / "scopes"

    @property
    def policy_file(self) -> Path:
        return self.config_dir / "policies.toml"


def load_settings(
    *, db: str | None = None, config: str | None = None, env: Mapping[str, str] | None = None
) -> Settings:
    env = dict(os.environ if env is None else env)
    data_dir = default_data_dir(env)
    url = db or env.get(DATABASE_URL_ENV) or f"sqlite:///{data_dir / 'knecht.db'}"
    toolsets = tuple(s.strip() for s in env.get(TOOLSETS_ENV, "").split(",") if s.strip())
    ttl = timedelta(hours=24)
    if raw_ttl := env.get(PROPOSAL_TTL_ENV):
        from mcp_knecht.core.auth.minting import parse_ttl

        ttl = parse_ttl(raw_ttl)
    return Settings(
        data_dir=data_dir,
        database_url=normalise(url),
        config_dir=find_config_dir(config, env),
        env=env,
        toolsets=toolsets or DEFAULT_TOOLSETS,
        proposal_ttl=ttl,
    )

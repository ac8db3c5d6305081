"""Settings: every `KNECHT_*` variable declared once — its flag, its default, what it means — and
read here, and only here.

    settings = load_settings(db="sqlite:///tmp/k.db")      # flags win over the environment
    settings.database_url, settings.proposal_ttl, settings.config_dir, …

`VARIABLES` is the table; the README's configuration table is checked against it by a test. A
setting is added with one `Variable(...)` row and one field of `Settings`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, cast

import msgspec

from mcp_knecht.core.durations import parse_duration
from mcp_knecht.core.hidden_repr import repr_without
from mcp_knecht.errors import ConfigError, UsageError

DEFAULT_TOOLSETS = ("mcp_knecht.knecht:toolset",)
DEFAULT_PROPOSAL_TTL = timedelta(hours=24)
"""How long a proposal waits for a decision before it expires."""
DEFAULT_ISSUER = "mcp-knecht"
DEFAULT_AUDIENCE = "mcp-knecht"
MAX_PROPOSAL_TTL = timedelta(days=30)
MIN_METRICS_TOKEN = 16

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")

DEFAULT_WEB_SESSION_TTL = timedelta(hours=8)
"""How long a web session lasts after signing in (a pasted token's own expiry ends it sooner)."""
MAX_WEB_SESSION_TTL = timedelta(days=7)
DEFAULT_SESSIONS_PER_SUBJECT = 16
"""Open MCP sessions (HTTP, protocol 2025-11-25) one subject may hold; more are refused with 429."""
DEFAULT_MAX_SESSIONS = 1_000
"""Open MCP sessions of all subjects together (the SDK's own default is 10,000)."""
DEFAULT_SESSION_IDLE_TIMEOUT = timedelta(minutes=10)
"""A session without a request for this long is closed (the SDK's own default is 30 minutes)."""

_INSTALLATION = Path(__file__).resolve().parents[2]
"""The checkout the package runs from: its `policies.toml` and `scopes/` are the default config."""


class Variable(msgspec.Struct, frozen=True):
    """One `KNECHT_*` environment variable: the setting it fills, its help text and its default."""
    name: str
    field: str
    """The attribute of `Settings` that holds its value."""
    help: str
    default: str = ""
    """The default as documented ("" when unset means "none")."""
    flag: str | None = None
    parse: Callable[[str], Any] = str


def _toolsets(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip()) or DEFAULT_TOOLSETS


def _proposal_ttl(text: str) -> timedelta:
    try:
        return parse_duration(text, maximum=MAX_PROPOSAL_TTL, what="Proposal lifetime (KNECHT_PROPOSAL_TTL)")
    except UsageError as exc:
        raise ConfigError(exc.message) from None


def _web_session_ttl(text: str) -> timedelta:
    try:
        return parse_duration(text, maximum=MAX_WEB_SESSION_TTL, what="Web session lifetime (KNECHT_WEB_SESSION_TTL)")
    except UsageError as exc:
        raise ConfigError(exc.message) from None


def _operator_auth(text: str) -> str:
    if text not in ("local", "token"):
        raise ConfigError(f"KNECHT_OPERATOR_AUTH must be 'local' or 'token', not {text!r}.")
    return text


def _count(name: str, maximum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ConfigError(f"{name} must be a whole number (got {text!r}).") from None
        if not 1 <= value <= maximum:
            raise ConfigError(f"{name} must be between 1 and {maximum} (got {value}).")
        return value

    return parse


def _idle_timeout(text: str) -> timedelta:
    try:
        return parse_duration(text, maximum=timedelta(days=1),
                              what="Session idle timeout (KNECHT_SESSION_IDLE_TIMEOUT)")
    except UsageError as exc:
        raise ConfigError(exc.message) from None


def _path(text: str) -> Path:
    return Path(text).expanduser()


def _log_format(text: str) -> LogFormat:
    if text.lower() not in LOG_FORMATS:
        raise ConfigError(f"KNECHT_LOG_FORMAT={text!r}: expected one of {', '.join(LOG_FORMATS)}.")
    return cast(LogFormat, text.lower())


def _metrics_token(text: str) -> str:
    if len(text) < MIN_METRICS_TOKEN:
        raise ConfigError(f"KNECHT_METRICS_TOKEN is too short: use at least {MIN_METRICS_TOKEN} random characters "
                          "(e.g. `openssl rand -hex 24`).")
    return text


def _switch(name: str) -> Callable[[str], bool]:
    def parse(text: str) -> bool:
        if text.lower() in ("0", "false", "no", "off"):
            return False
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        raise ConfigError(f"{name}: expected 0 or 1, not {text!r}.")

    return parse


def _seconds(name: str, maximum: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not 0 < value <= maximum:
            raise ConfigError(f"{name}: expected seconds between 0 and {maximum:g}, not {text!r}.")
        return value

    return parse


DATABASE_URL = Variable("KNECHT_DATABASE_URL", "database_url", "the store: sqlite:///PATH or postgresql://…",
    "sqlite:///<data dir>/knecht.db", flag="--db")
CONFIG_DIR = Variable("KNECHT_CONFIG_DIR", "config_dir", "folder with policies.toml and scopes/",
    "the installation's own (the source checkout)", flag="--config", parse=_path)
DATA_DIR = Variable("KNECHT_DATA_DIR", "data_dir", "where generated files live (database, dev secret, keys)",
    "$XDG_DATA_HOME/mcp-knecht or ~/.local/share/mcp-knecht", parse=_path)
TOOLSETS = Variable("KNECHT_TOOLSETS", "toolsets", "comma-separated `module:function` toolsets to serve",
    ",".join(DEFAULT_TOOLSETS), parse=_toolsets)
PROPOSAL_TTL = Variable("KNECHT_PROPOSAL_TTL", "proposal_ttl", "how long a proposal waits for a decision", "24h",
    parse=_proposal_ttl)
TOKEN = Variable("KNECHT_TOKEN", "token", "the client's JWT (stdio)")
JWT_SECRET = Variable("KNECHT_JWT_SECRET", "jwt_secret", "HS256 signing secret (at least 32 bytes)",
    "a generated dev secret <data dir>/jwt-secret")
JWT_PUBLIC_KEY = Variable("KNECHT_JWT_PUBLIC_KEY", "jwt_public_key", "PEM public key (path) that verifies tokens",
    parse=_path)
JWKS_URL = Variable("KNECHT_JWKS_URL", "jwks_url", "JWKS URL whose keys verify tokens")
JWT_ISSUER = Variable("KNECHT_JWT_ISSUER", "jwt_issuer", "the `iss` tokens must carry", DEFAULT_ISSUER)
JWT_AUDIENCE = Variable("KNECHT_JWT_AUDIENCE", "jwt_audience", "the `aud` tokens must carry", DEFAULT_AUDIENCE)
SERVER_KEY = Variable("KNECHT_SERVER_KEY", "server_key",
    "key of proposal seals, argument hashes and the audit chain (≥ 32 bytes)",
    "a generated key <data dir>/server-key")
OPERATOR_AUTH = Variable("KNECHT_OPERATOR_AUTH", "operator_auth",
    "`token`: every decision needs a verified operator token; `local`: the CLI may decide as --as NAME", "local",
    parse=_operator_auth)
OPERATOR_TOKEN = Variable("KNECHT_OPERATOR_TOKEN", "operator_token", "an operator's JWT for knecht-approve")
SERVER_URL = Variable("KNECHT_SERVER_URL", "server_url", "knecht-approve: decide through this server's API",
    flag="--server")
ENTITIES_KEY = Variable("KNECHT_ENTITIES_KEY", "entities_key", "key of the entities row fingerprints (≥ 32 bytes)",
    "a generated key <data dir>/entities-key")
METRICS_TOKEN = Variable("KNECHT_METRICS_TOKEN", "metrics_token",
    "bearer token Prometheus sends to /metrics (HTTP; at least 16 characters)", "— (/metrics is off)",
    parse=_metrics_token)
LOG_FORMAT = Variable("KNECHT_LOG_FORMAT", "log_format",
    "the server's log on stderr: `text`, or `json` with one event per gate outcome", "text", flag="--log-format",
    parse=_log_format)
WEB_SESSION_TTL = Variable("KNECHT_WEB_SESSION_TTL", "web_session_ttl",
    "how long a web session lasts after signing in (at most 7d)", "8h", parse=_web_session_ttl)
# AI features (mcp_knecht/ai): model roles as provider:model, checked by mcp_knecht.ai.settings.
MODEL_DEFAULT = Variable("KNECHT_MODEL_DEFAULT", "model_default", "the default model of AI features, provider:model",
    "[models] default in knecht.toml, else none (features answer unavailable)")
MODEL_FAST = Variable("KNECHT_MODEL_FAST", "model_fast", "the subtask model (role `fast`), provider:model",
    "[models] fast in knecht.toml, else the default model")
AUTO_DIAGNOSE = Variable("KNECHT_AUTO_DIAGNOSE", "auto_diagnose", "0 turns the automatic diagnosis of failed runs off",
    "1 (on when a model is configured)", parse=_switch("KNECHT_AUTO_DIAGNOSE"))
MODEL_TIMEOUT = Variable("KNECHT_MODEL_TIMEOUT", "model_timeout", "seconds per model request (HTTP attempt)", "60",
    parse=_seconds("KNECHT_MODEL_TIMEOUT", 3600))
LANGDOCK_BASE_URL = Variable("KNECHT_LANGDOCK_BASE_URL", "langdock_base_url", "Langdock's API base URL",
    "https://api.langdock.com")
LANGDOCK_REGION = Variable("KNECHT_LANGDOCK_REGION", "langdock_region", "Langdock region (eu, us, …)", "eu")
OPENAI_COMPATIBLE_BASE_URL = Variable("KNECHT_OPENAI_COMPATIBLE_BASE_URL", "openai_compatible_base_url",
    "base URL of an OpenAI-compatible endpoint (Ollama, vLLM, LiteLLM, a gateway)")
OPENAI_COMPATIBLE_API_KEY = Variable("KNECHT_OPENAI_COMPATIBLE_API_KEY", "openai_compatible_api_key",
    "its API key, if it needs one")
WEBHOOK_URL = Variable("KNECHT_WEBHOOK_URL", "webhook_url", "notifications: POST every proposal event here (signed)")
WEBHOOK_SECRET = Variable("KNECHT_WEBHOOK_SECRET", "webhook_secret",
    "notifications: the Standard Webhooks signing secret (whsec_…), required with the URL")

SESSIONS_PER_SUBJECT = Variable(
    "KNECHT_SESSIONS_PER_SUBJECT", "sessions_per_subject", "open MCP sessions one subject may hold (HTTP)",
    str(DEFAULT_SESSIONS_PER_SUBJECT), parse=_count("KNECHT_SESSIONS_PER_SUBJECT", 100_000))
MAX_SESSIONS = Variable("KNECHT_MAX_SESSIONS", "max_sessions", "open MCP sessions of all subjects together (HTTP)",
    str(DEFAULT_MAX_SESSIONS), parse=_count("KNECHT_MAX_SESSIONS", 1_000_000))
SESSION_IDLE_TIMEOUT = Variable(
    "KNECHT_SESSION_IDLE_TIMEOUT", "session_idle_timeout", "a session without a request for this long is closed",
    "10m", parse=_idle_timeout)

VARIABLES: tuple[Variable, ...] = (
    DATABASE_URL,
    CONFIG_DIR,
    DATA_DIR,
    TOOLSETS,
    PROPOSAL_TTL,
    TOKEN,
    JWT_SECRET,
    JWT_PUBLIC_KEY,
    JWKS_URL,
    JWT_ISSUER,
    JWT_AUDIENCE,
    SERVER_KEY,
    OPERATOR_AUTH,
    OPERATOR_TOKEN,
    SERVER_URL,
    ENTITIES_KEY,
    METRICS_TOKEN,
    LOG_FORMAT,
    WEB_SESSION_TTL,
    MODEL_DEFAULT,
    MODEL_FAST,
    AUTO_DIAGNOSE,
    MODEL_TIMEOUT,
    LANGDOCK_BASE_URL,
    LANGDOCK_REGION,
    OPENAI_COMPATIBLE_BASE_URL,
    OPENAI_COMPATIBLE_API_KEY,
    WEBHOOK_URL,
    WEBHOOK_SECRET,
    SESSIONS_PER_SUBJECT,
    MAX_SESSIONS,
    SESSION_IDLE_TIMEOUT,
)
BY_NAME: Mapping[str, Variable] = {declared.name: declared for declared in VARIABLES}


# Never shown by repr: secrets, and the whole environment (which holds them).
_SECRET_FIELDS = frozenset(("token", "jwt_secret", "server_key", "operator_token", "entities_key", "metrics_token",
                            "openai_compatible_api_key", "webhook_url", "webhook_secret", "env"))


class Settings(msgspec.Struct, frozen=True):
    """Everything a process reads from its environment, resolved once at start (`load_settings`)."""
    data_dir: Path
    config_dir: Path
    database_url: str
    toolsets: tuple[str, ...] = DEFAULT_TOOLSETS
    proposal_ttl: timedelta = DEFAULT_PROPOSAL_TTL
    token: str | None = None
    jwt_secret: str | None = None
    jwt_public_key: Path | None = None
    jwks_url: str | None = None
    jwt_issuer: str = DEFAULT_ISSUER
    jwt_audience: str = DEFAULT_AUDIENCE
    server_key: str | None = None
    operator_auth: str = "local"
    """`token`: decisions need a verified operator token everywhere (team deployments)."""
    operator_token: str | None = None
    server_url: str | None = None
    entities_key: str | None = None
    metrics_token: str | None = None
    log_format: LogFormat = "text"
    web_session_ttl: timedelta = DEFAULT_WEB_SESSION_TTL
    model_default: str | None = None
    model_fast: str | None = None
    auto_diagnose: bool = True
    model_timeout: float = 60.0
    langdock_base_url: str | None = None
    langdock_region: str = "eu"
    openai_compatible_base_url: str | None = None
    openai_compatible_api_key: str | None = None
    webhook_url: str | None = None
    webhook_secret: str | None = None
    sessions_per_subject: int = DEFAULT_SESSIONS_PER_SUBJECT
    max_sessions: int = DEFAULT_MAX_SESSIONS
    session_idle_timeout: timedelta = DEFAULT_SESSION_IDLE_TIMEOUT
    env: Mapping[str, str] = msgspec.field(default_factory=dict)
    """The whole environment, for names a config file declares (an entity's `database_env`, a
    notification channel's `${NAME}`)."""

    def __repr__(self) -> str:
        return repr_without(self, _SECRET_FIELDS)

    @property
    def scopes_dir(self) -> Path:
        return self.config_dir / "scopes"

    @property
    def policy_file(self) -> Path:
        return self.config_dir / "policies.toml"


def default_data_dir(env: Mapping[str, str]) -> Path:
    if explicit := env.get(DATA_DIR.name):
        return Path(explicit).expanduser()
    base = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "mcp-knecht"


def _has_config(folder: Path) -> bool:
    return (folder / "scopes" / "catalogue.toml").is_file()


def find_config_dir(explicit: str | None) -> Path:
    """`--config` or `KNECHT_CONFIG_DIR`, else the installation's own defaults — never the working
    directory: a repository that ships a permissive policies.toml must not switch approval off."""
    if explicit:
        folder = Path(explicit).expanduser()
        if not _has_config(folder):
            raise ConfigError(f"Config dir {folder} has no scopes/catalogue.toml.")
        return folder.resolve()
    if _has_config(_INSTALLATION):
        return _INSTALLATION
    raise ConfigError(
        "No config dir: pass --config DIR or set KNECHT_CONFIG_DIR to a folder holding policies.toml and "
        "scopes/ (the repository's root is one)."
    )


def load_settings(
    *, db: str | None = None, config: str | None = None, env: Mapping[str, str] | None = None
) -> Settings:
    """Settings from flags (`db`, `config`) over the environment (`env`, default `os.environ`)."""
    from mcp_knecht.core.database_url import normalise

    env = dict(os.environ if env is None else env)
    values: dict[str, Any] = {}
    for declared in VARIABLES:
        raw = env.get(declared.name, "").strip()
        if raw and declared.field not in ("data_dir", "config_dir", "database_url"):
            values[declared.field] = declared.parse(raw)
    data_dir = default_data_dir(env)
    url = db or env.get(DATABASE_URL.name) or f"sqlite:///{data_dir / 'knecht.db'}"
    return Settings(
        data_dir=data_dir,
        config_dir=find_config_dir(config or env.get(CONFIG_DIR.name)),
        database_url=normalise(url),
        env=env,
        **values,
    )

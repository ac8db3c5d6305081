"""Every setting of the AI layer, read in one place (`load_ai_settings`), from the environment
(which wins) and `[models]` in `<config dir>/knecht.toml`.

    KNECHT_MODEL_DEFAULT      provider:model of the "default model"        e.g. anthropic:claude-opus-4-7
    KNECHT_MODEL_FAST         provider:model of the "subtask model"        falls back to the default
    KNECHT_AUTO_DIAGNOSE      0 turns the automatic diagnosis of failed runs off (on when a model is set)
    ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL       anthropic
    OPENAI_API_KEY, OPENAI_BASE_URL             openai
    GOOGLE_API_KEY, GOOGLE_GEMINI_BASE_URL      google (the base URL is the google-genai SDK's own variable)
    LANGDOCK_API_KEY, KNECHT_LANGDOCK_BASE_URL, KNECHT_LANGDOCK_REGION   langdock (default
                                                https://api.langdock.com, region eu)
    KNECHT_OPENAI_COMPATIBLE_BASE_URL, KNECHT_OPENAI_COMPATIBLE_API_KEY  openai-compatible (Ollama, vLLM,
                                                LiteLLM, any gateway speaking Chat Completions)
    KNECHT_MODEL_TIMEOUT      seconds per model call (default 60)

Keys come from the environment only, never from a file; `secret_values()` hands them to the scrubber.
This module is the one to fold into the server's settings table (issue 9) as it stands.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from mcp_knecht.errors import ConfigError

Role = Literal["default", "fast"]
PROVIDERS = ("anthropic", "openai", "google", "langdock", "openai-compatible")

MODEL_DEFAULT_ENV = "KNECHT_MODEL_DEFAULT"
MODEL_FAST_ENV = "KNECHT_MODEL_FAST"
AUTO_DIAGNOSE_ENV = "KNECHT_AUTO_DIAGNOSE"
MODEL_TIMEOUT_ENV = "KNECHT_MODEL_TIMEOUT"
ROLE_ENV: dict[Role, str] = {"default": MODEL_DEFAULT_ENV, "fast": MODEL_FAST_ENV}

LANGDOCK_DEFAULT_BASE_URL = "https://api.langdock.com"
DEFAULT_TIMEOUT = 60.0

# provider → (key variable, base URL variable); the base URL variable is optional except where noted.
PROVIDER_ENV: dict[str, tuple[str, str]] = {
    "anthropic": ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"),
    "openai": ("OPENAI_API_KEY", "OPENAI_BASE_URL"),
    "google": ("GOOGLE_API_KEY", "GOOGLE_GEMINI_BASE_URL"),
    "langdock": ("LANGDOCK_API_KEY", "KNECHT_LANGDOCK_BASE_URL"),
    "openai-compatible": ("KNECHT_OPENAI_COMPATIBLE_API_KEY", "KNECHT_OPENAI_COMPATIBLE_BASE_URL"),
}
LANGDOCK_REGION_ENV = "KNECHT_LANGDOCK_REGION"


@dataclass(frozen=True)
class ModelSpec:
    """`provider:model`, parsed; `source` says where it was set (for messages)."""

    provider: str
    model: str
    source: str

    def __str__(self) -> str:
        return f"{self.provider}:{self.model}"


@dataclass(frozen=True)
class ProviderAccess:
    """How to reach one provider: its key and base URL as the environment gives them."""

    api_key: str | None
    base_url: str | None
    key_env: str
    base_url_env: str


@dataclass(frozen=True)
class AiSettings:
    default: ModelSpec | None = None
    fast: ModelSpec | None = None
    auto_diagnose: bool = True
    """Asked for (the default); it runs only when a model is configured too."""
    timeout: float = DEFAULT_TIMEOUT
    providers: Mapping[str, ProviderAccess] = field(default_factory=dict)
    langdock_region: str = "eu"

    def spec(self, role: Role) -> ModelSpec | None:
        """The model of a role: `fast` falls back to `default`."""
        return (self.fast or self.default) if role == "fast" else self.default

    @property
    def configured(self) -> bool:
        return self.default is not None or self.fast is not None

    @property
    def auto_diagnose_on(self) -> bool:
        return self.auto_diagnose and self.spec("fast") is not None

    def secret_values(self) -> list[str]:
        """Every API key, for the output scrubber."""
        return [access.api_key for access in self.providers.values() if access.api_key]


def parse_model(value: str, source: str) -> ModelSpec:
    provider, sep, model = value.strip().partition(":")
    provider, model = provider.strip().lower(), model.strip()
    if not sep or not provider or not model:
        raise ConfigError(f"{source}: expected provider:model (e.g. anthropic:claude-haiku-4-5), got {value!r}.")
    if provider not in PROVIDERS:
        raise ConfigError(f"{source}: unknown provider {provider!r}; one of {', '.join(PROVIDERS)}.")
    return ModelSpec(provider, model, source)


def _file_models(config_dir: Path | None) -> dict[str, tuple[str, str]]:
    """role → (value, where it was set) from `[models]` in knecht.toml."""
    if config_dir is None:
        return {}
    path = config_dir / "knecht.toml"
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    models = data.get("models", {})
    if not isinstance(models, dict):
        raise ConfigError(f"{path}: [models] must be a table.")
    unknown = sorted(set(models) - {"default", "fast"})
    if unknown:
        raise ConfigError(f"{path}: models.{unknown[0]}: unknown key; [models] takes default and fast.")
    for key, value in models.items():
        if not isinstance(value, str):
            raise ConfigError(f"{path}: models.{key}: expected a string 'provider:model'.")
    return {key: (value, f"{path}: models.{key}") for key, value in models.items()}


def _role(env: Mapping[str, str], file: dict[str, tuple[str, str]], role: Role) -> ModelSpec | None:
    if value := env.get(ROLE_ENV[role], "").strip():
        return parse_model(value, ROLE_ENV[role])
    if role in file and file[role][0].strip():
        return parse_model(*file[role])
    return None


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"{name}: expected 0 or 1, got {raw!r}.")


def _timeout(env: Mapping[str, str]) -> float:
    raw = env.get(MODEL_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise ConfigError(f"{MODEL_TIMEOUT_ENV}: expected seconds between 0 and 3600, got {raw!r}.")
    return value


def load_ai_settings(env: Mapping[str, str], config_dir: Path | None = None) -> AiSettings:
    file = _file_models(config_dir)
    providers = {
        name: ProviderAccess(
            api_key=env.get(key_env, "").strip() or None,
            base_url=env.get(url_env, "").strip() or None,
            key_env=key_env,
            base_url_env=url_env,
        )
        for name, (key_env, url_env) in PROVIDER_ENV.items()
    }
    region = env.get(LANGDOCK_REGION_ENV, "").strip().lower() or "eu"
    return AiSettings(
        default=_role(env, file, "default"),
        fast=_role(env, file, "fast"),
        auto_diagnose=_flag(env, AUTO_DIAGNOSE_ENV, True),
        timeout=_timeout(env),
        providers=providers,
        langdock_region=region,
    )

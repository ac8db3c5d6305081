"""The AI layer's view of the settings: model roles, providers, their keys and endpoints.

The `KNECHT_*` variables are declared and read in `mcp_knecht.core.settings` (the settings table);
this module checks the roles (`provider:model`), adds `[models]` from `<config dir>/knecht.toml`
(the environment wins), and takes the providers' own variables, which their SDKs document:

    KNECHT_MODEL_DEFAULT      provider:model of the "default model"        e.g. anthropic:claude-opus-4-7
    KNECHT_MODEL_FAST         provider:model of the "subtask model"        falls back to the default
    KNECHT_AUTO_DIAGNOSE      0 turns the automatic diagnosis of failed runs off (on when a model is set)
    KNECHT_MODEL_TIMEOUT      seconds per model request (default 60)
    ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL       anthropic
    OPENAI_API_KEY, OPENAI_BASE_URL             openai
    GOOGLE_API_KEY, GOOGLE_GEMINI_BASE_URL      google (the base URL is the google-genai SDK's own variable)
    LANGDOCK_API_KEY, KNECHT_LANGDOCK_BASE_URL, KNECHT_LANGDOCK_REGION   langdock (default
                                                https://api.langdock.com, region eu)
    KNECHT_OPENAI_COMPATIBLE_BASE_URL, KNECHT_OPENAI_COMPATIBLE_API_KEY  openai-compatible (Ollama, vLLM,
                                                LiteLLM, any gateway speaking Chat Completions)

Keys come from the environment only, never from a file; `secret_values()` hands them to the scrubber.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import msgspec

from mcp_knecht.core.settings import Settings
from mcp_knecht.errors import ConfigError

Role = Literal["default", "fast"]
PROVIDERS = ("anthropic", "openai", "google", "langdock", "openai-compatible")

MODEL_DEFAULT_ENV = "KNECHT_MODEL_DEFAULT"
MODEL_FAST_ENV = "KNECHT_MODEL_FAST"
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


class ModelSpec(msgspec.Struct, frozen=True):
    """`provider:model`, parsed; `source` says where it was set (for messages)."""

    provider: str
    model: str
    source: str

    def __str__(self) -> str:
        return f"{self.provider}:{self.model}"


class ProviderAccess(msgspec.Struct, frozen=True):
    """How to reach one provider: its key and base URL as the environment gives them."""

    api_key: str | None
    base_url: str | None
    key_env: str
    base_url_env: str


class AiSettings(msgspec.Struct, frozen=True):
    """The `[ai]` configuration: which models run the AI features, and their limits."""
    default: ModelSpec | None = None
    fast: ModelSpec | None = None
    auto_diagnose: bool = True
    """Asked for (the default); it runs only when a model is configured too."""
    timeout: float = DEFAULT_TIMEOUT
    providers: Mapping[str, ProviderAccess] = msgspec.field(default_factory=dict)
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


def _role(settings: Settings, file: dict[str, tuple[str, str]], role: Role) -> ModelSpec | None:
    value = settings.model_default if role == "default" else settings.model_fast
    if value and value.strip():
        return parse_model(value, ROLE_ENV[role])
    if role in file and file[role][0].strip():
        return parse_model(*file[role])
    return None


def load_ai_settings(settings: Settings) -> AiSettings:
    file = _file_models(settings.config_dir)
    env = settings.env
    configured = {  # what the settings table read, for the providers whose variables are ours
        "KNECHT_LANGDOCK_BASE_URL": settings.langdock_base_url,
        "KNECHT_OPENAI_COMPATIBLE_BASE_URL": settings.openai_compatible_base_url,
        "KNECHT_OPENAI_COMPATIBLE_API_KEY": settings.openai_compatible_api_key,
    }

    def value(name: str) -> str | None:  # the providers' own variables (ANTHROPIC_API_KEY, …) as their SDKs read them
        found = configured[name] if name in configured else env.get(name)
        return (found or "").strip() or None

    providers = {
        name: ProviderAccess(api_key=value(key_env), base_url=value(url_env), key_env=key_env, base_url_env=url_env)
        for name, (key_env, url_env) in PROVIDER_ENV.items()
    }
    return AiSettings(
        default=_role(settings, file, "default"),
        fast=_role(settings, file, "fast"),
        auto_diagnose=settings.auto_diagnose,
        timeout=settings.model_timeout,
        providers=providers,
        langdock_region=settings.langdock_region.strip().lower() or "eu",
    )

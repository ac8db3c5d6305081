"""Model roles → models: `languageModel('fast')` of seed 002, on pydantic-ai's model classes.

    provider            model class (pydantic-ai)       SDK            endpoint
    anthropic           AnthropicModel                  anthropic      ANTHROPIC_BASE_URL or the SDK's
    openai              OpenAIChatModel                 openai         OPENAI_BASE_URL or the SDK's
    google              GoogleModel                     google-genai   GOOGLE_GEMINI_BASE_URL or the SDK's
    langdock, claude-*  AnthropicModel                  anthropic      <langdock>/anthropic/<region>
    langdock, others    OpenAIChatModel                 openai         <langdock>/openai/<region>/v1
    openai-compatible   OpenAIChatModel                 openai         KNECHT_OPENAI_COMPATIBLE_BASE_URL

Everything a role needs but lacks (no model set, no key, no base URL) makes the role
*unavailable* with a message naming the variable to set; nothing is looked up before a feature
runs, so a server without any model starts as before. The provider SDKs are imported only then.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

import msgspec

from mcp_knecht.ai.errors import FeatureUnavailable
from mcp_knecht.ai.settings import (
    LANGDOCK_DEFAULT_BASE_URL,
    MODEL_DEFAULT_ENV,
    MODEL_FAST_ENV,
    AiSettings,
    ModelSpec,
    Role,
)

if TYPE_CHECKING:
    from pydantic_ai.models import Model

log = logging.getLogger(__name__)

MAX_OUTPUT_TOKENS = 4096
"""Answers of features are short; a bound also keeps SDKs from streaming behind the scenes."""
SDK_RETRIES = 2


class ResolvedModel(msgspec.Struct, frozen=True):
    spec: ModelSpec
    model: Model
    timeout: float

    @property
    def name(self) -> str:
        return str(self.spec)

    @property
    def settings(self) -> dict[str, Any]:
        return {"max_tokens": MAX_OUTPUT_TOKENS, "timeout": self.timeout}


def unavailable_message(role: Role) -> str:
    return (
        f"No model is configured for AI features (role {role!r}): set {MODEL_DEFAULT_ENV} "
        f"(and optionally {MODEL_FAST_ENV}) to provider:model, e.g. anthropic:claude-haiku-4-5, "
        "or [models] in knecht.toml."
    )


def deprecation_notice(spec: ModelSpec, model: Model) -> str | None:
    """What to tell the operator when the provider has deprecated the model `spec` names, else None.

    pydantic-ai knows the providers' deprecations (its model profiles) and warns on each request;
    this says it once, in the server log, with the setting to change."""
    deprecation = model.profile.get("deprecation")
    if deprecation is None:
        return None
    when = f"retires on {deprecation.retirement_date}" if deprecation.retirement_date else "is retiring"
    if deprecation.rerouted_to:
        when += f", then its requests go to {deprecation.rerouted_to!r}"
    instead = f"; it recommends {deprecation.replacement!r} instead" if deprecation.replacement else ""
    return (f"{spec.source} names {spec}, which its provider has deprecated: it {when}{instead} "
            f"({deprecation.source_url}). Requests go to it until the provider stops them; "
            f"change {spec.source} to another model before then.")


def is_claude(model: str) -> bool:
    return model.lower().startswith(("claude", "anthropic/", "anthropic."))


class ModelResolver:
    """Builds each configured model once, on first use; `aclose()` releases their HTTP clients.

    `fixed` answers every role with one model instead (pydantic-ai's `FunctionModel` or `TestModel`,
    for tests and benchmarks without a provider)."""

    def __init__(self, settings: AiSettings, *, fixed: Model | None = None) -> None:
        self._settings = settings
        self._fixed = fixed
        self._built: dict[str, ResolvedModel] = {}
        self._clients: list[Any] = []

    def configured(self, role: Role) -> bool:
        """A model is set for `role` (it may still lack a key: `resolve` says so)."""
        return self._fixed is not None or self._settings.spec(role) is not None

    def resolve(self, role: Role) -> ResolvedModel:
        if self._fixed is not None:
            fixed = ModelSpec("test", self._fixed.model_name, "a fixed model")
            return ResolvedModel(fixed, self._fixed, self._settings.timeout)
        spec = self._settings.spec(role)
        if spec is None:
            raise FeatureUnavailable(unavailable_message(role))
        if (built := self._built.get(str(spec))) is None:
            built = self._built[str(spec)] = ResolvedModel(spec, self._build(spec), self._settings.timeout)
            if notice := deprecation_notice(spec, built.model):
                log.warning(notice)
        return built

    def _key(self, spec: ModelSpec, *, required: bool = True) -> str | None:
        access = self._settings.providers[spec.provider]
        if required and not access.api_key:
            raise FeatureUnavailable(
                f"{spec.source} names provider {spec.provider!r}, but {access.key_env} is not set."
            )
        return access.api_key

    def _build(self, spec: ModelSpec) -> Model:
        access = self._settings.providers[spec.provider]
        if spec.provider == "anthropic":
            return self._anthropic(spec.model, self._key(spec), access.base_url)
        if spec.provider == "openai":
            return self._openai(spec.model, self._key(spec), access.base_url)
        if spec.provider == "google":
            return self._google(spec.model, self._key(spec), access.base_url)
        if spec.provider == "langdock":
            base = (access.base_url or LANGDOCK_DEFAULT_BASE_URL).rstrip("/")
            region = self._settings.langdock_region
            if is_claude(spec.model):
                return self._anthropic(spec.model, self._key(spec), f"{base}/anthropic/{region}")
            return self._openai(spec.model, self._key(spec), f"{base}/openai/{region}/v1")
        if not access.base_url:
            raise FeatureUnavailable(
                f"{spec.source} names provider 'openai-compatible', but {access.base_url_env} is not set "
                "(e.g. http://127.0.0.1:11434/v1 for Ollama)."
            )
        # Many local servers take no key; the SDK insists on one.
        return self._openai(spec.model, self._key(spec, required=False) or "unused", access.base_url)

    def _anthropic(self, model: str, key: str | None, base_url: str | None) -> Model:
        from anthropic import AsyncAnthropic
        from pydantic_ai.models.anthropic import AnthropicModel
        from pydantic_ai.providers.anthropic import AnthropicProvider

        client = AsyncAnthropic(api_key=key, base_url=base_url, timeout=self._settings.timeout,
                                max_retries=SDK_RETRIES)
        self._clients.append(client)
        return AnthropicModel(model, provider=AnthropicProvider(anthropic_client=client))

    def _openai(self, model: str, key: str | None, base_url: str | None) -> Model:
        from openai import AsyncOpenAI
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider

        client = AsyncOpenAI(api_key=key, base_url=base_url, timeout=self._settings.timeout,
                             max_retries=SDK_RETRIES)
        self._clients.append(client)
        return OpenAIChatModel(model, provider=OpenAIProvider(openai_client=client))

    def _google(self, model: str, key: str | None, base_url: str | None) -> Model:
        import httpx2
        from pydantic_ai.models.google import GoogleModel
        from pydantic_ai.providers.google import GoogleProvider

        client = httpx2.AsyncClient(timeout=httpx2.Timeout(self._settings.timeout, connect=10.0))
        self._clients.append(client)
        return GoogleModel(model, provider=GoogleProvider(api_key=key, base_url=base_url, http_client=client))

    async def aclose(self) -> None:
        for client in self._clients:
            with contextlib.suppress(Exception):  # closing is best effort at shutdown
                await (client.aclose() if hasattr(client, "aclose") else client.close())
        self._clients.clear()
        self._built.clear()

"""Toolsets: a domain's tools and prompts, plugged into the core by import path."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcp_knecht.core.prompts import Prompt
from mcp_knecht.core.scrub import SecretRegistry
from mcp_knecht.core.tools import Tool
from mcp_knecht.errors import ConfigError


@dataclass(frozen=True)
class Toolset:
    name: str
    tools: Sequence[Tool]
    prompts: Sequence[Prompt] = field(default_factory=tuple)
    close: Callable[[], Awaitable[None]] | None = None
    """Release what the toolset opened (connections to other databases); called at shutdown."""


@dataclass(frozen=True)
class ToolsetContext:
    """What a toolset factory is given by the server that loads it."""

    db: Any
    """The server's own store (`mcp_knecht.store.Database`)."""
    secrets: SecretRegistry
    """The server's scrubber: register literal secret values here and every output masks them."""
    config_dir: Path
    env: Mapping[str, str] = field(default_factory=dict)


ToolsetFactory = Callable[[ToolsetContext], Toolset | Awaitable[Toolset]]
"""`factory(context) -> Toolset` (or an awaitable of one, for toolsets that look things up)."""


async def build_toolset(factory: ToolsetFactory, context: ToolsetContext) -> Toolset:
    made = factory(context)
    return await made if inspect.isawaitable(made) else made


def load_factory(spec: str) -> ToolsetFactory:
    """Resolve `package.module:function`."""
    module_name, _, attribute = spec.strip().partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"Toolset {spec!r}: expected 'package.module:function'.")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"Toolset {spec!r}: cannot import {module_name}: {exc}") from None
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise ConfigError(f"Toolset {spec!r}: {module_name} has no function {attribute!r}.")
    return factory  # type: ignore[no-any-return]

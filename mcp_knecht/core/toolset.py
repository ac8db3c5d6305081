"""Toolsets: a domain's tools and prompts, plugged into the core by import path."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mcp_knecht.core.prompts import Prompt
from mcp_knecht.core.tools import Tool
from mcp_knecht.errors import ConfigError


@dataclass(frozen=True)
class Toolset:
    name: str
    tools: Sequence[Tool]
    prompts: Sequence[Prompt] = field(default_factory=tuple)


ToolsetFactory = Callable[[Any], Toolset]
"""`factory(db) -> Toolset`, given the server's database."""


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

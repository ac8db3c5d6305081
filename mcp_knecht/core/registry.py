"""The registry: every tool the server knows, and which of them an actor may see."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from mcp_knecht.core.actor import Actor
from mcp_knecht.core.tools import Tool
from mcp_knecht.errors import ConfigError, ScopeCatalogueError


class Registry:
    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.add(tool)

    def add(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ConfigError(f"Two tools are named {tool.name!r}; tool names must be unique.")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def in_scope(self, actor: Actor) -> list[Tool]:
        return [tool for tool in self._tools.values() if actor.holds(tool.scope)]

    def check_scopes(self, catalogue: Iterable[str]) -> None:
        """Refuse to start when a tool needs a scope the catalogue does not define."""
        known = set(catalogue)
        missing = sorted({(scope, t.name) for t in self._tools.values() for scope in t.scopes if scope not in known})
        if missing:
            listing = ", ".join(f"{scope} (tool {name})" for scope, name in missing)
            raise ScopeCatalogueError(
                f"Tools need scopes missing from the scope catalogue: {listing}. "
                "Add them to scopes/catalogue.toml."
            )

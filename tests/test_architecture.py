"""The architecture, as the folder layout promises it: a core that imports nothing above it, no
import cycles, settings read in one place, and a pinned public toolset API."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import mcp_knecht
from mcp_knecht.core import settings as declared
from mcp_knecht.core import toolset

PACKAGE = Path(mcp_knecht.__file__).resolve().parent
README = PACKAGE.parent / "README.md"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> Iterator[str]:
    """Every mcp_knecht module `name` imports, at any depth of its code (lazy imports count)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


GRAPH = {name: set(_imports(name, path)) for name, path in MODULES.items()}


def _cycle() -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(GRAPH[node]):
            # A package's __init__ importing its own submodules is how a package exposes them.
            if target.startswith(node + "."):
                continue
            if state.get(target) == 1:
                return [*stack[stack.index(target):], target]
            if target not in state and (found := visit(target)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(GRAPH):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_no_module_of_the_package_takes_part_in_an_import_cycle() -> None:
    cycle = _cycle()
    assert cycle is None, "import cycle: " + " → ".join(cycle or [])


def test_the_core_imports_no_store_transport_toolset_or_edge() -> None:
    allowed = ("mcp_knecht.core", "mcp_knecht.errors")
    reaching_out = {
        (name, target) for name, targets in GRAPH.items() if name.startswith("mcp_knecht.core")
        for target in targets if not target.startswith(allowed) and target != "mcp_knecht"
    }
    assert reaching_out == set()


def test_transports_and_toolsets_do_not_import_the_command_line() -> None:
    offending = {(n, t) for n, ts in GRAPH.items() if not n.startswith("mcp_knecht.cli") for t in ts
                 if t.startswith("mcp_knecht.cli")}
    assert offending == set()


def test_knecht_environment_variables_are_read_in_the_settings_module_only() -> None:
    """Outside `core/settings.py` a `KNECHT_…` name may appear in text for people (help, messages,
    docstrings), never where the environment is read."""
    reads = re.compile(r"""(environ|env|getenv)\s*(\.get\s*\(|\[)\s*f?["']KNECHT_""")
    offending = [
        f"{path.relative_to(PACKAGE.parent)}:{number}"
        for path in MODULES.values() if path != Path(declared.__file__).resolve()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if reads.search(line)
    ]
    assert offending == []
    assert len({v.name for v in declared.VARIABLES}) == len(declared.VARIABLES)


def test_every_setting_is_documented_in_the_readme() -> None:
    text = README.read_text(encoding="utf-8")
    missing = [v.name for v in declared.VARIABLES if f"`{v.name}`" not in text]
    assert missing == []


def test_the_public_toolset_api_is_pinned() -> None:
    """What a toolset author imports from `mcp_knecht.core.toolset`: changing it breaks toolsets."""
    assert sorted(toolset.__all__) == [
        "APPROVAL", "Actor", "CHAT", "ChangeFeed", "ConfigError", "ConflictError", "Database", "Effect", "Fact",
        "InvalidArgumentsError", "MCP", "Migrations", "NotFoundError", "PolicyDeniedError", "Prompt",
        "PromptArgument", "Row", "SecretRegistry", "Settings", "Source", "Tool", "ToolContext", "ToolError",
        "ToolInput", "Toolset", "ToolsetContext", "ToolsetFactory", "Transaction", "Wakeups", "build_toolset",
        "feature_source", "load_factory",
    ]
    assert all(hasattr(toolset, name) for name in toolset.__all__)

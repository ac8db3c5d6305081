"""The toolset contract: everything a toolset author needs, in this one module.

A toolset is a domain's tools (and prompts) plugged into the server by import path:

    KNECHT_TOOLSETS=mcp_knecht.knecht:toolset,my_app.tools:toolset

    from pydantic import Field
    from mcp_knecht.core.toolset import (
        Migrations, NotFoundError, Tool, ToolContext, ToolInput, Toolset, ToolsetContext)

    class GetThingInput(ToolInput):                     # unknown fields refused, no coercion
        id: int = Field(ge=1, description="The thing's id, from list_things.")

    def toolset(context: ToolsetContext) -> Toolset:
        store = context.store

        async def get_thing(args: GetThingInput, ctx: ToolContext) -> dict[str, object]:
            row = await store.fetch_one("SELECT * FROM things WHERE id = ?", (args.id,))
            if row is None:
                raise NotFoundError(f"Thing {args.id} does not exist; list_things shows them.")
            return row

        return Toolset(
            name="things",
            tools=[Tool(name="get_thing", description="One thing by id: …", scope="things:read",
                        input_model=GetThingInput, handler=get_thing)],
            instructions="The things tools read the things of …",
            migrations=Migrations("things", "my_app"),         # my_app/sql/<dialect>/0001_things.sql
        )

What a toolset gets — `ToolsetContext`: the server's `store` (the `Database` interface below; SQL
with `?` placeholders, portable between SQLite and PostgreSQL), its `settings` (data dir, config
dir, environment), its `scrubber` (add literal secret values; every output masks them), its
`changes` feed (wake-ups when proposals or other topics change, across processes and replicas) and
its `proposals` (read-only use: what became of a staged call).

What a toolset gives — `Toolset`: its tools and prompts, the text it adds to the MCP
instructions, its own schema migrations (applied before `start`), and `start`/`close` hooks.

Lifecycle: `factory(context)` builds the toolset (it must not touch its own tables yet) → the
server applies every migration → `start()` → serving → `close()` at shutdown.

Tools: `Tool(name=…, description=…, scope=…, input_model=…, handler=…)`. A handler is
`async (validated_input, ToolContext) -> dict | list | pydantic model`; it raises a `ToolError`
(`NotFoundError`, `ConflictError`, `InvalidArgumentsError`, `PolicyDeniedError`) for a failure the
model should read. Anything else becomes "internal error" with a reference; details never leak.
A write (`effect="write"`) is staged for approval by default: give it `freeze` (fill in what the
call depends on, e.g. a commit SHA; named in `frozen_fields`) and `preview` (the current state of
what it would change, as the caller may read it). The gate freezes every call before it runs or
is staged; a handler always receives frozen arguments, and `ctx.source` says who asked.
A tool may also give policy rules facts besides its arguments: `facts` (an async function of the
frozen input returning `{name: value}`) and `fact_fields` (`{name: Fact(str, "the run's branch")}`),
so that `when = { branch = "main" }` in policies.toml holds for what the call will actually touch.
A call whose arguments carry a secret (the value of a password it sets) names them with
`secret_arguments`: its proposal shows them masked, to the proposer and to operators. Literal
secrets that change outside the process are kept current with `scrubber.watch(...)`.
Test a toolset with `mcp_knecht.testing`.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import msgspec

from mcp_knecht.core.actor import Actor
from mcp_knecht.core.changes import ChangeFeed, Wakeups
from mcp_knecht.core.database import Database, Row, Transaction
from mcp_knecht.core.prompts import Prompt, PromptArgument
from mcp_knecht.core.proposals import ProposalRepository
from mcp_knecht.core.schema import Migrations
from mcp_knecht.core.scrub import SecretRegistry
from mcp_knecht.core.settings import Settings
from mcp_knecht.core.tools import (
    APPROVAL,
    CHAT,
    MCP,
    Effect,
    Fact,
    Source,
    Tool,
    ToolContext,
    ToolInput,
    feature_source,
)
from mcp_knecht.errors import (
    ConfigError,
    ConflictError,
    InvalidArgumentsError,
    NotFoundError,
    PolicyDeniedError,
    ToolError,
)

__all__ = [
    "APPROVAL",
    "CHAT",
    "MCP",
    "Actor",
    "ChangeFeed",
    "ConfigError",
    "ConflictError",
    "Database",
    "Effect",
    "Fact",
    "InvalidArgumentsError",
    "Migrations",
    "NotFoundError",
    "PolicyDeniedError",
    "Prompt",
    "PromptArgument",
    "Row",
    "SecretRegistry",
    "Settings",
    "Source",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolInput",
    "Toolset",
    "ToolsetContext",
    "ToolsetFactory",
    "Transaction",
    "Wakeups",
    "build_toolset",
    "feature_source",
    "load_factory",
]


class Toolset(msgspec.Struct, frozen=True, kw_only=True):
    """What a toolset plugs into the registry: its tools, prompts and instructions."""
    name: str
    tools: Sequence[Tool] = ()
    prompts: Sequence[Prompt] = ()
    instructions: str = ""
    """What the model should know about these tools; joined into the server's MCP instructions."""
    migrations: Migrations | None = None
    """The toolset's own tables, applied by the server before `start`."""
    start: Callable[[], Awaitable[None]] | None = None
    """Called once its tables exist (e.g. to load secret values into the scrubber)."""
    close: Callable[[], Awaitable[None]] | None = None
    """Release what the toolset opened (connections to other databases); called at shutdown."""


class ToolsetContext(msgspec.Struct, frozen=True):
    """What a toolset factory is given by the server that loads it."""

    store: Database
    """The server's own store."""
    settings: Settings
    scrubber: SecretRegistry
    """Register literal secret values here and every output masks them."""
    changes: ChangeFeed
    proposals: ProposalRepository
    """The server's proposals (to follow up on what was staged)."""

    @property
    def env(self) -> Mapping[str, str]:
        """The process environment (for names a config file declares)."""
        return self.settings.env

    @property
    def data_dir(self) -> Path:
        return self.settings.data_dir

    @property
    def config_dir(self) -> Path:
        return self.settings.config_dir


ToolsetFactory = Callable[[ToolsetContext], Toolset | Awaitable[Toolset]]
"""`factory(context) -> Toolset` (or an awaitable of one, for toolsets that open connections)."""


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

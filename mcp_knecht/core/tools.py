"""Tool definitions: what a model may call, what it needs, and what it does to the world.

A toolset builds `Tool` values and registers them; the gate is the only caller of `handler`,
`freeze` and `preview`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from functools import cached_property
from typing import Annotated, Any, Literal

import msgspec
from pydantic import BaseModel, ConfigDict
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from mcp_knecht.core.actor import Actor
from mcp_knecht.core.validation import MAX_INT, MAX_STRING_LENGTH, MIN_INT

Effect = Literal["read", "write"]


class ToolInput(BaseModel):
    """Base for input models: unknown fields are refused, types are not coerced.

    Each builds its validator with its first use (its first call, or the first `tools/list` that
    shows it): a cold start builds only the models it lists. A model made from configuration is
    built at once (`entities.models`), so what the configuration gets wrong fails the start."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, defer_build=True)


class _BoundedSchema(GenerateJsonSchema):
    """Input schemas state the bounds the gate enforces for every tool (`core.validation`):
    integers fit in 64 bits, strings have a maximum length."""

    def int_schema(self, schema: core_schema.IntSchema) -> JsonSchemaValue:
        json_schema = super().int_schema(schema)
        if "minimum" not in json_schema and "exclusiveMinimum" not in json_schema:
            json_schema["minimum"] = MIN_INT
        if "maximum" not in json_schema and "exclusiveMaximum" not in json_schema:
            json_schema["maximum"] = MAX_INT
        return json_schema

    def str_schema(self, schema: core_schema.StringSchema) -> JsonSchemaValue:
        json_schema = super().str_schema(schema)
        json_schema.setdefault("maxLength", MAX_STRING_LENGTH)
        return json_schema

    def encode_default(self, dft: Any) -> Any:
        # A JSON scalar is its own encoding; pydantic would build a TypeAdapter for each such default
        # to find that out, on every cold start's first `tools/list`.
        if dft is None or type(dft) in (str, int, bool):
            return dft
        return super().encode_default(dft)


SourceKind = Literal["mcp", "approval", "feature", "chat", "web"]


class Source(msgspec.Struct, frozen=True):
    """Where a call comes from: stamped by the system, never by the caller; the audit log shows it
    as `mcp`, `approval`, `chat`, `web` (a person's page) or `feature:<id>`."""

    kind: SourceKind
    name: str | None = None
    """The feature's id, for kind `feature`."""

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}" if self.name else self.kind

    @property
    def executes_proposal(self) -> bool:
        """True when an operator approved this exact, frozen call."""
        return self.kind == "approval"


MCP = Source("mcp")
APPROVAL = Source("approval")
CHAT = Source("chat")
WEB = Source("web")


def feature_source(feature_id: str) -> Source:
    return Source("feature", feature_id)


class ToolContext(msgspec.Struct, frozen=True):
    """What a handler knows about the call besides its arguments."""

    actor: Actor
    source: Source


Handler = Callable[[Any, ToolContext], Awaitable[Any]]
"""`async (validated_input, context) -> JSON-able result` (a dict, a list or a pydantic model)."""

Freezer = Callable[[Any, ToolContext], Awaitable[BaseModel]]
"""`async (validated_input, context) -> input with everything decided at proposal time filled in`
(a branch resolved to a commit SHA, the base version of a definition). The gate applies it before
a call is staged — so the operator approves, and the hash covers, what will actually run — and
before a call runs at once (policy `auto`), so a handler always gets frozen arguments."""

SecretArguments = Callable[[Any], Collection[str]]
"""`(frozen_input) -> names of the arguments whose values are secrets in this call` (the value of
a secret variable). Their values are shown as the mask wherever the call is shown — to the
proposer's agent, to operators — whatever the set of known secrets is at that moment; only the
keyed argument hash covers them."""

Previewer = Callable[[Any, ToolContext], Awaitable[dict[str, Any] | None]]
"""`async (validated_input, context) -> current state of what the call would change`, as the
proposer may read it; frozen into the proposal so the operator sees what they approve."""

FactFinder = Callable[[Any, ToolContext], Awaitable[Mapping[str, Any]]]
"""`async (frozen_input, context) -> {name: value}`: what policy rules may test besides the
arguments, derived from the frozen call (the branch a run is on, whether a variable is secret).
Called only when a rule for the call tests one of these names; it reads, it never writes."""


class Fact(msgspec.Struct, frozen=True):
    """A value policy rules may test (`when = { NAME = … }`) that is not an argument as typed:
    derived after freezing, or replacing an argument by its resolved form (a workflow id → name)."""

    type: Any
    """What values a rule may compare it with: `str`, `bool` or `int`."""
    description: str


class Tool(msgspec.Struct, frozen=True, kw_only=True, dict=True):  # a __dict__ for the cached schemas
    """A tool as the gate serves it: its name, scope, input model, handler and effects."""
    name: str
    description: str
    scope: str
    input_model: type[BaseModel]
    handler: Handler
    effect: Effect = "read"
    action_effects: Mapping[str, Effect] | None = None
    """For a tool with an `action` argument: the effect of each action (replaces `effect`)."""
    action_scopes: Mapping[str, str] | None = None
    """Actions that need a scope other than `scope` (e.g. `set` needs `variables:write`);
    `scope` alone decides whether the tool is listed."""
    output_model: type[BaseModel] | None = None
    title: str | None = None
    idempotent: bool = False
    preview: Previewer | None = None
    freeze: Freezer | None = None
    frozen_fields: tuple[str, ...] = ()
    """The arguments `freeze` always fills in. An approved proposal whose arguments lack one was
    never frozen, and is refused rather than run."""
    facts: FactFinder | None = None
    fact_fields: Mapping[str, Fact] = msgspec.field(default_factory=dict)
    """What `facts` returns, by name: rules see these (a fact named like an argument replaces it)."""
    secret_arguments: SecretArguments | None = None
    """Which arguments of a (frozen) call carry a secret value: never shown."""

    def __post_init__(self) -> None:
        if self.frozen_fields and self.freeze is None:
            raise TypeError(f"Tool {self.name} names frozen fields but has no freeze step")
        if unknown := sorted(set(self.frozen_fields) - set(self.input_model.model_fields)):
            raise TypeError(f"Tool {self.name} freezes {unknown[0]!r}, which its input does not have")
        if self.action_effects is not None and "action" not in self.input_model.model_fields:
            raise TypeError(f"Tool {self.name} declares action effects but its input has no 'action' field")
        if self.action_scopes and not set(self.action_scopes) <= set(self.actions):
            raise TypeError(f"Tool {self.name} gives scopes to actions it does not declare")
        if bool(self.fact_fields) != (self.facts is not None):
            raise TypeError(f"Tool {self.name} needs both `facts` and `fact_fields`, or neither")

    @property
    def actions(self) -> tuple[str, ...]:
        return tuple(self.action_effects or ())

    def effect_of(self, action: str | None) -> Effect:
        if self.action_effects is None or action is None:
            return self.effect if self.action_effects is None else "write"
        return self.action_effects[action]

    def scope_of(self, action: str | None) -> str:
        return (self.action_scopes or {}).get(action or "", self.scope)

    @property
    def scopes(self) -> frozenset[str]:
        return frozenset({self.scope, *(self.action_scopes or {}).values()})

    @property
    def effects(self) -> frozenset[Effect]:
        return frozenset(self.action_effects.values()) if self.action_effects else frozenset({self.effect})

    @cached_property
    def input_schema(self) -> dict[str, Any]:
        return self.input_model.model_json_schema(schema_generator=_BoundedSchema)

    @cached_property
    def output_schema(self) -> dict[str, Any] | None:
        return self.output_model.model_json_schema() if self.output_model else None

    @cached_property
    def rule_fields(self) -> dict[str, Any]:
        """What a policy rule on this tool may test, by name, with the type its values must have:
        the input's fields (as validated and frozen), with the facts over them."""
        fields: dict[str, Any] = {}
        for name, info in self.input_model.model_fields.items():
            fields[name] = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
        fields.update({name: fact.type for name, fact in self.fact_fields.items()})
        return fields

    def hidden_arguments(self, arguments: BaseModel) -> frozenset[str]:
        """The arguments of this call whose values are secrets (`secret_arguments`)."""
        if self.secret_arguments is None:
            return frozenset()
        return frozenset(name for name in self.secret_arguments(arguments) if name in self.input_model.model_fields)

    def unfrozen(self, arguments: BaseModel) -> list[str]:
        """The frozen fields that `arguments` leave empty (none, after `freeze`)."""
        return [name for name in self.frozen_fields if getattr(arguments, name) is None]

    def annotations(self) -> dict[str, bool | str]:
        """MCP tool annotations, derived from the effects so they cannot drift from behaviour."""
        writes = "write" in self.effects
        hints: dict[str, bool | str] = {
            "readOnlyHint": not writes,
            "destructiveHint": writes,
            "idempotentHint": self.idempotent or not writes,
            "openWorldHint": False,
        }
        if self.title:
            hints["title"] = self.title
        return hints

"""Prompts: named message templates a client can offer as slash commands."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec


class PromptArgument(msgspec.Struct, frozen=True):
    """One argument an MCP prompt takes."""
    name: str
    description: str
    required: bool = True


class Prompt(msgspec.Struct, frozen=True):
    """An MCP prompt a toolset offers, shown to actors holding its scope."""
    name: str
    description: str
    scope: str
    """Offered only to actors holding this scope (the tools it points at need it)."""
    arguments: tuple[PromptArgument, ...]
    render: Callable[[dict[str, str]], Awaitable[str]]
    """`async (arguments) -> the user message`; raise InvalidArgumentsError for bad arguments and
    NotFoundError for a thing that does not exist."""
    title: str | None = None
    tools: tuple[str, ...] = ()
    """The tools the message tells the model to call: the prompt is offered only to actors who may
    call every one of them (their token's scopes, and the policy does not hide them). The server
    refuses to start when one does not exist."""

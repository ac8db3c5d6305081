"""A toolset for tests of staging and approval: write tools whose effects can be counted.

Loaded by servers and CLIs under test with `KNECHT_TOOLSETS=…,tests.toolsets:toolset`.
"""

from __future__ import annotations

from typing import Any, Literal

import anyio
from pydantic import Field

from mcp_knecht.core.database import Transaction
from mcp_knecht.core.tools import Tool, ToolContext, ToolInput
from mcp_knecht.core.toolset import Toolset, ToolsetContext
from mcp_knecht.errors import StoreBusyError, ToolError

EFFECTS_TABLE = (
    "CREATE TABLE IF NOT EXISTS test_effects ("
    " label TEXT NOT NULL, phase TEXT NOT NULL, subject TEXT NOT NULL, source TEXT NOT NULL)"
)


class EffectInput(ToolInput):
    label: str = Field(min_length=1, max_length=100, description="what to record")


class SlowInput(ToolInput):
    label: str = Field(min_length=1, max_length=100)
    seconds: float = Field(ge=0, le=120)


class MemoInput(ToolInput):
    action: Literal["get", "set"]
    text: str = ""


def toolset(context: ToolsetContext) -> Toolset:
    db = context.store

    async def insert(tx: Transaction, label: str, phase: str, ctx: ToolContext) -> None:
        await tx.execute("INSERT INTO test_effects (label, phase, subject, source) VALUES (?, ?, ?, ?)",
                         (label, phase, ctx.actor.subject, str(ctx.source)))

    async def record(label: str, phase: str, ctx: ToolContext) -> None:
        async with db.transaction() as tx:
            await tx.execute(EFFECTS_TABLE)
            await insert(tx, label, phase, ctx)

    async def record_effect(args: EffectInput, ctx: ToolContext) -> dict[str, Any]:
        await record(args.label, "done", ctx)
        return {"recorded": args.label}

    async def preview_effect(args: EffectInput, ctx: ToolContext) -> dict[str, Any]:
        return {"label": args.label, "note": "nothing recorded yet"}

    async def slow_effect(args: SlowInput, ctx: ToolContext) -> dict[str, Any]:
        await record(args.label, "started", ctx)
        await anyio.sleep(args.seconds)
        await record(args.label, "done", ctx)
        return {"recorded": args.label}

    async def stalled_effect(args: SlowInput, ctx: ToolContext) -> dict[str, Any]:
        async with db.transaction() as tx:  # stands still inside its transaction, as a stopped process does
            await tx.execute(EFFECTS_TABLE)
            await insert(tx, args.label, "started", ctx)
            await anyio.sleep(args.seconds)
            await insert(tx, args.label, "done", ctx)
        return {"recorded": args.label}

    async def fail_effect(args: EffectInput, ctx: ToolContext) -> dict[str, Any]:
        raise ToolError(f"could not record {args.label}")

    async def busy_effect(args: EffectInput, ctx: ToolContext) -> dict[str, Any]:
        raise StoreBusyError(f"The store is busy: {args.label} could not be recorded. Nothing was changed; retry "
                             "in a moment.")

    async def memo(args: MemoInput, ctx: ToolContext) -> dict[str, Any]:
        if args.action == "set":
            await record(args.text, "memo", ctx)
        return {"action": args.action}

    return Toolset(name="test", tools=[
        Tool(name="record_effect", description="Record an effect (test tool).", scope="runs:write",
             input_model=EffectInput, handler=record_effect, effect="write", preview=preview_effect),
        Tool(name="slow_effect", description="Record an effect slowly (test tool).", scope="runs:write",
             input_model=SlowInput, handler=slow_effect, effect="write"),
        Tool(name="stalled_effect", description="Record an effect in one transaction that stands still (test tool).",
             scope="runs:write", input_model=SlowInput, handler=stalled_effect, effect="write"),
        Tool(name="fail_effect", description="Fail to record an effect (test tool).", scope="runs:write",
             input_model=EffectInput, handler=fail_effect, effect="write"),
        Tool(name="busy_effect", description="Fail as a write that met a busy store does (test tool).",
             scope="runs:write", input_model=EffectInput, handler=busy_effect, effect="write"),
        Tool(name="memo", description="Read or write a memo (test tool).", scope="runs:write",
             input_model=MemoInput, handler=memo, action_effects={"get": "read", "set": "write"}),
    ])

"""What each feature run cost: one row per run in `ai_feature_runs` (tokens, cost where known,
the tool calls and their gate outcomes, the error of a failed run)."""

from __future__ import annotations

import json
from typing import Any

from mcp_knecht.ai.feature import FeatureResult
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.database import Database, Row


async def record_feature_run(
    db: Database, *, feature: str, actor: Actor, model: str | None, status: str, started_at: str,
    finished_at: str, result: FeatureResult[Any] | None = None, error: str | None = None,
) -> int:
    usage = result.usage if result is not None else None
    calls = [{"step": c.step, "tool": c.tool, "outcome": c.outcome} for c in (result.calls if result else ())]
    async with db.transaction() as tx:
        row = await tx.fetch_one(
            "INSERT INTO ai_feature_runs (feature, subject, client, model, status, steps, requests, input_tokens,"
            " output_tokens, cost_usd, tool_calls, error, started_at, finished_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
            (feature, actor.subject, actor.client, model, status, result.steps if result else 0,
             usage.requests if usage else 0, usage.input_tokens if usage else 0,
             usage.output_tokens if usage else 0, usage.cost_usd if usage else None,
             json.dumps(calls), error, started_at, finished_at),
        )
    assert row is not None
    return int(row["id"])


async def feature_runs(db: Database, *, feature: str | None = None, limit: int = 50) -> list[Row]:
    """Newest first."""
    where, params = ("WHERE feature = ?", [feature]) if feature else ("", [])
    rows = await db.fetch_all(f"SELECT * FROM ai_feature_runs {where} ORDER BY id DESC LIMIT ?", (*params, limit))
    for row in rows:
        row["tool_calls"] = json.loads(row["tool_calls"])
    return rows

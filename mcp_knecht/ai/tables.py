"""What the server needs to know of the AI layer at start, without importing the features: its
tables, and the tools the failure diagnosis reads (it is served only where the gate has them)."""

from __future__ import annotations

from mcp_knecht.core.schema import Migrations

AI_MIGRATIONS = Migrations("ai", "mcp_knecht.ai")
"""`ai_feature_runs` (mcp_knecht/ai/sql/<dialect>/). The diagnoses (`run_diagnoses`) are per-run state,
declared by the Knecht toolset's own migrations beside its runs."""

DIAGNOSIS_TOOLS: tuple[str, ...] = ("get_run", "get_action_log", "get_run_log", "get_workflow")
"""The failure diagnosis's tool allowlist."""

"""Deterministic, realistic demo data for Knecht (moved into a package; split follows)."""

from mcp_knecht.knecht.demo.runs import (
    BASE_TIME,
    FAILING_ACTION,
    FAILURE_KINDS,
    PROJECTS,
    DemoSummary,
    fill_demo_data,
)

__all__ = ["BASE_TIME", "FAILING_ACTION", "FAILURE_KINDS", "PROJECTS", "DemoSummary", "fill_demo_data"]

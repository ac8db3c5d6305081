"""Input models of the Knecht tools. Field descriptions become the JSON schema the model reads."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mcp_knecht.core.tools import ToolInput

RunStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
RunTrigger = Literal["push", "pull_request", "schedule", "manual", "rerun"]

MAX_RUNS_PER_PAGE = 50


class ListProjectsInput(ToolInput):
    """No arguments: every project the caller may see."""


class GetProjectInput(ToolInput):
    project: int | str = Field(
        description="The project: its numeric id (e.g. 1) or its slug (e.g. 'payments-api'), "
        "as returned by list_projects.",
    )


class ListRunsInput(ToolInput):
    project: int | str | None = Field(
        default=None, description="Only runs of this project: numeric id or slug (e.g. 'payments-api')."
    )
    workflow: int | str | None = Field(
        default=None,
        description="Only runs of this workflow: numeric workflow id, or name (e.g. 'ci'). A name matches "
        "that workflow in every project unless `project` is given too.",
    )
    status: RunStatus | None = Field(default=None, description="Only runs with this status.")
    branch: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="Only runs on this branch (exact name, e.g. 'main').",
    )
    trigger: RunTrigger | None = Field(default=None, description="Only runs started by this kind of trigger.")
    limit: int = Field(
        default=20,
        ge=1,
        le=MAX_RUNS_PER_PAGE,
        description=f"How many runs to return (1 to {MAX_RUNS_PER_PAGE}).",
    )
    before: int | None = Field(
        default=None,
        ge=1,
        description="Paging cursor: return only runs with an id lower than this. Pass the `next_cursor` "
        "of the previous page; omit it for the newest runs.",
    )


class GetRunInput(ToolInput):
    run_id: int = Field(ge=1, description="The numeric id of the run (the `id` field of list_runs results).")

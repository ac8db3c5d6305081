"""Input models of the Knecht tools. Field descriptions become the JSON schema the model reads."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

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


# --- Workflows -----------------------------------------------------------------------------------

WorkflowRef = int | str

_WORKFLOW = (
    "The workflow: its numeric id (e.g. 4), or its name (e.g. 'ci') together with `project`. "
    "get_project and list_workflows show the workflows."
)
_PROJECT_OF_WORKFLOW = "The project (numeric id or slug); needed when `workflow` is a name."


class ListWorkflowsInput(ToolInput):
    project: int | str | None = Field(
        default=None, description="Only workflows of this project: numeric id or slug. Omit for all projects."
    )


class GetWorkflowInput(ToolInput):
    workflow: WorkflowRef = Field(description=_WORKFLOW)
    project: int | str | None = Field(default=None, description=_PROJECT_OF_WORKFLOW)
    version: int | None = Field(
        default=None, ge=1, description="A specific version of the definition; omit for the current one."
    )


# --- Logs ----------------------------------------------------------------------------------------

DEFAULT_LOG_LINES = 200
MAX_LOG_LINES = 1_000
MAX_GREP_LENGTH = 200


class _LogWindow(ToolInput):
    tail: int | None = Field(
        default=None,
        ge=1,
        le=MAX_LOG_LINES,
        description=f"Return the last N lines (1 to {MAX_LOG_LINES}). The best first look at a failure: "
        "errors are usually at the end. Cannot be combined with `offset`.",
    )
    offset: int | None = Field(
        default=None,
        ge=0,
        description="Skip this many lines from the start (line 1 is offset 0). Pass the `next_offset` of "
        "the previous page to continue reading.",
    )
    limit: int = Field(
        default=DEFAULT_LOG_LINES,
        ge=1,
        le=MAX_LOG_LINES,
        description=f"At most this many lines (default {DEFAULT_LOG_LINES}, max {MAX_LOG_LINES}); the output "
        "is also capped at about 24 KB.",
    )
    grep: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_GREP_LENGTH,
        description="Only lines containing this text (a literal substring, not a regex; ignores ASCII case). "
        "Combine with `offset` to continue a search; with `tail`, returns the last N matching lines.",
    )


class GetRunLogInput(_LogWindow):
    run_id: int = Field(ge=1, description="The numeric id of the run.")


class GetActionLogInput(_LogWindow):
    run_id: int = Field(ge=1, description="The numeric id of the run.")
    action: int | str = Field(
        description="The action: its numeric id (`actions[].id` of get_run) or its name within the run "
        "(e.g. 'test', 'install'). 0 means the run's own log.",
    )


# --- Writes --------------------------------------------------------------------------------------

CommitSha = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{40}$")]


class RerunRunInput(ToolInput):
    run_id: int = Field(ge=1, description="The run to re-run (it must have finished).")
    ref: Literal["same_commit", "branch_head"] = Field(
        default="same_commit",
        description="'same_commit' re-runs exactly the commit of the run (e.g. to retry a flaky failure); "
        "'branch_head' runs the current head of the run's branch (e.g. after a fix was pushed).",
    )
    commit_sha: CommitSha | None = Field(
        default=None,
        description="Leave empty: filled in when the call is proposed, so the approver sees the exact commit "
        "that will run. If given, it must equal what `ref` resolves to.",
    )


class CancelRunInput(ToolInput):
    run_id: int = Field(ge=1, description="The run to cancel; only queued or running runs can be cancelled.")
    reason: str = Field(default="", max_length=500, description="Why, for the run log and the approver.")


InputValue = str | int | float | bool


class DispatchWorkflowInput(ToolInput):
    workflow: WorkflowRef = Field(description=_WORKFLOW)
    project: int | str | None = Field(default=None, description=_PROJECT_OF_WORKFLOW)
    branch: str = Field(min_length=1, max_length=200, description="The branch to run (e.g. 'main').")
    inputs: dict[str, InputValue] = Field(
        default_factory=dict,
        description="Values for the workflow's declared inputs (get_workflow lists them with type, "
        "required and options); unknown names and wrong types are refused, defaults fill the rest.",
    )
    commit_sha: CommitSha | None = Field(
        default=None,
        description="Leave empty: the branch head is resolved when the call is proposed. If given, it must "
        "be the branch head.",
    )


class InputSpec(ToolInput):
    type: Literal["string", "boolean", "number", "choice"] = Field(description="The value type.")
    required: bool = Field(default=False, description="Whether a dispatch must give a value.")
    default: InputValue | None = Field(default=None, description="The value used when none is given.")
    options: list[str] | None = Field(default=None, description="For type 'choice': the allowed values.")


class UpdateWorkflowInput(ToolInput):
    workflow: WorkflowRef = Field(description=_WORKFLOW)
    project: int | str | None = Field(default=None, description=_PROJECT_OF_WORKFLOW)
    definition: str = Field(
        min_length=1,
        max_length=64_000,
        description="The whole new definition (YAML text), not a patch. Start from get_workflow's definition.",
    )
    inputs: dict[str, InputSpec] | None = Field(
        default=None, description="The declared inputs of the new version; omit to keep the current ones."
    )
    message: str = Field(default="", max_length=500, description="What changes and why, for the approver.")
    base_version: int | None = Field(
        default=None,
        ge=1,
        description="The version this definition is based on (get_workflow's `version`). Filled in with the "
        "current version when proposed if omitted; execution refuses if the workflow changed since.",
    )


class ProjectVariableInput(ToolInput):
    action: Literal["list", "get", "set", "delete"] = Field(
        description="list: names of all variables (values of non-secret ones); get: one variable; "
        "set: create or change one (staged); delete: remove one (staged)."
    )
    project: int | str = Field(description="The project: numeric id or slug.")
    name: str | None = Field(
        default=None,
        pattern=r"^[A-Z][A-Z0-9_]{0,63}$",
        description="The variable name (UPPER_SNAKE_CASE); required for get, set and delete.",
    )
    value: str | None = Field(
        default=None, max_length=4_000, description="For set: the new value (never shown back if secret)."
    )
    secret: bool | None = Field(
        default=None,
        description="For set: whether the value is secret (never returned by any tool). A new variable "
        "defaults to not secret; an existing secret cannot be made non-secret.",
    )

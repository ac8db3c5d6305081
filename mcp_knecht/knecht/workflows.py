"""Workflows: `list_workflows` and `get_workflow` (versioned definitions and their declared inputs),
and the staged `dispatch_workflow` and `update_workflow`.

An update stores version base+1 only if the workflow is still at the base version it was proposed
against: a change made in between is refused, never overwritten.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from mcp_knecht.core import clock
from mcp_knecht.core.database import Database, Row
from mcp_knecht.core.tools import Fact, Tool, ToolContext, ToolInput
from mcp_knecht.errors import ConflictError, InvalidArgumentsError, NotFoundError
from mcp_knecht.knecht.definitions import action_names, check_definition, resolve_inputs
from mcp_knecht.knecht.refs import branch_head, find_project
from mcp_knecht.knecht.runs import CommitSha, definition_shown, queue_run

# --- Inputs --------------------------------------------------------------------------------------

WorkflowRef = int | str
InputValue = str | int | float | bool

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
    workflow_version: int | None = Field(
        default=None,
        ge=1,
        description="Leave empty: the workflow's current version is filled in when the call is proposed, so "
        "the approver sees which definition will run; execution refuses if the workflow changed since.",
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

    def declared_inputs(self) -> dict[str, Any] | None:
        """The new version's inputs as stored, or None to keep the current ones."""
        return None if self.inputs is None else {name: spec.model_dump() for name, spec in self.inputs.items()}


# --- Descriptions --------------------------------------------------------------------------------

LIST_WORKFLOWS = """\
List workflows (CI pipeline definitions), optionally of one project: id, project slug, name, file path, \
current version, when and by whom that version was made, and the status of the workflow's latest run. \
Use get_workflow for a definition's text and declared inputs."""

GET_WORKFLOW = """\
Get one workflow's definition (YAML text) at its current version, or at `version`: the text, the declared \
inputs (name → type, required, default, options) that dispatch_workflow validates against, the action \
names in run order, and the list of all versions with author and date. Address it by numeric id, or by \
name plus project. Read it when diagnosing a failure that may come from the workflow itself (bad YAML, a \
timeout setting, a missing cache), and before proposing update_workflow: `version` is the base of an \
update."""

DISPATCH_WORKFLOW = """\
Propose to start a workflow on a branch (trigger 'manual'), with values for its declared inputs. Inputs \
are validated against the workflow's current declaration (get_workflow shows names, types, required, \
options): unknown names, wrong types and missing required inputs are refused with the field named; \
defaults fill the rest. The branch head is resolved to a commit SHA when you call this. Returns the \
queued run once executed."""

UPDATE_WORKFLOW = """\
Propose a new version of a workflow's definition: pass the whole new YAML text (not a patch), e.g. to fix \
a syntax error or raise a timeout. Read it first with get_workflow; its `version` is the base of your \
change (pass it as `base_version`, or it is taken as the current version when you call this). The \
approver sees a diff. If the workflow changes before approval, the update is refused instead of \
overwriting the other change: read it again and propose anew. Declared `inputs` stay as they are unless \
you pass new ones."""

WORKFLOW_FACTS = {
    "project": Fact(str, "the workflow's project (slug), however the call named it"),
    "workflow": Fact(str, "the workflow's name, however the call named it (id or name)"),
    "workflow_id": Fact(int, "the workflow's id"),
}
"""What policy rules on dispatch_workflow and update_workflow may test besides the arguments: the
workflow and project by name, so `workflow = "deploy"` also holds for a call that gave its id."""

# --- Tools ---------------------------------------------------------------------------------------


class WorkflowTools:
    """The workflow tools, bound to one store."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def list_workflows(self, args: ListWorkflowsInput, ctx: ToolContext) -> dict[str, Any]:
        return {"workflows": await list_workflows(self.db, args.project)}

    async def get_workflow(self, args: GetWorkflowInput, ctx: ToolContext) -> dict[str, Any]:
        return await get_workflow(self.db, args.workflow, args.project, args.version)

    async def _dispatched(self, args: DispatchWorkflowInput) -> tuple[Row, str, dict[str, Any]]:
        """The workflow, the branch head, and the inputs checked against the current declaration."""
        workflow = await find_workflow(self.db, args.workflow, args.project)
        current = await get_workflow(self.db, workflow["id"], None, None)
        inputs = resolve_inputs(current["inputs"], dict(args.inputs))
        head = await branch_head(self.db, workflow["project_id"], args.branch)
        return workflow, head, inputs

    async def freeze_dispatch(self, args: DispatchWorkflowInput, ctx: ToolContext) -> DispatchWorkflowInput:
        workflow, head, inputs = await self._dispatched(args)
        if args.commit_sha is not None and args.commit_sha != head:
            raise ConflictError(
                f"commit_sha {args.commit_sha[:12]} is not the head of {args.branch!r} ({head[:12]}); "
                "leave commit_sha empty."
            )
        version = workflow["current_version"]
        if args.workflow_version is not None and args.workflow_version != version:
            raise ConflictError(f"workflow_version {args.workflow_version} is not the workflow's current version "
                                f"({version}); leave workflow_version empty.")
        return args.model_copy(update={"workflow": workflow["id"], "commit_sha": head, "inputs": inputs,
                                       "workflow_version": version})

    async def preview_dispatch(self, args: DispatchWorkflowInput, ctx: ToolContext) -> dict[str, Any]:
        workflow = await find_workflow(self.db, args.workflow, args.project)
        project = await find_project(self.db, workflow["project_id"])
        assert args.workflow_version is not None
        return {"project": project["slug"], "workflow": workflow["name"], "version": args.workflow_version,
                "branch": args.branch, "commit_sha": args.commit_sha, "inputs": dict(args.inputs),
                "actions": (await definition_shown(self.db, workflow["id"], args.workflow_version))["actions"]}

    async def dispatch(self, args: DispatchWorkflowInput, ctx: ToolContext) -> dict[str, Any]:
        assert args.commit_sha is not None and args.workflow_version is not None and isinstance(args.workflow, int)
        # Exactly the frozen inputs, of exactly the frozen version: queue_run refuses a changed workflow.
        new = await queue_run(
            self.db, workflow_id=args.workflow, version=args.workflow_version, branch=args.branch,
            commit_sha=args.commit_sha, trigger="manual", inputs=dict(args.inputs), actor=ctx.actor.subject,
        )
        return {"run": new, "next": f"Follow it with get_run(run_id={new['id']})."}

    async def freeze_update(self, args: UpdateWorkflowInput, ctx: ToolContext) -> UpdateWorkflowInput:
        workflow = await find_workflow(self.db, args.workflow, args.project)
        if problems := check_definition(args.definition):
            raise InvalidArgumentsError(
                "update_workflow", [{"field": "definition", "problem": p} for p in problems]
            )
        base = args.base_version or workflow["current_version"]
        if base != workflow["current_version"]:
            raise stale(workflow, base)
        return args.model_copy(update={"workflow": workflow["id"], "base_version": base})

    async def preview_update(self, args: UpdateWorkflowInput, ctx: ToolContext) -> dict[str, Any]:
        workflow = await find_workflow(self.db, args.workflow, args.project)
        base = args.base_version or workflow["current_version"]
        preview = await definition_diff(self.db, workflow, base, args.definition)
        if args.message:
            preview["message"] = args.message
        if (inputs := args.declared_inputs()) is not None:
            preview["new_inputs"] = inputs
        return preview

    async def update(self, args: UpdateWorkflowInput, ctx: ToolContext) -> dict[str, Any]:
        assert args.base_version is not None
        workflow = await find_workflow(self.db, args.workflow, args.project)
        return await update_workflow(
            self.db, workflow["id"], base_version=args.base_version, definition=args.definition,
            inputs=args.declared_inputs(), actor=ctx.actor.subject,
        )

    async def facts(self, args: DispatchWorkflowInput | UpdateWorkflowInput, ctx: ToolContext) -> dict[str, Any]:
        """What policy rules on dispatch_workflow and update_workflow see (WORKFLOW_FACTS)."""
        workflow = await find_workflow(self.db, args.workflow, args.project)
        project = await find_project(self.db, workflow["project_id"])
        return {"project": project["slug"], "workflow": workflow["name"], "workflow_id": workflow["id"]}

    def tools(self) -> list[Tool]:
        return [
            Tool(name="list_workflows", description=LIST_WORKFLOWS, scope="workflows:read",
                 input_model=ListWorkflowsInput, handler=self.list_workflows, title="List workflows"),
            Tool(name="get_workflow", description=GET_WORKFLOW, scope="workflows:read",
                 input_model=GetWorkflowInput, handler=self.get_workflow, title="Get a workflow definition"),
            Tool(name="dispatch_workflow", description=DISPATCH_WORKFLOW, scope="workflows:write",
                 input_model=DispatchWorkflowInput, handler=self.dispatch, effect="write",
                 preview=self.preview_dispatch, freeze=self.freeze_dispatch,
                 frozen_fields=("commit_sha", "workflow_version"), facts=self.facts, fact_fields=WORKFLOW_FACTS,
                 title="Start a workflow"),
            Tool(name="update_workflow", description=UPDATE_WORKFLOW, scope="workflows:write",
                 input_model=UpdateWorkflowInput, handler=self.update, effect="write",
                 preview=self.preview_update, freeze=self.freeze_update, frozen_fields=("base_version",),
                 facts=self.facts, fact_fields=WORKFLOW_FACTS, title="Change a workflow definition"),
        ]


# --- Queries -------------------------------------------------------------------------------------


async def find_workflow(db: Database, workflow: int | str, project: int | str | None) -> Row:
    """The workflow row for an id, or a name within a project; a name alone must be unambiguous."""
    project_id = (await find_project(db, project))["id"] if project is not None else None
    if isinstance(workflow, int) or workflow.isdigit():
        row = await db.fetch_one("SELECT * FROM workflows WHERE id = ?", (int(workflow),))
        if row is not None and (project_id is None or row["project_id"] == project_id):
            return row
    elif project_id is not None:
        row = await db.fetch_one(
            "SELECT * FROM workflows WHERE name = ? AND project_id = ?", (workflow, project_id)
        )
        if row is not None:
            return row
    else:
        rows = await db.fetch_all("SELECT * FROM workflows WHERE name = ? ORDER BY id", (workflow,))
        if len(rows) == 1:
            return rows[0]
        if rows:
            raise InvalidArgumentsError(
                "workflow",
                [{"field": "project", "problem": f"{len(rows)} projects have a workflow named {workflow!r}; "
                  "give `project` too, or the workflow's numeric id"}],
            )
    where = "" if project is None else f" in project {project!r}"
    raise NotFoundError(f"Workflow {workflow!r} does not exist{where}. list_workflows shows the workflows.")


async def list_workflows(db: Database, project: int | str | None) -> list[dict[str, Any]]:
    params: tuple[Any, ...] = ()
    where = ""
    if project is not None:
        where = " WHERE w.project_id = ?"
        params = ((await find_project(db, project))["id"],)
    return await db.fetch_all(
        "SELECT w.id, p.slug AS project, w.name, w.path, w.current_version,"
        " v.created_at AS updated_at, v.created_by AS updated_by,"
        " (SELECT r.status FROM runs r WHERE r.workflow_id = w.id ORDER BY r.id DESC LIMIT 1) AS latest_run_status"
        " FROM workflows w JOIN projects p ON p.id = w.project_id"
        " JOIN workflow_versions v ON v.workflow_id = w.id AND v.version = w.current_version"
        f"{where} ORDER BY p.slug, w.name",
        params,
    )


async def get_workflow(
    db: Database, workflow: int | str, project: int | str | None, version: int | None
) -> dict[str, Any]:
    row = await find_workflow(db, workflow, project)
    wanted = version or row["current_version"]
    stored = await db.fetch_one(
        "SELECT version, definition, inputs_json, created_at, created_by FROM workflow_versions"
        " WHERE workflow_id = ? AND version = ?",
        (row["id"], wanted),
    )
    if stored is None:
        raise NotFoundError(
            f"Workflow {row['name']!r} has no version {wanted}; its versions are 1 to {row['current_version']}."
        )
    versions = await db.fetch_all(
        "SELECT version, created_at, created_by FROM workflow_versions WHERE workflow_id = ? ORDER BY version",
        (row["id"],),
    )
    project_row = await find_project(db, row["project_id"])
    return {
        "id": row["id"],
        "project": project_row["slug"],
        "name": row["name"],
        "path": row["path"],
        "version": stored["version"],
        "current_version": row["current_version"],
        "is_current": stored["version"] == row["current_version"],
        "definition": stored["definition"],
        "inputs": json.loads(stored["inputs_json"] or "{}"),
        "actions": action_names(stored["definition"]),
        "created_at": stored["created_at"],
        "created_by": stored["created_by"],
        "versions": versions,
    }


async def definition_diff(db: Database, workflow: Row, base_version: int, definition: str) -> dict[str, Any]:
    """The preview of an update: a unified diff from the base version to the proposed definition."""
    stored = await db.fetch_one(
        "SELECT definition FROM workflow_versions WHERE workflow_id = ? AND version = ?",
        (workflow["id"], base_version),
    )
    old = stored["definition"] if stored else ""
    import difflib  # only for a preview: not on every start's path

    diff = difflib.unified_diff(
        old.splitlines(keepends=True), definition.splitlines(keepends=True),
        fromfile=f"{workflow['path']} (version {base_version})",
        tofile=f"{workflow['path']} (proposed version {base_version + 1})",
    )
    return {
        "workflow_id": workflow["id"],
        "workflow": workflow["name"],
        "base_version": base_version,
        "current_version": workflow["current_version"],
        "diff": "".join(diff) or "(no change to the definition text)",
    }


async def update_workflow(
    db: Database,
    workflow_id: int,
    *,
    base_version: int,
    definition: str,
    inputs: dict[str, Any] | None,
    actor: str,
) -> dict[str, Any]:
    """Store version base+1, only if the workflow is still at `base_version` (no lost update)."""
    now = clock.timestamp()
    async with db.transaction() as tx:
        row = await tx.fetch_one("SELECT * FROM workflows WHERE id = ?", (workflow_id,))
        if row is None:
            raise NotFoundError(f"Workflow {workflow_id} does not exist any more.")
        if row["current_version"] != base_version:
            raise stale(row, base_version)
        if inputs is None:
            current = await tx.fetch_one(
                "SELECT inputs_json FROM workflow_versions WHERE workflow_id = ? AND version = ?",
                (workflow_id, base_version),
            )
            inputs_json = current["inputs_json"] if current else "{}"
        else:
            inputs_json = json.dumps(inputs, sort_keys=True)
        version = base_version + 1
        changed = await tx.execute(
            "UPDATE workflows SET current_version = ? WHERE id = ? AND current_version = ?",
            (version, workflow_id, base_version),
        )
        if changed != 1:
            raise stale(row, base_version)
        await tx.execute(
            "INSERT INTO workflow_versions (workflow_id, version, definition, inputs_json, created_at, created_by)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (workflow_id, version, definition, inputs_json, now, actor),
        )
    return {"workflow_id": workflow_id, "workflow": row["name"], "version": version,
            "previous_version": base_version, "created_at": now, "created_by": actor}


def stale(row: Row, base_version: int) -> ConflictError:
    return ConflictError(
        f"Workflow {row['name']!r} (id {row['id']}) changed since this update was proposed: it is at version "
        f"{row['current_version']} now, the proposal was based on version {base_version}. Nothing was changed; "
        "read the current definition with get_workflow and propose the update again.",
        details={"workflow_id": row["id"], "base_version": base_version, "current_version": row["current_version"]},
    )

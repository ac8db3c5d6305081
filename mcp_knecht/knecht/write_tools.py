"""The Knecht write tools: staged by default, so each one has three parts.

    freeze   at proposal time: decide what will actually run (branch → commit SHA, base version,
             defaults of inputs) and put it into the arguments, which are then hashed and frozen
    preview  at proposal time: the current state of what the call would change, for the approver
    handler  at execution (after approval): do it, re-checking the state it depends on

The gate applies `freeze` before a call is staged and before it runs at once (policy `auto`), and
refuses to execute an approved proposal whose `frozen_fields` are empty: a handler always gets
frozen arguments.
"""

from __future__ import annotations

import json
from typing import Any

from mcp_knecht.core.database import Database
from mcp_knecht.core.scrub import SecretRegistry
from mcp_knecht.core.tools import Tool, ToolContext
from mcp_knecht.errors import ConflictError, InvalidArgumentsError
from mcp_knecht.knecht import runs, variables, workflows
from mcp_knecht.knecht.inputs import (
    CancelRunInput,
    DispatchWorkflowInput,
    ProjectVariableInput,
    RerunRunInput,
    UpdateWorkflowInput,
)
from mcp_knecht.knecht.queries import find_project

RERUN_RUN = """\
Propose to run a finished run again (same workflow, branch and inputs), as a new run with trigger \
'rerun' and rerun_of set. `ref` = 'same_commit' (default) re-runs the exact commit, e.g. to retry a flaky \
network failure or timeout; 'branch_head' runs the branch's current head, e.g. after a fix was pushed. The \
commit is resolved when you call this, so the approver approves exactly what will run. Queued or running \
runs cannot be re-run. Returns the new run once executed."""

CANCEL_RUN = """\
Propose to cancel a queued or running run: its running action is cancelled, pending ones are skipped. A \
run that already finished (succeeded, failed, cancelled) cannot be cancelled: you get a clear error at \
once. Give a short `reason`; it goes into the run log."""

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

PROJECT_VARIABLE = """\
Project variables (configuration and secrets the workflows use). action 'list': every variable of the \
project with name, whether it is secret, value (null for secrets), who changed it when; 'get': one \
variable; 'set': create or change one (needs `name` and `value`; `secret` true for credentials); \
'delete': remove one. 'set' and 'delete' need scope variables:write and are staged for approval. A \
secret's value is never returned by any tool, preview or result, not even to whoever set it."""

def _missing(tool: str, field: str, why: str) -> InvalidArgumentsError:
    return InvalidArgumentsError(tool, [{"field": field, "problem": why}])


def knecht_write_tools(db: Database, *, secrets: SecretRegistry | None = None) -> list[Tool]:
    """The Knecht write tools, bound to `db`; `secrets` (if given) is refreshed when variables change."""

    async def refresh_secrets() -> None:
        if secrets is not None:
            secrets.update(await variables.secret_values(db))

    # --- rerun_run ---------------------------------------------------------------------------------

    async def rerun_freeze(args: RerunRunInput, ctx: ToolContext) -> RerunRunInput:
        run = await runs.run_row(db, args.run_id)
        if run["status"] in runs.ACTIVE:
            raise ConflictError(
                f"Run {args.run_id} is still {run['status']}; only a finished run can be re-run "
                "(cancel it first with cancel_run, or wait)."
            )
        resolved = (
            run["commit_sha"] if args.ref == "same_commit"
            else await runs.branch_head(db, run["project_id"], run["branch"])
        )
        if args.commit_sha is not None and args.commit_sha != resolved:
            raise ConflictError(
                f"commit_sha {args.commit_sha[:12]} is not what ref={args.ref!r} resolves to ({resolved[:12]}); "
                "leave commit_sha empty."
            )
        return args.model_copy(update={"commit_sha": resolved})

    async def rerun_preview(args: RerunRunInput, ctx: ToolContext) -> dict[str, Any]:
        run = await runs.run_row(db, args.run_id)
        return {"run": runs.summary(run),
                "will_run": {"branch": run["branch"], "commit_sha": args.commit_sha, "ref": args.ref}}

    async def rerun(args: RerunRunInput, ctx: ToolContext) -> dict[str, Any]:
        assert args.commit_sha is not None
        run = await runs.run_row(db, args.run_id)
        if run["status"] in runs.ACTIVE:
            raise ConflictError(f"Run {args.run_id} is {run['status']} again; not re-running it twice.")
        new = await runs.queue_run(
            db, workflow_id=run["workflow_id"], branch=run["branch"], commit_sha=args.commit_sha,
            trigger="rerun", inputs=_inputs(run), actor=ctx.actor.subject, rerun_of=run["id"],
        )
        return {"run": new, "next": f"Follow it with get_run(run_id={new['id']})."}

    # --- cancel_run --------------------------------------------------------------------------------

    async def cancel_preview(args: CancelRunInput, ctx: ToolContext) -> dict[str, Any]:
        run = await runs.run_row(db, args.run_id)
        if run["status"] not in runs.ACTIVE:
            raise runs.not_cancellable(run)  # refused at once, not staged for nothing
        return {"run": runs.summary(run)}

    async def cancel(args: CancelRunInput, ctx: ToolContext) -> dict[str, Any]:
        return await runs.cancel_run(db, args.run_id, ctx.actor.subject, args.reason)

    # --- dispatch_workflow -------------------------------------------------------------------------

    async def dispatch_resolve(args: DispatchWorkflowInput) -> tuple[dict[str, Any], str, dict[str, Any]]:
        workflow = await workflows.find_workflow(db, args.workflow, args.project)
        current = await workflows.get_workflow(db, workflow["id"], None, None)
        inputs = workflows.resolve_inputs(current["inputs"], dict(args.inputs))
        head = await runs.branch_head(db, workflow["project_id"], args.branch)
        return workflow, head, inputs

    async def dispatch_freeze(args: DispatchWorkflowInput, ctx: ToolContext) -> DispatchWorkflowInput:
        workflow, head, inputs = await dispatch_resolve(args)
        if args.commit_sha is not None and args.commit_sha != head:
            raise ConflictError(
                f"commit_sha {args.commit_sha[:12]} is not the head of {args.branch!r} ({head[:12]}); "
                "leave commit_sha empty."
            )
        return args.model_copy(update={"workflow": workflow["id"], "commit_sha": head, "inputs": inputs})

    async def dispatch_preview(args: DispatchWorkflowInput, ctx: ToolContext) -> dict[str, Any]:
        workflow = await workflows.find_workflow(db, args.workflow, args.project)
        project = await find_project(db, workflow["project_id"])
        return {"project": project["slug"], "workflow": workflow["name"], "version": workflow["current_version"],
                "branch": args.branch, "commit_sha": args.commit_sha, "inputs": dict(args.inputs)}

    async def dispatch(args: DispatchWorkflowInput, ctx: ToolContext) -> dict[str, Any]:
        assert args.commit_sha is not None
        workflow, _, inputs = await dispatch_resolve(args)  # the declaration may have changed since
        new = await runs.queue_run(
            db, workflow_id=workflow["id"], branch=args.branch, commit_sha=args.commit_sha,
            trigger="manual", inputs=inputs, actor=ctx.actor.subject,
        )
        return {"run": new, "next": f"Follow it with get_run(run_id={new['id']})."}

    # --- update_workflow ---------------------------------------------------------------------------

    async def update_freeze(args: UpdateWorkflowInput, ctx: ToolContext) -> UpdateWorkflowInput:
        workflow = await workflows.find_workflow(db, args.workflow, args.project)
        problems = workflows.check_definition(args.definition)
        if problems:
            raise InvalidArgumentsError(
                "update_workflow", [{"field": "definition", "problem": p} for p in problems]
            )
        base = args.base_version or workflow["current_version"]
        if base != workflow["current_version"]:
            raise workflows.stale(workflow, base)
        return args.model_copy(update={"workflow": workflow["id"], "base_version": base})

    async def update_preview(args: UpdateWorkflowInput, ctx: ToolContext) -> dict[str, Any]:
        workflow = await workflows.find_workflow(db, args.workflow, args.project)
        base = args.base_version or workflow["current_version"]
        preview = await workflows.definition_diff(db, workflow, base, args.definition)
        if args.message:
            preview["message"] = args.message
        if args.inputs is not None:
            preview["new_inputs"] = {name: spec.model_dump() for name, spec in args.inputs.items()}
        return preview

    async def update(args: UpdateWorkflowInput, ctx: ToolContext) -> dict[str, Any]:
        assert args.base_version is not None
        workflow = await workflows.find_workflow(db, args.workflow, args.project)
        inputs = {name: spec.model_dump() for name, spec in args.inputs.items()} if args.inputs is not None else None
        return await workflows.update_workflow(
            db, workflow["id"], base_version=args.base_version, definition=args.definition,
            inputs=inputs, actor=ctx.actor.subject,
        )

    # --- project_variable --------------------------------------------------------------------------

    def need_name(args: ProjectVariableInput) -> str:
        if args.name is None:
            raise _missing("project_variable", "name", f"required for action {args.action!r}")
        return args.name

    async def variable_freeze(args: ProjectVariableInput, ctx: ToolContext) -> ProjectVariableInput:
        if args.action in ("list", "get"):
            return args  # reads depend on nothing that could change before they run
        name = need_name(args)
        project = await find_project(db, args.project)
        existing = await variables.get_variable(db, project["id"], name)
        if args.action == "set":
            if args.value is None:
                raise _missing("project_variable", "value", "required for action 'set'")
            if variables.check_secrecy(existing, args.secret) and secrets is not None:
                # From now on the pending proposal itself (get_proposal, previews) masks the value.
                secrets.add([args.value])
        elif existing is None:
            await variables.require_variable(db, project["id"], project["slug"], name)
        return args.model_copy(update={"project": project["slug"]})

    async def variable_preview(args: ProjectVariableInput, ctx: ToolContext) -> dict[str, Any]:
        project = await find_project(db, args.project)
        existing = await variables.get_variable(db, project["id"], need_name(args))
        preview: dict[str, Any] = {"project": project["slug"], "name": args.name, "action": args.action,
                                   "current": variables.shown(existing) if existing else None}
        if args.action == "set":
            secret = variables.check_secrecy(existing, args.secret)
            preview["new"] = {"secret": secret, "value": variables.HIDDEN if secret else args.value}
        return preview

    async def variable(args: ProjectVariableInput, ctx: ToolContext) -> dict[str, Any]:
        project = await find_project(db, args.project)
        if args.action == "list":
            return {"project": project["slug"], "variables": await variables.list_variables(db, project["id"])}
        name = need_name(args)
        if args.action == "get":
            row = await variables.require_variable(db, project["id"], project["slug"], name)
            return {"project": project["slug"], "variable": variables.shown(row)}
        if args.action == "set":
            if args.value is None:
                raise _missing("project_variable", "value", "required for action 'set'")
            if args.secret is not False and secrets is not None:
                secrets.add([args.value])  # masked before the write can show up anywhere
            result = await variables.set_variable(db, project["id"], name, args.value, args.secret, ctx.actor.subject)
        else:
            result = await variables.delete_variable(db, project["id"], name)
        await refresh_secrets()
        return {"project": project["slug"], **result}

    return [
        Tool(name="rerun_run", description=RERUN_RUN, scope="runs:write", input_model=RerunRunInput,
             handler=rerun, effect="write", preview=rerun_preview, freeze=rerun_freeze,
             frozen_fields=("commit_sha",), title="Re-run a run"),
        Tool(name="cancel_run", description=CANCEL_RUN, scope="runs:write", input_model=CancelRunInput,
             handler=cancel, effect="write", preview=cancel_preview, title="Cancel a run"),
        Tool(name="dispatch_workflow", description=DISPATCH_WORKFLOW, scope="workflows:write",
             input_model=DispatchWorkflowInput, handler=dispatch, effect="write", preview=dispatch_preview,
             freeze=dispatch_freeze, frozen_fields=("commit_sha",), title="Start a workflow"),
        Tool(name="update_workflow", description=UPDATE_WORKFLOW, scope="workflows:write",
             input_model=UpdateWorkflowInput, handler=update, effect="write", preview=update_preview,
             freeze=update_freeze, frozen_fields=("base_version",), title="Change a workflow definition"),
        Tool(name="project_variable", description=PROJECT_VARIABLE, scope="variables:read",
             input_model=ProjectVariableInput, handler=variable,
             action_effects={"list": "read", "get": "read", "set": "write", "delete": "write"},
             action_scopes={"set": "variables:write", "delete": "variables:write"},
             preview=variable_preview, freeze=variable_freeze, title="Project variables"),
    ]


def _inputs(run: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(run.get("inputs_json") or "{}"))

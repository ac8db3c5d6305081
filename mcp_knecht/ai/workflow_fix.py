"""A feature that writes (feature `workflow-fix`): given a failed run whose cause is in its workflow,
propose a corrected definition with `update_workflow`.

The policy stages `update_workflow` (a write) as a proposal, so what this feature can reach is a
pending proposal that an operator approves with `knecht-approve` — never a change by itself. It
obeys the same policy and scopes as an MCP client: an actor without `workflows:write` is not
offered the tool, and a call anyway is refused by the gate, as is a call the policy denies.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from mcp_knecht.ai.feature import Feature


class WorkflowFixOutput(BaseModel):
    summary: str = Field(
        min_length=1, max_length=1000,
        description="One or two sentences: what was wrong in the workflow and what the proposed change does, "
        "or why no change to the workflow would fix this failure.",
    )
    proposalId: int | None = Field(  # camelCase, as in the HTTP contracts
        default=None, description="The id from 'Submitted for approval (#ID)' of update_workflow; null if none.",
    )


WORKFLOW_FIX = Feature(
    id="workflow-fix",
    role="default",
    instructions=(
        "You fix Knecht CI workflow definitions. Read the failed run (get_run) and the failed action's log "
        "(get_action_log with tail), then the workflow at the run's version (get_workflow). If the cause is in "
        "the definition (invalid YAML, a timeout too short, a missing cache or step), propose the whole "
        "corrected YAML with update_workflow, passing the version you read as base_version and a short "
        "message. The change is staged for a human to approve; that is expected, not a failure. If the cause "
        "is not in the workflow (a failing test, a flaky network), propose nothing. Answer with a short "
        "summary and the proposal id, if any."
    ),
    tools=("get_run", "get_action_log", "get_run_log", "get_workflow", "update_workflow"),
    output=WorkflowFixOutput,
    max_steps=6,
)


def workflow_fix_prompt(run_id: int) -> str:
    return f"Run {run_id} failed. If its workflow definition caused it, propose a corrected definition."

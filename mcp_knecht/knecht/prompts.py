"""The `diagnose_run` prompt: seed 002's failure diagnosis as a slash command."""

from __future__ import annotations

from mcp_knecht.core.database import Database
from mcp_knecht.core.prompts import Prompt, PromptArgument
from mcp_knecht.errors import InvalidArgumentsError, NotFoundError

DIAGNOSE_RUN = """\
Find out why Knecht CI run {run_id} failed, and say how to fix it.

1. Call get_run(run_id={run_id}). Note `failed_action` (its id and name) and the run's workflow and version.
2. Read the failed action's log: get_action_log(run_id={run_id}, action=<failed action id>, tail=80).
3. If the cause is not in that log (e.g. the process was killed, or it only shows a symptom), read the logs \
of earlier actions of the same run (tail or grep for 'warning', 'error'), and the run's own log \
(get_run_log).
4. Read the workflow definition (get_workflow with the run's workflow id and version) when the cause may \
be in the workflow itself: invalid YAML, a timeout, missing caching, inputs.
5. Stop as soon as you know the cause; do not read more than you need.

Answer in one or two sentences: the cause, and the most likely fix. Then list the ids of the actions \
whose logs show the cause, as `actions: [id, ...]`. Do not quote secrets; they are masked anyway.\
"""


def knecht_prompts(db: Database) -> list[Prompt]:
    async def render_diagnosis(arguments: dict[str, str]) -> str:
        raw = (arguments.get("run_id") or "").strip().lstrip("#")
        if not raw.isdigit() or int(raw) < 1:
            raise InvalidArgumentsError(
                "diagnose_run", [{"field": "run_id", "problem": f"expected a run id such as 42 (got {raw!r})"}]
            )
        run = await db.fetch_one("SELECT status FROM runs WHERE id = ?", (int(raw),))
        if run is None:
            raise NotFoundError(f"Run {int(raw)} does not exist; list_runs(status=\"failed\") shows failed runs.")
        return DIAGNOSE_RUN.format(run_id=int(raw))

    return [
        Prompt(
            name="diagnose_run",
            title="Diagnose a failed run",
            description="Explain why a CI run failed: its cause and most likely fix in one or two sentences, "
            "and the actions whose logs show it. Reads the run, the failed action's log, earlier logs if "
            "needed, and the workflow.",
            scope="logs:read",
            arguments=(PromptArgument("run_id", "The numeric id of the failed run (e.g. 42)."),),
            render=render_diagnosis,
            tools=("get_run", "get_action_log", "get_run_log", "get_workflow"),
        )
    ]

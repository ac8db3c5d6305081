"""Scripted models for tests and benchmarks of AI features: no provider, no network, the real loop.

    runtime = AiRuntime(settings, gate=app.gate, db=app.db, models=ModelResolver(settings, fixed=scripted_diagnoser()))

`scripted_diagnoser()` is pydantic-ai's `FunctionModel` playing the failure diagnosis the way the
`diagnose_run` prompt describes it: get_run, then the failed action's log, then an answer that
quotes the log's last line and names that action.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

_RUN = re.compile(r"Run (\d+) failed")


def _tool_results(messages: list[ModelMessage]) -> list[str]:
    return [str(part.content) for message in messages if isinstance(message, ModelRequest)
            for part in message.parts if isinstance(part, ToolReturnPart)]


def _diagnose(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    first = messages[0]
    parts = first.parts if isinstance(first, ModelRequest) else []
    prompt = "".join(str(getattr(part, "content", "")) for part in parts)
    found = _RUN.search(prompt)
    if found is None:
        return ModelResponse(parts=[ToolCallPart("final_result", {"summary": "No run id in the prompt."})])
    run_id = int(found.group(1))
    results = _tool_results(messages)
    call: tuple[str, dict[str, Any]]
    if not results:
        call = ("get_run", {"run_id": run_id})
    elif len(results) == 1:
        failed = json.loads(results[0]).get("failed_action") or {"id": 0}
        call = ("get_action_log", {"run_id": run_id, "action": failed["id"], "tail": 20})
    else:
        log = json.loads(results[-1])
        last = log["lines"][-1]["text"] if log.get("lines") else "its log is empty"
        call = ("final_result", {"summary": f"{log['action']['name']} failed: {last[:300]}",
                                 "actionIds": [log["action"]["id"]]})
    return ModelResponse(parts=[ToolCallPart(*call)])


def scripted_diagnoser() -> FunctionModel:
    return FunctionModel(_diagnose, model_name="scripted-diagnoser")

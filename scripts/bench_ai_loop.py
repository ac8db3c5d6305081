"""Benchmark: the agentic loop's own overhead per step, against calling the same tools directly
through the gate.

    python scripts/bench_ai_loop.py [--steps 8] [--repeats 15] [--json]

A feature run of `--steps` steps calls one tool per step (get_run, then get_action_log of the failed
action with tail 20, alternating, on the demo data's failed runs) and then answers. Model time is
excluded: the model is a replay of prepared responses (`replay`, a bare pydantic-ai `Model` that
returns the next response at once) — and, for comparison, pydantic-ai's `FunctionModel` playing
the same script (`function`), which adds that library's per-request bookkeeping.

    direct    the same tool calls, in the same order, with the same arguments and audit source,
              straight through `Gate.call_tool`
    loop      `run_feature(...)` over the same gate: tool definitions, messages, the model request
              wrapper, the gate call, scrubbing, the final answer's validation

Printed: medians over `--repeats` runs of the whole sequence, per step, and loop/direct (target ≤ 1.2);
wall time and, since the machine may be shared, the process's CPU time (all threads) too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pydantic import BaseModel  # noqa: E402
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart  # noqa: E402
from pydantic_ai.models import Model, ModelRequestParameters  # noqa: E402
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402
from pydantic_ai.settings import ModelSettings  # noqa: E402

from mcp_knecht.ai.feature import Feature  # noqa: E402
from mcp_knecht.ai.loop import run_feature  # noqa: E402
from mcp_knecht.app import App, open_app  # noqa: E402
from mcp_knecht.core.actor import Actor  # noqa: E402
from mcp_knecht.core.settings import load_settings  # noqa: E402
from mcp_knecht.core.tools import feature_source  # noqa: E402
from mcp_knecht.knecht import open_store  # noqa: E402
from mcp_knecht.knecht.demo import fill_demo_data  # noqa: E402

ACTOR = Actor("bench", "bench", frozenset({"runs:read", "logs:read", "workflows:read"}))


class Answer(BaseModel):
    summary: str
    actionIds: list[int]  # as the diagnosis answers


def feature(steps: int) -> Feature[Answer]:
    return Feature(id="bench", role="fast", instructions="Benchmark.", tools=("get_run", "get_action_log"),
                   output=Answer, max_steps=steps + 1)


@dataclass
class Replay(Model):
    """Returns prepared responses in order, at once: no model time."""

    responses: list[ModelResponse]

    def __post_init__(self) -> None:
        super().__init__()
        self._next = 0

    async def request(self, messages: list[ModelMessage], model_settings: ModelSettings | None,
                      model_request_parameters: ModelRequestParameters) -> ModelResponse:
        response = self.responses[self._next % len(self.responses)]
        self._next += 1
        return response

    @property
    def model_name(self) -> str:
        return "replay"

    @property
    def system(self) -> str:
        return "replay"


def script(runs: list[tuple[int, int]], steps: int) -> list[tuple[str, dict[str, Any]]]:
    calls: list[tuple[str, dict[str, Any]]] = []
    for n in range(steps):
        run_id, action_id = runs[(n // 2) % len(runs)]
        calls.append(("get_run", {"run_id": run_id}) if n % 2 == 0
                     else ("get_action_log", {"run_id": run_id, "action": action_id, "tail": 20}))
    return calls


def responses(calls: list[tuple[str, dict[str, Any]]]) -> list[ModelResponse]:
    return [*(ModelResponse(parts=[ToolCallPart(name, args)]) for name, args in calls),
            ModelResponse(parts=[ToolCallPart("final_result", {"summary": "Done.", "actionIds": [1]})])]


def function_model(calls: list[tuple[str, dict[str, Any]]]) -> FunctionModel:
    prepared = responses(calls)

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return prepared[len(messages) // 2 % len(prepared)]

    return FunctionModel(respond, model_name="function")


async def direct(app: App, calls: list[tuple[str, dict[str, Any]]]) -> None:
    for name, arguments in calls:
        await app.gate.call_tool(ACTOR, name, arguments, source=feature_source("bench"),
                                 allowed=("get_run", "get_action_log"))


async def loop(app: App, model: Model, steps: int) -> None:
    result = await run_feature(feature(steps), "Run failed. Why?", ACTOR, gate=app.gate, model=model,
                               scrub=app.secrets)
    assert result.steps == steps + 1 and all(c.outcome == "ran" for c in result.calls), result.calls


async def measure(app: App, steps: int, repeats: int) -> dict[str, Any]:
    rows = await app.db.fetch_all(
        "SELECT r.id, a.id AS action FROM runs r JOIN actions a ON a.run_id = r.id AND a.status = 'failed'"
        " WHERE r.status = 'failed' ORDER BY r.id LIMIT 20")
    calls = script([(row["id"], row["action"]) for row in rows], steps)
    samples: dict[str, list[float]] = {"direct": [], "replay": [], "function": []}
    cpu: dict[str, list[float]] = {"direct": [], "replay": [], "function": []}
    # Models are made before the clock starts: preparing a script is not the loop's work.
    models = {"replay": Replay(responses(calls)), "function": function_model(calls)}
    for _ in range(3):  # warm caches, imports, statement caches
        await direct(app, calls)
        for model in models.values():
            await loop(app, model, steps)
    for _ in range(repeats):
        for kind in ("direct", "replay", "function"):
            started, started_cpu = time.perf_counter(), time.process_time()
            if kind == "direct":
                await direct(app, calls)
            else:
                await loop(app, models[kind], steps)
            samples[kind].append((time.perf_counter() - started) * 1000)
            cpu[kind].append((time.process_time() - started_cpu) * 1000)
        await app.audit.flush()  # outside the timed part, as the audit log's own task would
    medians = {kind: statistics.median(values) for kind, values in samples.items()}
    # Each repeat runs the three back to back: the ratio within a repeat is immune to slow drifts of a
    # shared machine's load, so its median is the figure to read.
    paired = statistics.median(loop / base for loop, base in zip(cpu["replay"], cpu["direct"], strict=True))
    cpu_medians = {kind: statistics.median(values) for kind, values in cpu.items()}
    return {
        "cpu_direct_ms": round(cpu_medians["direct"], 3),
        "cpu_loop_replay_ms": round(cpu_medians["replay"], 3),
        "cpu_ratio_replay": round(cpu_medians["replay"] / cpu_medians["direct"], 3),
        "cpu_ratio_function": round(cpu_medians["function"] / cpu_medians["direct"], 3),
        "paired_cpu_ratio_replay": round(paired, 3),
        "steps": steps,
        "direct_ms": round(medians["direct"], 3),
        "loop_replay_ms": round(medians["replay"], 3),
        "loop_function_ms": round(medians["function"], 3),
        "direct_per_step_ms": round(medians["direct"] / steps, 3),
        "loop_replay_per_step_ms": round(medians["replay"] / steps, 3),
        "overhead_per_step_ms": round((medians["replay"] - medians["direct"]) / steps, 3),
        "ratio_replay": round(medians["replay"] / medians["direct"], 3),
        "ratio_function": round(medians["function"] / medians["direct"], 3),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=41)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{folder}/bench.db"
        db = await open_store(url)
        await fill_demo_data(db)
        await db.close()
        env = {"KNECHT_DATABASE_URL": url, "KNECHT_DATA_DIR": folder, "KNECHT_CONFIG_DIR": str(REPO),
               "KNECHT_JWT_SECRET": "bench-" + "x" * 40}
        async with open_app(load_settings(env=env), watch_policy=False) as app:
            print(f"[bench] {args.steps} steps, {args.repeats} repeats", file=sys.stderr)
            row = await measure(app, args.steps, args.repeats)
    if args.json:
        print(json.dumps(row, indent=2))
        return
    print(f"steps per run            {row['steps']}")
    print(f"direct through the gate  {row['direct_ms']:8.3f} ms   {row['direct_per_step_ms']:.3f} ms/step")
    print(f"loop, replayed model     {row['loop_replay_ms']:8.3f} ms   {row['loop_replay_per_step_ms']:.3f} ms/step"
          f"   ratio {row['ratio_replay']:.3f}   overhead {row['overhead_per_step_ms']:.3f} ms/step")
    print(f"loop, FunctionModel      {row['loop_function_ms']:8.3f} ms"
          f"                     ratio {row['ratio_function']:.3f}")
    print(f"CPU time (all threads)   direct {row['cpu_direct_ms']:.3f} ms, loop {row['cpu_loop_replay_ms']:.3f} ms:"
          f" ratio {row['cpu_ratio_replay']:.3f} (FunctionModel {row['cpu_ratio_function']:.3f})")
    print(f"median of paired CPU ratios (loop/direct, replayed model): {row['paired_cpu_ratio_replay']:.3f}"
          "   target ≤ 1.2")


if __name__ == "__main__":
    anyio.run(main)

"""Benchmark: what a chat turn costs beside the model, and how soon a decision reaches the conversation.

    python scripts/bench_chat.py [--rounds 5] [--repeats 41] [--decisions 50] [--db URL] [--json]

**Turn overhead** (model time excluded: the model is a replay of prepared responses, `Replay` of
bench_ai_loop.py). A turn of `--rounds` rounds makes one tool call per round (get_run, then
get_action_log of the failed action with tail 20, alternating, on the demo data's failed runs) and
then answers in text.

    direct   the same tool calls, same arguments, same source (`chat`) and flags, straight through
             `Gate.call_tool`
    turn     `run_turn(...)`: the turn's loop over the same gate (tool definitions for every tool the
             caller may see, the messages, the model request wrapper, the gate calls, scrubbing)
    send     `ChatService.send(...)`: the whole turn as the endpoint runs it — the ownership check, the
             history (a conversation that grows by one exchange per repeat), the turn, and storing it

Printed: medians (wall and the process's CPU time) over `--repeats`, turn/direct and send/direct as
the median of paired CPU ratios, and the overhead in ms per turn.

**Follow-up latency**: `--decisions` proposals are staged through the chat (a scripted model), the
server's follow-up worker runs as in `mcp-knecht serve` (woken by the store's change feed), and a
second app on the same store — another replica — approves them one by one, a moment apart. The
latency of each is from its execution's end (`finished_at`) to the follow-up's commit (`done_at`),
both stamped by the store's clock: the worker's wake-up, claim, the follow-up turn (instant model)
and the commit. `--db postgresql://…` runs on an empty PostgreSQL database (or schema, with
`?search_path=`) instead of a temporary SQLite file.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_ai_loop import Replay, script  # noqa: E402
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, UserPromptPart  # noqa: E402
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402

from mcp_knecht.ai.models import ModelResolver  # noqa: E402
from mcp_knecht.ai.settings import AiSettings, ModelSpec  # noqa: E402
from mcp_knecht.app import App, open_app  # noqa: E402
from mcp_knecht.chat import ChatService  # noqa: E402
from mcp_knecht.chat.store import Message  # noqa: E402
from mcp_knecht.chat.texts import FOLLOW_UP_PREFIX  # noqa: E402
from mcp_knecht.chat.turn import run_turn  # noqa: E402
from mcp_knecht.core import clock  # noqa: E402
from mcp_knecht.core.actor import Actor  # noqa: E402
from mcp_knecht.core.approval import Operator  # noqa: E402
from mcp_knecht.core.settings import load_settings  # noqa: E402
from mcp_knecht.core.tools import CHAT  # noqa: E402
from mcp_knecht.knecht import open_store  # noqa: E402
from mcp_knecht.knecht.demo import fill_demo_data  # noqa: E402

SETTINGS = AiSettings(default=ModelSpec("anthropic", "replay", "benchmark"))
READER = Actor("bench", "bench", frozenset({"projects:read", "runs:read", "logs:read", "workflows:read", "ai:chat"}))
PROPOSER = Actor("alice", "bench", READER.scopes | {"runs:write", "proposals:read"})


def chat_for(app: App, model: Any) -> ChatService:
    return ChatService(db=app.db, gate=app.gate, audit=app.audit, proposals=app.proposals, changes=app.changes,
                       models=ModelResolver(SETTINGS, fixed=model), keys=app.keys, scrub=app.secrets)


def _cpu_ms(started: float) -> float:
    return (time.process_time() - started) * 1000


async def turn_overhead(app: App, rounds: int, repeats: int) -> dict[str, Any]:
    rows = await app.db.fetch_all(
        "SELECT r.id, a.id AS action FROM runs r JOIN actions a ON a.run_id = r.id AND a.status = 'failed'"
        " WHERE r.status = 'failed' ORDER BY r.id LIMIT 20")
    calls = script([(row["id"], row["action"]) for row in rows], rounds)
    responses = [*(ModelResponse(parts=[ToolCallPart(name, args)]) for name, args in calls),
                 ModelResponse(parts=[TextPart("Run 66 failed on its workflow's YAML.")])]
    turn_model, send_model = Replay(list(responses)), Replay(list(responses))
    chat = chat_for(app, send_model)
    resolved = chat.model()
    history = [Message("user", "Why did it fail?"), Message("assistant", "Looking.")] * 5

    async def direct() -> None:
        for name, arguments in calls:
            result = await app.gate.call_tool(READER, name, arguments, source=CHAT, stage_writes=True)
            assert result.outcome == "ran", result.text

    async def turn() -> None:
        outcome = await run_turn(history, "And now?", READER, gate=app.gate, audit=app.audit, model=turn_model,
                                 model_name="replay", settings=resolved.settings, timeout=resolved.timeout,
                                 scrub=app.secrets)
        assert outcome.rounds == rounds and outcome.reply, outcome

    conversation = (await chat.send(READER, "Why did run 66 fail?")).conversation_id

    async def send() -> None:
        reply = await chat.send(READER, "And now?", conversation)
        assert reply.action is None and reply.reply

    kinds = {"direct": direct, "turn": turn, "send": send}
    wall: dict[str, list[float]] = {kind: [] for kind in kinds}
    cpu: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(3):  # warm caches, imports, statement caches
        for run in kinds.values():
            await run()
    for _ in range(repeats):
        for kind, run in kinds.items():
            started, started_cpu = time.perf_counter(), time.process_time()
            await run()
            wall[kind].append((time.perf_counter() - started) * 1000)
            cpu[kind].append(_cpu_ms(started_cpu))
        await app.audit.flush()  # outside the timed part, as the audit log's own task would
    med = {kind: statistics.median(values) for kind, values in wall.items()}
    cpu_med = {kind: statistics.median(values) for kind, values in cpu.items()}

    def paired(kind: str) -> float:
        return statistics.median(a / b for a, b in zip(cpu[kind], cpu["direct"], strict=True))

    return {
        "rounds": rounds, "repeats": repeats,
        "direct_ms": round(med["direct"], 3), "turn_ms": round(med["turn"], 3), "send_ms": round(med["send"], 3),
        "cpu_direct_ms": round(cpu_med["direct"], 3), "cpu_turn_ms": round(cpu_med["turn"], 3),
        "cpu_send_ms": round(cpu_med["send"], 3),
        "paired_cpu_ratio_turn": round(paired("turn"), 3), "paired_cpu_ratio_send": round(paired("send"), 3),
        "turn_overhead_ms": round(med["turn"] - med["direct"], 3),
        "send_overhead_ms": round(med["send"] - med["direct"], 3),
        "turn_overhead_cpu_ms": round(cpu_med["turn"] - cpu_med["direct"], 3),
        "send_overhead_cpu_ms": round(cpu_med["send"] - cpu_med["direct"], 3),
    }


def _assistant(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Reruns the run named in the message; notes a follow-up."""
    last = messages[-1]
    prompt = next(str(p.content) for p in reversed(last.parts) if isinstance(p, UserPromptPart))
    if prompt.startswith(FOLLOW_UP_PREFIX):
        return ModelResponse(parts=[TextPart("Noted.")])
    return ModelResponse(parts=[ToolCallPart("rerun_run", {"run_id": int(prompt.split()[-1])})])


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


async def follow_up_latency(env: dict[str, str], decisions: int) -> dict[str, Any]:
    async with open_app(load_settings(env=env), watch_policy=False) as server, \
            open_app(load_settings(env=env), watch_policy=False) as replica:
        chat = chat_for(server, FunctionModel(_assistant))
        runs = await server.db.fetch_all(
            "SELECT id FROM runs WHERE status IN ('succeeded', 'failed') ORDER BY id LIMIT ?", (decisions,))
        proposals = []
        for row in runs:
            reply = await chat.send(PROPOSER, f"Re-run run {row['id']}")
            assert reply.proposal_id is not None, reply
            proposals.append(reply.proposal_id)
        latencies: list[float] = []
        bob = Operator("bob", verified=True)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(chat.followups.run)  # as `mcp-knecht serve` runs it
            await anyio.sleep(0.5)
            for proposal_id in proposals:
                decided = await replica.approvals.approve(proposal_id, bob)
                assert decided.status == "succeeded" and decided.finished_at, decided
                with anyio.fail_after(30):
                    while (row := await replica.db.fetch_one(
                            "SELECT done_at FROM chat_followups WHERE proposal_id = ?", (proposal_id,))
                           )["done_at"] is None:  # type: ignore[index]
                        await anyio.sleep(0.002)
                latencies.append((clock.parse(row["done_at"]) - clock.parse(decided.finished_at)).total_seconds()
                                 * 1000)
                await anyio.sleep(random.uniform(0.2, 0.4))  # independent decisions, a moment apart
            tasks.cancel_scope.cancel()
    return {"decisions": decisions, "store": server.db.dialect,
            "median_ms": round(statistics.median(latencies), 1), "p95_ms": round(_percentile(latencies, 0.95), 1),
            "min_ms": round(min(latencies), 1), "max_ms": round(max(latencies), 1)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=41)
    parser.add_argument("--decisions", type=int, default=50)
    parser.add_argument("--db", help="an empty PostgreSQL database (default: a temporary SQLite file)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        url = args.db or f"sqlite:///{folder}/bench.db"
        db = await open_store(url)
        await fill_demo_data(db, runs=max(600, args.decisions * 2))
        await db.close()
        env = {"KNECHT_DATABASE_URL": url, "KNECHT_DATA_DIR": folder, "KNECHT_CONFIG_DIR": str(REPO),
               "KNECHT_JWT_SECRET": "bench-" + "x" * 40}
        print(f"[bench] turns of {args.rounds} rounds, {args.repeats} repeats", file=sys.stderr)
        async with open_app(load_settings(env=env), watch_policy=False) as app:
            overhead = await turn_overhead(app, args.rounds, args.repeats)
        print(f"[bench] follow-up latency over {args.decisions} decisions", file=sys.stderr)
        latency = await follow_up_latency(env, args.decisions)
    if args.json:
        print(json.dumps({"turn": overhead, "follow_up": latency}, indent=2))
        return
    o = overhead
    print(f"turn of {o['rounds']} rounds (1 tool call each, then a text answer), model time excluded:")
    print(f"  direct through the gate  {o['direct_ms']:8.3f} ms   CPU {o['cpu_direct_ms']:.3f} ms")
    print(f"  run_turn (the loop)      {o['turn_ms']:8.3f} ms   CPU {o['cpu_turn_ms']:.3f} ms"
          f"   overhead {o['turn_overhead_ms']:.3f} ms   paired CPU ratio {o['paired_cpu_ratio_turn']:.3f}")
    print(f"  ChatService.send (+store){o['send_ms']:8.3f} ms   CPU {o['cpu_send_ms']:.3f} ms"
          f"   overhead {o['send_overhead_ms']:.3f} ms   paired CPU ratio {o['paired_cpu_ratio_send']:.3f}")
    f = latency
    print(f"follow-up delivery after a decision ({f['store']}, {f['decisions']} decisions): median "
          f"{f['median_ms']:.1f} ms, p95 {f['p95_ms']:.1f} ms (min {f['min_ms']:.1f}, max {f['max_ms']:.1f})")


if __name__ == "__main__":
    anyio.run(main)

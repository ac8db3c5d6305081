"""One racing approver: `python -m tests.approver_worker NAME FIRST_ID LAST_ID [SEED]`.

Opens the app from the environment (KNECHT_DATABASE_URL, KNECHT_TOOLSETS, …) as knecht-approve does
(its event loop, a blocking store, its start-up heap) and tries to approve every id in the range — in
order, or shuffled by SEED; prints one JSON line: how many it won (its approval claimed and executed the
proposal), recorded (its approval counted toward a quorum still short) and lost, its seconds and its CPU
seconds (and of those, the kernel's: system time) and its context switches.
"""

from __future__ import annotations

import json
import random
import resource
import sys
import time

import anyio

from mcp_knecht.cli.event_loop import FAST_LOOP
from mcp_knecht.cli.startup_heap import collect_later, serving


def _cpu_seconds() -> tuple[float, float, int]:
    """(user + system, system) CPU seconds of this process so far, and its context switches."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, usage.ru_stime, usage.ru_nvcsw + usage.ru_nivcsw


async def race(name: str, first: int, last: int, seed: int | None = None) -> dict[str, float]:
    from mcp_knecht.app import open_app  # imported here, as knecht-approve does: after `collect_later`
    from mcp_knecht.core.approval import Operator
    from mcp_knecht.core.settings import load_settings
    from mcp_knecht.errors import NotPendingError

    won = recorded = lost = 0
    ids = list(range(first, last + 1))
    if seed is not None:
        random.Random(seed).shuffle(ids)
    async with open_app(load_settings(), watch_policy=False, blocking_store=True) as app:
        serving()
        service = app.approvals
        started, (cpu, system, switches) = time.perf_counter(), _cpu_seconds()
        for proposal_id in ids:
            try:
                decided = await service.approve(proposal_id, Operator(name))
            except NotPendingError:
                lost += 1
            else:
                if decided.status == "pending":
                    recorded += 1
                else:
                    won += 1
        elapsed, (cpu_now, system_now, switches_now) = time.perf_counter() - started, _cpu_seconds()
    return {"operator": name, "won": won, "recorded": recorded, "lost": lost,  # type: ignore[dict-item]
            "seconds": elapsed, "cpu_seconds": cpu_now - cpu, "system_seconds": system_now - system,
            "context_switches": switches_now - switches}


if __name__ == "__main__":
    collect_later()
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else None
    result = anyio.run(race, sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), seed, backend_options=FAST_LOOP)
    print(json.dumps(result))

"""One racing approver: `python -m tests.approver_worker NAME FIRST_ID LAST_ID`.

Opens the app from the environment (KNECHT_DATABASE_URL, KNECHT_TOOLSETS, …) and tries to
approve every id in the range; prints one JSON line: how many it won (its approval claimed and
executed the proposal), recorded (its approval counted toward a quorum still short) and lost.
"""

from __future__ import annotations

import json
import sys
import time

import anyio

from mcp_knecht.app import open_app
from mcp_knecht.core.approval import Operator
from mcp_knecht.core.settings import load_settings
from mcp_knecht.errors import NotPendingError


async def race(name: str, first: int, last: int) -> dict[str, float]:
    won = recorded = lost = 0
    async with open_app(load_settings(), watch_policy=False) as app:
        service = app.approvals
        started = time.perf_counter()
        for proposal_id in range(first, last + 1):
            try:
                decided = await service.approve(proposal_id, Operator(name))
            except NotPendingError:
                lost += 1
            else:
                if decided.status == "pending":
                    recorded += 1
                else:
                    won += 1
        elapsed = time.perf_counter() - started
    return {"operator": name, "won": won, "recorded": recorded, "lost": lost,  # type: ignore[dict-item]
            "seconds": elapsed}


if __name__ == "__main__":
    result = anyio.run(race, sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
    print(json.dumps(result))

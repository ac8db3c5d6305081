"""What every part of the demo data shares: the run window, the failure kinds, the people, and
the small helpers that turn the one random generator into timestamps, commit SHAs and tokens."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from mcp_knecht.core.clock import timestamp

BATCH_ROWS = 5_000
SPAN = timedelta(days=60)  # runs are spread over this window, whatever their count
SETTLE = timedelta(hours=1)
"""The run window ends this long before now, so that every finished run has finished by now (the
longest run takes about 40 minutes); only the queued runs come later, in the last minutes."""


def window_start(now: datetime) -> datetime:
    """Where the runs begin: the window of `SPAN` ending `SETTLE` before `now` (to the minute, so a
    seed and a clock reading give the same data)."""
    return now.astimezone(UTC).replace(second=0, microsecond=0) - SETTLE - SPAN

FAILURE_KINDS: tuple[str, ...] = (
    "test_assertion",
    "dependency_install",
    "timeout",
    "out_of_memory",
    "flaky_network",
    "bad_workflow_syntax",
)
# Where each kind of failure surfaces: the action that fails.
FAILING_ACTION = {
    "test_assertion": "test",
    "dependency_install": "install",
    "timeout": "test",
    "out_of_memory": "test",
    "flaky_network": "install",
    "bad_workflow_syntax": "parse-workflow",
}
FAILURE_WEIGHTS = (30, 18, 12, 12, 18, 10)

USERS = ("anna.schmidt", "jonas.weber", "mei.chen", "lukas.bauer", "sara.okafor", "tom.nguyen")
SCHEDULER = "knecht-scheduler"


def _iso(moment: datetime) -> str:
    return timestamp(moment)


def _sha(rng: random.Random) -> str:
    return f"{rng.getrandbits(160):040x}"


def _token(rng: random.Random, alphabet: str, length: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(length))

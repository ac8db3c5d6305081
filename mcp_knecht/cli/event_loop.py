"""Which event loop a command runs on.

The HTTP server and `knecht-approve` run on uvloop where it exists (not on Windows). The server:
with httptools parsing, 15-25 % more calls/s than asyncio's loop and h11 (`scripts/bench_http.py`).
`knecht-approve`: a decision is a few dozen statements, each a round trip to PostgreSQL, and
uvloop's sockets cost a third less CPU a round trip (8 racing approvers on PostgreSQL: 64 → 85
decisions/s, 20 → 13 ms CPU each; on SQLite 10-15 % more decisions/s), for no measurable start-up
time. The stdio server and the other CLIs keep asyncio's loop.
"""

from __future__ import annotations

import importlib.util

FAST_LOOP = {"use_uvloop": importlib.util.find_spec("uvloop") is not None}
"""`backend_options` for `anyio.run`."""

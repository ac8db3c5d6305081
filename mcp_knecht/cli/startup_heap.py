"""A process's start-up heap: what start-up makes lives as long as the process, so the garbage
collector neither runs while it is made nor walks it again. Used by `mcp-knecht serve` and
`knecht-approve` (whose start-up is most of what one decision costs).

Start-up (the MCP SDK's ~550 pydantic models, our toolsets, the app) leaves ~90,000 objects that live
until the process ends. Collected as usual, they cost a stdio server ~50 ms of collections before its
first answer, and afterwards every full collection walks all of them again: ~50 ms with the event
loop stopped, in the middle of serving, which is the p99 latency of `scripts/bench_http.py` at 16
clients. So a server collects nothing until it is ready to serve, then moves everything start-up left
to the permanent generation (`gc.freeze`), where no collection looks, and collects as usual from then
on: what serving allocates (requests, sessions) is collected as before.

The price is the start-up's own cyclic garbage, frozen with the rest and never freed: about 2,000
objects (measured at a stdio server's exit: 2,140 found once unfrozen, against 1,230-1,450 left since
the last collection without this); the peak RSS stays 76 MB.
"""

from __future__ import annotations

import gc


def collect_later() -> None:
    """No garbage collection until `serving()`: call it first thing in a process's start-up."""
    gc.disable()


def serving() -> None:
    """Start-up is over: freeze what it left, and collect as usual what comes after."""
    gc.freeze()
    gc.enable()

"""A server collects no garbage while it starts, and no collection walks what start-up left: the MCP
SDK's models, the toolsets and the app live as long as the process (`mcp_knecht.cli.startup_heap`).
Observed from outside, in the real processes: the stdio server's interpreter at exit, and the HTTP
server's own garbage-collector series at /metrics."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.conftest import server_env
from tests.servers import http_server
from tests.test_monitoring import METRICS_TOKEN, _parse, _scrape, _value

pytestmark = pytest.mark.anyio

START_UP_OBJECTS = 50_000
"""Fewer than the objects a start-up leaves (the SDK alone: 550 pydantic models, about 80,000)."""

# `mcp-knecht serve` as its console script runs it, reporting the collector's state when it exits.
_SERVE_AND_REPORT = """
import atexit, gc, json, runpy, sys
atexit.register(lambda: print(json.dumps({
    "collections": [generation["collections"] for generation in gc.get_stats()],
    "frozen": gc.get_freeze_count(), "enabled": gc.isenabled()}), file=sys.stderr))
sys.argv = ["mcp-knecht", "serve"]
runpy.run_module("mcp_knecht.cli.main", run_name="__main__")
"""

_TOOLS_LIST = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "pytest", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {}}}})


def test_a_stdio_server_collects_nothing_while_it_starts_and_freezes_what_start_up_left(
    demo_env: dict[str, str], mint: Callable[..., str]
) -> None:
    env = server_env({**demo_env, "KNECHT_TOKEN": mint()})
    done = subprocess.run([sys.executable, "-c", _SERVE_AND_REPORT], env=env, input=_TOOLS_LIST + "\n",
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"tools"' in done.stdout  # it served
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["collections"][2] == 0  # start-up ran with the collector off: no full walk of ~100,000 objects
    assert report["frozen"] > START_UP_OBJECTS and report["enabled"]  # and serving collects as usual


def test_an_http_server_made_no_full_collection_by_its_first_scrape(demo_env: dict[str, str]) -> None:
    with http_server({**demo_env, "KNECHT_METRICS_TOKEN": METRICS_TOKEN}) as url:
        status, text = _scrape(url)
    assert status == 200
    samples = _parse(text)
    assert _value(samples, "python_gc_collections_total", generation="2") == 0

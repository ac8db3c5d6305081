"""Browser tests' pieces: Debian's Chromium driven by Playwright, servers, and looking at pages.

Chromium is the machine's own (`apt-get install chromium`, launched by path): the project never
downloads a browser. Without it (or without the `playwright` package) the browser tests skip with
the reason; with `CI=true` they fail instead, since CI installs it (`.ci/run`).
"""

from __future__ import annotations

import functools
import os
import shutil
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]
T = TypeVar("T")


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} — in CI the browser tests must run (.ci/run installs Chromium)", pytrace=False)
    pytest.skip(reason)


def chromium_path() -> str:
    """Debian's Chromium, or a skip (a failure under CI=true) that says how to get it."""
    found = str(CHROMIUM) if CHROMIUM.exists() else shutil.which("chromium")
    if not found or not os.access(found, os.X_OK):
        _unavailable("The browser tests need Debian's Chromium at /usr/bin/chromium: apt-get install -y chromium")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _unavailable("The browser tests need the playwright package: pip install -e '.[test]'")
    return str(found)


def run_async(function: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Run a coroutine function to its end on a thread of its own (Playwright's sync API owns this one)."""
    results: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            results.append(anyio.run(function, *args))
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return results[0]


def wait_until_up(base: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(base + "/login", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{base} did not come up")
        time.sleep(0.1)


@contextmanager
def in_process_server(env: dict[str, str], *, diagnosis: Any = None, ai_model: Any = None,
                      extra_routes: Callable[[Any], list[Any]] | None = None) -> Iterator[str]:
    """The pages and the decision API served by uvicorn on a thread of this process, so that a test
    can script what the parts built elsewhere answer (the diagnosis, the chat endpoint). With
    `ai_model` (a pydantic-ai model such as a `FunctionModel`) the server's own AI features run on it,
    in the background as in the server, and the pages show their real diagnoses."""
    import uvicorn
    from starlette.applications import Starlette

    from mcp_knecht.app import open_app
    from mcp_knecht.core.auth import TokenVerifier, load_token_settings
    from mcp_knecht.core.settings import load_settings
    from mcp_knecht.transports.decisions_api import DecisionApi
    from mcp_knecht.web import web_routes
    from tests.servers import free_port

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    servers: list[uvicorn.Server] = []
    errors: list[BaseException] = []

    async def serve() -> None:
        settings = load_settings(env=env)
        verifier = TokenVerifier(load_token_settings(settings, create_dev_secret=False))
        async with open_app(settings, watch_policy=False) as app, anyio.create_task_group() as tasks:
            if ai_model is not None:
                from mcp_knecht.ai.models import ModelResolver

                app.ai.models = ModelResolver(app.ai.settings, fixed=ai_model)
                tasks.start_soon(functools.partial(app.ai.run, auto_diagnose=False))
            routes = [*DecisionApi(app, verifier).routes(), *(extra_routes(app) if extra_routes else []),
                      *web_routes(app, verifier, public_url=base, diagnosis=diagnosis)]
            config = uvicorn.Config(Starlette(routes=routes), host="127.0.0.1", port=port, log_level="warning",
                                    lifespan="off", timeout_graceful_shutdown=1)
            server = uvicorn.Server(config)
            servers.append(server)
            await server.serve()
            tasks.cancel_scope.cancel()

    def target() -> None:
        try:
            anyio.run(serve)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        wait_until_up(base)
        yield base
    finally:
        if servers:
            servers[0].should_exit = True
        thread.join(15)
        if errors:
            raise errors[0]


class Shots:
    """Screenshots of each page, under the test run's output directory, to look at."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def take(self, page: Any, name: str) -> Path:
        path = self.folder / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path


UNLABELLED_CONTROLS = """() => {
  const named = (el) => {
    if (el.getAttribute('aria-label') || el.getAttribute('aria-labelledby')) return true;
    if (el.labels && el.labels.length) return true;
    if (el.tagName === 'BUTTON' || el.tagName === 'SUMMARY' || el.tagName === 'A') return el.textContent.trim() !== '';
    return false;
  };
  const controls = document.querySelectorAll(
    'input:not([type=hidden]), select, textarea, button, summary, a[href]');
  return Array.from(controls).filter((el) => !named(el)).map((el) => el.outerHTML.slice(0, 120));
}"""

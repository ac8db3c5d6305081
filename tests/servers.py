"""Real server subprocesses for end-to-end tests: `mcp-knecht serve --transport http`."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import server_env


def knecht_executable() -> str:
    beside_python = Path(sys.executable).parent / "mcp-knecht"
    return str(beside_python) if beside_python.exists() else (shutil.which("mcp-knecht") or "mcp-knecht")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def http_server(env: dict[str, str], *extra_args: str, timeout: float = 30.0) -> Iterator[str]:
    """Start a server on a free port; yield its base URL; always stop it."""
    with http_server_process(env, *extra_args, timeout=timeout) as (base, _):
        yield base


@contextmanager
def http_server_process(env: dict[str, str], *extra_args: str,
                        timeout: float = 30.0) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`http_server`, yielding the process too (to signal it)."""
    port = free_port()
    errors = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in the finally below
    process = subprocess.Popen(
        [knecht_executable(), "serve", "--transport", "http", "--host", "127.0.0.1", "--port", str(port),
         *extra_args],
        env=server_env(env),
        stdout=subprocess.DEVNULL,
        stderr=errors,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                errors.seek(0)
                raise RuntimeError(f"server exited with {process.returncode}: {errors.read()}")
            try:
                with urllib.request.urlopen(base + "/healthz", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("server did not become ready in time")
            time.sleep(0.1)
        yield base, process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        errors.close()

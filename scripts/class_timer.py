"""Run a Python program and report how long it spent *creating classes*: dataclasses and pydantic models.

    python scripts/class_timer.py OUT.json -m mcp_knecht.cli.main serve   # a module, like python -m
    python scripts/class_timer.py OUT.json scripts/bare_server.py          # a script

`scripts/bench_gate.py --classes` spawns both stdio servers through it: a cold start is mostly
imports, and what an import costs is mostly the classes it creates (`dataclasses` generates and
compiles each class's methods at import; pydantic builds a validator and serializer per model).
The program runs as itself (same argv, stdin, stdout); when it exits, OUT.json gets, per kind and
per owner ("ours" = mcp_knecht, "others"), how many classes were created and the milliseconds
spent (a model created while another is being built counts as the outer one's), and how long the
process ran. Our own value objects are msgspec Structs, created in C and not timed here: since
2026-12-06 "dataclass ours" is 0 (it was 24 to 101 ms of a start).
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import runpy
import sys
import time
from collections.abc import Callable
from typing import Any

OURS = "mcp_knecht"
_started = time.perf_counter()
_spent: dict[str, dict[str, list[float]]] = {"dataclass": {}, "pydantic": {}}
_depth = [0]  # pydantic models being created right now, outermost first


def _charge(kind: str, module: str, seconds: float) -> None:
    owner = "ours" if module == OURS or module.startswith(OURS + ".") else "others"
    count_and_ms = _spent[kind].setdefault(owner, [0, 0.0])
    count_and_ms[0] += 1
    count_and_ms[1] += seconds * 1000


def _timed_dataclasses() -> None:
    create: Callable[..., Any] = dataclasses._process_class  # type: ignore[attr-defined]

    def process_class(cls: type, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return create(cls, *args, **kwargs)
        finally:
            _charge("dataclass", cls.__module__, time.perf_counter() - started)

    dataclasses._process_class = process_class  # type: ignore[attr-defined]


def _timed_pydantic() -> None:
    from pydantic._internal._model_construction import ModelMetaclass

    create = ModelMetaclass.__new__

    def new(mcs: type, name: str, bases: tuple[type, ...], namespace: dict[str, Any], *args: Any,
            **kwargs: Any) -> Any:
        started = time.perf_counter()
        depth = _depth[0]
        _depth[0] += 1
        try:
            return create(mcs, name, bases, namespace, *args, **kwargs)  # type: ignore[arg-type]
        finally:
            _depth[0] -= 1
            if depth == 0:  # a model created while building another is the outer one's cost
                _charge("pydantic", str(namespace.get("__module__", "")), time.perf_counter() - started)

    ModelMetaclass.__new__ = new  # type: ignore[assignment]


def _report(path: str) -> None:
    report = {kind: {owner: {"classes": int(c), "ms": round(ms, 1)} for owner, (c, ms) in owners.items()}
              for kind, owners in _spent.items()}
    report["process_ms"] = round((time.perf_counter() - _started) * 1000, 1)  # type: ignore[assignment]
    with open(path, "w", encoding="utf-8") as out:
        json.dump(report, out)


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    out, target = sys.argv[1], sys.argv[2:]
    _timed_dataclasses()
    import pydantic  # noqa: F401  # imported by both servers anyway; its metaclass must be wrapped first

    _timed_pydantic()
    atexit.register(_report, out)
    if target[0] == "-m":
        sys.argv = [target[1], *target[2:]]
        runpy.run_module(target[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = target
        runpy.run_path(target[0], run_name="__main__")


if __name__ == "__main__":
    main()

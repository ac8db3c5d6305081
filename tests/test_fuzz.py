"""Issue 11, item 11: a fuzzer. Arguments drawn from the schemas `tools/list` publishes — valid
ones, and the same with hostile values swapped in (lone surrogates, NUL, huge numbers, deep
nesting, long strings, injection strings, wrong types, unknown fields) — go to every tool over
the real SDK client. After each call: no internal error, exactly one audit row, nothing staged
and nothing changed for a refused call, and the server still answers.

The examples are bounded (`MAX_EXAMPLES`) to keep the suite's time modest; raise it locally with
`FUZZ_EXAMPLES=2000 pytest tests/test_fuzz.py`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client

from mcp_knecht import testing
from mcp_knecht.app import App, open_app
from mcp_knecht.core.settings import load_settings
from tests.conftest import REPO
from tests.knecht_harness import AGENT

pytestmark = pytest.mark.slow

MAX_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "120"))
REFUSED = ("invalid", "forbidden", "denied")
_TABLES = ("proposals", "runs", "project_variables", "workflow_versions")

HOSTILE: list[Any] = [
    "\ud800", "a\udfffb", "\x00", "grep\x00me", 2**70, -(2**70), 2**63, float("1e308"), -0.0,
    "x" * 150_000, "'; DROP TABLE runs; --", "%", "_%_", "\\", "../../../etc/passwd", "{{7*7}}",
    "<script>alert(1)</script>", "\u202eevil", "\x1b[2J", " ", "", [], {}, None, True, [[[[[[]]]]]],
    {"$ref": "#/x"}, "AKIAIOSFODNN7EXAMPLE", "password=hunter22", "*", "***",
]


def _nested(depth: int) -> Any:
    value: Any = "deep"
    for _ in range(depth):
        value = {"a": value}
    return value


HOSTILE += [_nested(40), _nested(200), [0] * 5_000]


def _hostile() -> st.SearchStrategy[Any]:
    listed = st.sampled_from(HOSTILE)
    return st.one_of(listed, listed, listed, st.text(max_size=30), st.integers(), st.floats(allow_nan=False))


def from_schema(schema: dict[str, Any], defs: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values that follow a (pydantic-generated) JSON schema, a useful subset of it."""
    if "$ref" in schema:
        return from_schema(defs[schema["$ref"].rsplit("/", 1)[1]], defs)
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return st.one_of([from_schema(option, defs) for option in schema[key]])
    kind = schema.get("type")
    if kind == "string":
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True)
        return st.text(min_size=schema.get("minLength", 0), max_size=min(schema.get("maxLength", 40), 40))
    if kind == "integer":
        low, high = schema.get("minimum", -(2**63)), schema.get("maximum", 2**63 - 1)
        return st.one_of(st.integers(low, min(high, low + 1_000)), st.integers(low, high))
    if kind == "number":
        return st.floats(schema.get("minimum"), schema.get("maximum"), allow_nan=False, allow_infinity=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {}), defs), max_size=4)
    if kind == "object":
        properties = schema.get("properties", {})
        if not properties:
            values = schema.get("additionalProperties")
            inner = from_schema(values, defs) if isinstance(values, dict) else _hostile()
            return st.dictionaries(st.text(max_size=12), inner, max_size=3)
        required = set(schema.get("required", ()))
        return st.fixed_dictionaries(
            {name: from_schema(sub, defs) for name, sub in properties.items() if name in required},
            optional={name: from_schema(sub, defs) for name, sub in properties.items() if name not in required},
        )
    return _hostile()


@st.composite
def hostile_variant(draw: st.DrawFn, valid: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    arguments = dict(draw(valid))
    how = draw(st.sampled_from(["replace", "add", "whole", "key"]))
    if how == "whole":  # (the SDK's client sends objects only; the gate's own tests cover the rest)
        return draw(st.dictionaries(st.sampled_from(["", "\ud800", "a" * 300, "0"]), _hostile(), max_size=2))
    if how == "key":
        arguments[draw(st.sampled_from(["\ud800", "a\x00", "x" * 5_000, "__proto__", "' OR 1=1 --"]))] = 1
    elif how == "add" or not arguments:
        arguments[draw(st.text(min_size=1, max_size=8))] = draw(_hostile())
    else:
        arguments[draw(st.sampled_from(sorted(arguments)))] = draw(_hostile())
    return arguments


def minimal(schema: dict[str, Any], defs: dict[str, Any]) -> Any:
    """A simple value of a schema (the first option, the smallest number, a short text)."""
    if "$ref" in schema:
        return minimal(defs[schema["$ref"].rsplit("/", 1)[1]], defs)
    if "const" in schema or "enum" in schema:
        return schema.get("const", (schema.get("enum") or [None])[0])
    if "anyOf" in schema:
        return minimal(schema["anyOf"][0], defs)
    kind = schema.get("type")
    if kind == "object":
        return {name: minimal(sub, defs) for name, sub in schema.get("properties", {}).items()
                if name in schema.get("required", ())}
    return {"string": "main", "integer": max(schema.get("minimum", 1), 1), "number": 1.0, "boolean": True,
            "array": [], "null": None}.get(str(kind), "x")


@dataclass
class Target:
    portal: BlockingPortal
    app: App
    client: Client
    schemas: dict[str, dict[str, Any]]

    def counts(self) -> dict[str, int]:
        async def count() -> dict[str, int]:
            await self.app.audit.flush()
            found = {t: (await self.app.db.fetch_one(f"SELECT COUNT(*) AS n FROM {t}"))["n"]  # type: ignore[index]
                     for t in (*_TABLES, "audit_log")}
            return found

        return self.portal.call(count)

    def last_outcome(self) -> str:
        async def outcome() -> str:
            row = await self.app.db.fetch_one("SELECT outcome FROM audit_log ORDER BY id DESC LIMIT 1")
            return str(row["outcome"]) if row else ""

        return self.portal.call(outcome)


@contextmanager
def _target(mode: str, tmp_path_factory: pytest.TempPathFactory, demo_db_template: Path) -> Iterator[Target]:
    folder = tmp_path_factory.mktemp("fuzz")
    (folder / "knecht.db").write_bytes(demo_db_template.read_bytes())
    env = {"KNECHT_DATA_DIR": str(folder / "data"), "KNECHT_DATABASE_URL": f"sqlite:///{folder / 'knecht.db'}",
           "KNECHT_CONFIG_DIR": str(REPO), "KNECHT_JWT_SECRET": "f" * 48}
    with start_blocking_portal() as portal, \
            portal.wrap_async_context_manager(open_app(load_settings(env=env))) as app, \
            portal.wrap_async_context_manager(
                testing.connect(app, testing.actor("fuzzer", AGENT), mode=mode)) as client:
        tools = portal.call(client.list_tools).tools
        yield Target(portal, app, client, {tool.name: dict(tool.input_schema) for tool in tools})


@pytest.fixture(scope="module", params=["auto", "legacy"], ids=["2026-07-28", "2025-11-25"])
def target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           demo_db_template: Path) -> Iterator[Target]:
    with _target(request.param, tmp_path_factory, demo_db_template) as made:
        yield made


@pytest.fixture(scope="module")
def modern_target(tmp_path_factory: pytest.TempPathFactory, demo_db_template: Path) -> Iterator[Target]:
    """The sweep runs on 2026-07-28 only, to keep the suite's time modest (the random half covers both)."""
    with _target("auto", tmp_path_factory, demo_db_template) as made:
        yield made


def _arguments(target: Target) -> st.SearchStrategy[tuple[str, Any]]:
    def for_tool(name: str) -> st.SearchStrategy[tuple[str, Any]]:
        schema = target.schemas[name]
        valid = from_schema(schema, schema.get("$defs", {}))
        if name == "get_proposal":  # never wait for a decision nobody makes
            valid = valid.map(lambda a: {**a, "wait_seconds": 0})
        return st.tuples(st.just(name), st.one_of(valid, hostile_variant(valid), hostile_variant(valid)))

    names = sorted(target.schemas)
    unknown = st.tuples(st.sampled_from(["no_such_tool", "", "x" * 300, "list_runs ", "LIST_RUNS"]),
                        st.dictionaries(st.text(max_size=5), _hostile(), max_size=2))
    return st.one_of(st.sampled_from(names).flatmap(for_tool), unknown)


def test_random_and_hostile_arguments_to_every_tool(target: Target) -> None:
    assert len(target.schemas) >= 15  # every Knecht tool and the follow-up tools

    @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
    @given(data=st.data())
    def one_call(data: st.DataObject) -> None:
        name, arguments = data.draw(_arguments(target))
        _check(target, name, arguments)

    one_call()
    still = target.portal.call(target.client.call_tool, "list_projects", {})
    assert not still.is_error and still.structured_content is not None


def _check(target: Target, name: str, arguments: dict[str, Any]) -> None:
    before = target.counts()
    result = target.portal.call(target.client.call_tool, name, arguments)
    text = " ".join(getattr(part, "text", "") for part in result.content)
    assert "Internal error" not in text, (name, sorted(arguments), text[:300])
    after = target.counts()
    assert after["audit_log"] == before["audit_log"] + 1, (name, "one audit row per call")
    if target.last_outcome() in REFUSED:
        assert result.is_error, (name, text)
        assert {t: after[t] for t in _TABLES} == {t: before[t] for t in _TABLES}, (name, "refused, yet changed")


def test_every_hostile_value_in_every_field_of_every_tool(modern_target: Target) -> None:
    """The systematic half: each hostile value in each field (and as an unknown field) of each tool."""
    target = modern_target
    calls = 0
    for name, schema in sorted(target.schemas.items()):
        base = minimal(schema, schema.get("$defs", {}))
        assert isinstance(base, dict)
        for field in [*schema.get("properties", {}), "unexpected"]:
            for value in HOSTILE:
                _check(target, name, {**base, field: value})
                calls += 1
    assert calls > 1_000
    assert not target.portal.call(target.client.call_tool, "list_projects", {}).is_error

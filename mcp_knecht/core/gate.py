"""The gate: the only way any tool runs.

    call_tool(actor, name, arguments)
      1. look up      unknown, or outside the actor's scopes → the same "unknown tool"
      2. validate     against the input model → an error naming each bad field; nothing runs
      3. decide       the policy: the first matching [[rules]] entry, then Tool.Action → Tool →
                      default → built-in. A decision no rule on arguments can change is taken
                      here, and a deny ends the call before anything else happens
      4. freeze       fill in what the call depends on (a commit SHA, a base version, a role)
      5. decide       otherwise here, on the arguments as frozen and the tool's facts (the branch
                      a run is on): what a rule tests is what will run, not what the model typed
      6. act          deny → refused; approve → staged as a proposal; auto → run (a write is
                      staged all the same for a caller that never writes itself: the chat)
      7. audit        every outcome, with the rule that decided it; then `observe` (metrics, traces,
                      log events) sees the same entry

Freezing only reads, so a call denied at step 5 has still changed nothing.

MCP calls, execution of approved proposals and in-server features all come through here.

Hostile input gets a clear error, is audited, and changes nothing for anyone else: arguments are
checked for values no tool may receive before any model sees them (`core.validation`), every
echo in an error is bounded, answers are masked value by value (`core.scrub`) so masking can
neither break nor fail a result, and anything that still goes wrong becomes an audited internal
error with a reference.
"""

from __future__ import annotations

import json
import logging
import reprlib
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any, Protocol

import msgspec
from msgspec.structs import replace
from pydantic import BaseModel

from mcp_knecht.core.actor import Actor
from mcp_knecht.core.audit import AuditEntry, AuditSink, Observer, Outcome
from mcp_knecht.core.canonical import canonical_json, sha256_hex
from mcp_knecht.core.clock import timestamp_ns
from mcp_knecht.core.policy import Decision, Policy
from mcp_knecht.core.registry import Registry
from mcp_knecht.core.scrub import MASK, Scrubber, json_text
from mcp_knecht.core.tools import MCP, Source, Tool, ToolContext
from mcp_knecht.core.validation import label, validate_arguments
from mcp_knecht.errors import (
    ConflictError,
    InvalidArgumentsError,
    MissingScopeError,
    PolicyDeniedError,
    StoreBusyError,
    ToolError,
    UnknownToolError,
)

logger = logging.getLogger(__name__)

_MAX_AUDITED_NAME = 200
_MAX_AUDITED_ARGUMENTS = 4_000
MAX_ERROR_CHARS = 2_000
"""An error message is cut here (after masking): no error repeats a huge argument back."""


class GateResult(msgspec.Struct, frozen=True):
    """What the gate answers for a call: its outcome, text and structured data."""
    outcome: Outcome
    text: str
    data: dict[str, Any] | None = None
    is_error: bool = False
    error_code: str | None = None


class FrozenCall(msgspec.Struct, frozen=True):
    """A validated call as it will be stored and, if approved, executed."""

    tool: Tool
    action: str | None
    arguments: BaseModel
    arguments_json: str
    arguments_hash: str
    decision: Decision
    source: Source = MCP
    arguments_shown: str = ""
    """The arguments as people see them: secret arguments and secrets masked (canonical JSON)."""


class Stager(Protocol):
    async def stage(self, call: FrozenCall, actor: Actor, staged: AuditEntry) -> dict[str, Any]:
        """Persist `call` as a pending proposal together with its `staged` audit row (one
        transaction); return at least `{"id": …, "status": "pending", "created": bool}`."""
        ...


class Masking(Protocol):
    """What the gate masks outputs with (`core.scrub.Scrubber`, or the app's `SecretRegistry`)."""

    def __call__(self, text: str, keep: frozenset[str] = frozenset()) -> str: ...
    def data(self, value: Any, keep: frozenset[str] = frozenset()) -> Any: ...
    def render(self, value: Any, keep: frozenset[str] = frozenset()) -> tuple[Any, str]: ...
    def found_in(self, texts: Iterable[str]) -> frozenset[str]: ...
    async def refresh(self, *, force: bool = False) -> None: ...


def _strings(value: object) -> Iterator[str]:
    """Every string in the caller's arguments (keys too): what the caller may see again."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack.extend(k for k in item if isinstance(k, str))
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _internal_error(tool_name: str, doing: str) -> GateResult:
    """Log the exception in flight; tell the client only that it happened, and where to look."""
    reference = uuid.uuid4().hex[:12]
    logger.exception("Internal error while %s %s (reference %s)", doing, tool_name, reference)
    message = f"Internal error while {doing} {tool_name} (reference {reference}); the server log has details."
    return GateResult("failed", message, {"error": {"code": "internal", "message": message}},
                      is_error=True, error_code="internal")


def _bounded(message: str) -> str:
    if len(message) <= MAX_ERROR_CHARS:
        return message
    return f"{message[:MAX_ERROR_CHARS]}… (message cut: {len(message)} characters)"


def _why_staged(decision: Decision) -> str:
    """What the agent learns of the rule that staged its call: its reason and the quorum."""
    why = f" Why: {decision.reason}." if decision.reason else ""
    quorum = (f" It needs {decision.approvers} approvals by different operators." if decision.approvers > 1
              else "")
    return why + quorum


def _denied(tool: Tool, action: str | None, decision: Decision) -> GateResult:
    why = f": {decision.reason}" if decision.reason else ""
    return _error("denied", PolicyDeniedError(f"{tool.name}{'.' + action if action else ''} is denied by policy{why}."))


def _error(outcome: Outcome, exc: ToolError) -> GateResult:
    message = _bounded(exc.message)
    data = {"error": {"code": exc.code, "message": message, **exc.details}}
    return GateResult(outcome, message, data, is_error=True, error_code=exc.code)


class Gate:
    def __init__(
        self,
        registry: Registry,
        audit: AuditSink,
        *,
        policy: Callable[[], Policy] = Policy,
        stager: Stager | None = None,
        scrub: Masking | None = None,
        hash_arguments: Callable[[str], str] = sha256_hex,
        observe: Observer | None = None,
    ) -> None:
        """`hash_arguments`: what identifies a call's canonical arguments to operators; the app
        passes a server-keyed MAC, so that nobody can test guesses of a staged value offline."""
        self.registry = registry
        self._audit = audit
        self._policy = policy
        self._stager = stager
        self._scrub: Masking = scrub if scrub is not None else Scrubber()
        self.hash_arguments = hash_arguments
        self._observe = observe

    def visible_tools(self, actor: Actor) -> list[Tool]:
        policy = self._policy()
        return [tool for tool in self.registry.in_scope(actor) if not policy.hides(tool, actor)]

    def policy(self) -> Policy:
        return self._policy()

    async def call_tool(
        self, actor: Actor, name: str, arguments: object, *, source: Source = MCP,
        allowed: Collection[str] | None = None, stage_writes: bool = False,
    ) -> GateResult:
        """`allowed`: a caller's own allowlist (an AI feature's tools); a name outside it is refused
        exactly like an unknown tool, and audited. `stage_writes`: a write the policy would run at
        once is staged instead (the chat: a model never writes by itself); a deny still denies."""
        started = time.perf_counter()
        if not self._audit.accepting():
            busy = StoreBusyError("The store is busy and the audit log is waiting to write; nothing ran. "
                                  "Retry in a few seconds.")
            return self._finish(actor, source, started, _error("failed", busy), name)
        await self._scrub.refresh()  # secrets written elsewhere since the last call are masked too
        # What the caller sent it may see again: the literals in it are not masked in its answer,
        # so an echo can never tell whether a guess was a secret.
        keep = self._scrub.found_in(_strings([name, arguments]))
        tool = self._look_up(actor, name, allowed)
        if tool is None:
            return self._finish(actor, source, started, self._forbidden(name, keep), name, arguments=arguments)
        try:
            validated = validate_arguments(tool.name, tool.input_model, arguments)
        except InvalidArgumentsError as exc:
            return self._finish(actor, source, started, self._tool_error("invalid", exc, keep), name,
                                arguments=arguments)
        action = getattr(validated, "action", None) if tool.action_effects else None
        if not actor.holds(needed := tool.scope_of(action)):
            missing = MissingScopeError(f"{tool.name}.{action} needs scope {needed}, which your token does not hold.")
            return self._finish(actor, source, started, _error("forbidden", missing), name, action)
        decision = self._policy().settled(tool, action, actor)
        if decision is not None and decision.mode == "deny":
            return self._finish(actor, source, started, _denied(tool, action, decision), name, action, decision)
        frozen = await self._freeze(actor, tool, validated, source, keep)
        if isinstance(frozen, GateResult):
            return self._finish(actor, source, started, frozen, name, action, decision)
        if decision is None:
            decided = await self.decide(actor, tool, action, frozen, source=source)
            if isinstance(decided, GateResult):
                return self._finish(actor, source, started, decided, name, action)
            decision = decided
            if decision.mode == "deny":
                return self._finish(actor, source, started, _denied(tool, action, decision), name, action, decision)
        if stage_writes:
            decision = _staged_if_write(tool, action, decision)
        if decision.mode == "approve":
            result, call, recorded = await self._stage(actor, tool, action, frozen, decision, source, started, keep)
            return self._finish(actor, source, started, result, name, action, decision, call=call, recorded=recorded)
        result = await self.execute(actor, tool, frozen, source=source, keep=keep)
        return self._finish(actor, source, started, result, name, action, decision, validated=frozen)

    async def execute(self, actor: Actor, tool: Tool, arguments: BaseModel, *, source: Source,
                      keep: frozenset[str] = frozenset()) -> GateResult:
        """Run a validated, frozen call. Shared by the gate and the executor of approved proposals."""
        if source.executes_proposal and (missing := tool.unfrozen(arguments)):
            return self._tool_error("failed", ConflictError(
                f"This proposal carries no {', '.join(missing)}: it was staged without being frozen, so what "
                "would run is not what was approved. Propose it again."))
        try:
            raw = await tool.handler(arguments, ToolContext(actor=actor, source=source))
        except ToolError as exc:
            return self._tool_error("failed", exc, keep)
        except Exception:
            return _internal_error(tool.name, "running")
        return self._render(tool.name, raw, keep)

    async def decide(self, actor: Actor, tool: Tool, action: str | None, arguments: BaseModel, *,
                     source: Source) -> Decision | GateResult:
        """The policy's decision for a frozen call: rules see its arguments and, when a rule tests
        one, the tool's facts (`Tool.facts`). Shared by the gate and the executor of approved
        proposals (which re-checks that the call is not denied now)."""
        policy = self._policy()
        values = await self.rule_values(actor, tool, arguments, source=source, names=policy.names(tool, action))
        return values if isinstance(values, GateResult) else policy.decide(tool, action, values, actor)

    async def freeze(self, actor: Actor, tool: Tool, validated: BaseModel, *, source: Source) -> BaseModel | GateResult:
        """A validated call frozen exactly as the gate freezes it (for `policy explain`)."""
        return await self._freeze(actor, tool, validated, source)

    async def rule_values(self, actor: Actor, tool: Tool, arguments: BaseModel, *, source: Source,
                          names: frozenset[str] | None = None) -> dict[str, Any] | GateResult:
        """What rules see of a frozen call: its arguments, with the tool's facts over them — only
        `names` (the facts are looked up only when one of them is a fact), or everything."""
        wanted = names if names is not None else frozenset(tool.rule_fields)
        values: dict[str, Any] = {name: getattr(arguments, name, None) for name in tool.rule_fields if name in wanted}
        if tool.facts is not None and not wanted.isdisjoint(tool.fact_fields):
            try:
                facts = await tool.facts(arguments, ToolContext(actor=actor, source=source))
            except ToolError as exc:
                return self._tool_error("failed", exc)
            except Exception:
                return _internal_error(tool.name, "deciding on")
            values.update({name: facts[name] for name in wanted if name in facts})
        return values

    def _look_up(self, actor: Actor, name: object, allowed: Collection[str] | None = None) -> Tool | None:
        if allowed is not None and name not in allowed:
            return None
        tool = self.registry.get(name) if isinstance(name, str) else None
        if tool is None or not actor.holds(tool.scope) or self._policy().hides(tool, actor):
            return None
        return tool

    def _forbidden(self, name: object, keep: frozenset[str]) -> GateResult:
        return self._tool_error("forbidden", UnknownToolError(label(name, _MAX_AUDITED_NAME)), keep)

    async def _freeze(self, actor: Actor, tool: Tool, validated: BaseModel, source: Source,
                      keep: frozenset[str] = frozenset()) -> BaseModel | GateResult:
        """The arguments with everything decided now filled in (`Tool.freeze`), validated again."""
        if tool.freeze is None:
            return validated
        try:
            frozen = await tool.freeze(validated, ToolContext(actor=actor, source=source))
            return validate_arguments(tool.name, tool.input_model, frozen.model_dump(mode="json"))
        except ToolError as exc:
            return self._tool_error("invalid" if isinstance(exc, InvalidArgumentsError) else "failed", exc, keep)
        except Exception:
            return _internal_error(tool.name, "preparing")

    async def _stage(
        self, actor: Actor, tool: Tool, action: str | None, validated: BaseModel, decision: Decision,
        source: Source, started: float, keep: frozenset[str],
    ) -> tuple[GateResult, FrozenCall | None, bool]:
        """Stage the call; True when its audit row was written with the proposal."""
        if self._stager is None:
            refused = PolicyDeniedError(
                f"{tool.name} needs approval, but this server has no proposal store configured."
            )
            return _error("denied", refused), None, False
        try:
            arguments = validated.model_dump(mode="json")
            arguments_json = canonical_json(arguments)
            arguments_hash = self.hash_arguments(arguments_json)
            hidden = tool.hidden_arguments(validated)
            shown = self._scrub.data(
                {name: MASK if name in hidden and value is not None else value for name, value in arguments.items()},
                keep)
            call = FrozenCall(tool, action, validated, arguments_json, arguments_hash, decision, source,
                              arguments_shown=canonical_json(shown))
            staged = self._entry(actor, source, started, "staged", tool.name, action, decision, arguments_hash, {})
            proposal = await self._stager.stage(call, actor, staged)
        except ToolError as exc:
            return self._tool_error("failed", exc, keep), None, False
        except Exception:
            return _internal_error(tool.name, "staging"), None, False
        if proposal.pop("created", True):
            text = f"Submitted for approval (#{proposal['id']}).{_why_staged(decision)}{_follow_up(proposal)}"
        else:
            text = (f"Already pending approval (#{proposal['id']}): you proposed exactly this call before and it "
                    f"still waits for a decision; nothing new was staged.{_follow_up(proposal)}")
        return GateResult("staged", self._scrub(text, keep), self._scrub.data(proposal, keep)), call, True

    def _tool_error(self, outcome: Outcome, exc: ToolError, keep: frozenset[str] = frozenset()) -> GateResult:
        """A tool's own error, masked like any output (its message may quote stored data), then
        bounded: masked first, so a cut can never leave half a secret."""
        message = _bounded(self._scrub(exc.message, keep))
        details = self._scrub.data(exc.details, keep)
        data = {"error": {"code": exc.code, "message": message, **details}}
        return GateResult(outcome, message, data, is_error=True, error_code=exc.code)

    def _render(self, tool_name: str, raw: Any, keep: frozenset[str]) -> GateResult:
        """A handler's result as JSON-ready data and its text, masked (`Scrubber.render`: one scan of
        the text finds nothing to mask, or the result is masked value by value, so a mask cannot
        change its structure). Never raises: at worst it is an internal error."""
        try:
            data, text = self._scrub.render(raw, keep)
            if not isinstance(data, dict):
                data = {"result": data}
                text = json_text(data)
            return GateResult("ran", text, data)
        except Exception:
            return _internal_error(tool_name, "rendering the result of")

    def _finish(
        self,
        actor: Actor,
        source: Source,
        started: float,
        result: GateResult,
        name: object,
        action: str | None = None,
        decision: Decision | None = None,
        *,
        arguments: object = None,
        validated: BaseModel | None = None,
        call: FrozenCall | None = None,
        recorded: bool = False,
    ) -> GateResult:
        """Audit the outcome (unless it was `recorded` with its proposal) and show it to `observe`.
        The entry is built when the audit log writes it, unless an observer wants it now: inside a
        call, after the handler's trip to the database, this code runs with cold CPU caches, at three to eight
        times what the same work costs in the writer's batch."""
        detail: dict[str, Any] = {}
        if result.error_code:
            detail["error"] = result.error_code
        if arguments is not None:
            detail["arguments"] = self._scrub(_bounded_repr(arguments))
        arguments_hash = call.arguments_hash if call else None
        hash_later = validated if arguments_hash is None and result.outcome in ("ran", "failed") else None
        at_ns, duration_ms = time.time_ns(), _elapsed_ms(started)
        tool = label(name, _MAX_AUDITED_NAME)  # now: a waiting entry never holds on to a huge name

        def entry() -> AuditEntry:
            hashed = arguments_hash if hash_later is None else self._hash_of(hash_later)
            return _audit_entry(actor, source, at_ns, duration_ms, result.outcome, tool, action, decision, hashed,
                                detail)

        if self._observe is None:
            if not recorded:
                self._audit.record(entry)
            return result
        built = entry()
        if not recorded:
            self._audit.record(built)
        self._show(self._observe, built, result)
        return result

    def _hash_of(self, arguments: BaseModel) -> str | None:
        """The arguments hash of a call that ran; None (and a log line) if it cannot be computed, which
        costs the audit row its hash, never the row."""
        try:
            return self.hash_arguments(canonical_json(arguments.model_dump(mode="json")))
        except Exception:
            logger.exception("Hashing the arguments of a call for its audit row failed")
            return None

    def _show(self, observe: Observer, entry: AuditEntry, result: GateResult) -> None:
        proposal_id = result.data.get("id") if result.outcome == "staged" and result.data else None
        try:
            observe(replace(entry, proposal_id=proposal_id) if isinstance(proposal_id, int) else entry)
        except Exception:  # monitoring never decides whether a call succeeds
            logger.exception("Observing the outcome of %s failed", entry.tool)

    @staticmethod
    def _entry(actor: Actor, source: Source, started: float, outcome: Outcome, name: object, action: str | None,
               decision: Decision | None, arguments_hash: str | None, detail: dict[str, Any]) -> AuditEntry:
        return _audit_entry(actor, source, time.time_ns(), _elapsed_ms(started), outcome,
                            label(name, _MAX_AUDITED_NAME), action, decision, arguments_hash, detail)


def _elapsed_ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


def _audit_entry(actor: Actor, source: Source, at_ns: int, duration_ms: float, outcome: Outcome, tool: str,
                 action: str | None, decision: Decision | None, arguments_hash: str | None,
                 detail: dict[str, Any]) -> AuditEntry:
    return AuditEntry(
        source=str(source),
        subject=label(actor.subject, _MAX_AUDITED_NAME),
        client=label(actor.client, _MAX_AUDITED_NAME),
        tool=tool,
        action=action,
        outcome=outcome,
        rule=decision.rule if decision else None,
        arguments_hash=arguments_hash,
        detail=detail,
        duration_ms=duration_ms,
        at=timestamp_ns(at_ns),
    )


def _staged_if_write(tool: Tool, action: str | None, decision: Decision) -> Decision:
    """A write the policy runs at once, staged all the same (and the rule says why)."""
    if decision.mode != "auto" or tool.effect_of(action) != "write":
        return decision
    return replace(decision, mode="approve", rule=f"{decision.rule}; staged: this caller never writes by itself")


def _follow_up(proposal: dict[str, Any]) -> str:
    """The staged result's one-line hint, in the text too (several clients show the model only the text)."""
    hint = f" {proposal['next']}" if proposal.get("next") else ""
    if isinstance(expires := proposal.get("expires_at"), str):
        hint += f" It expires at {expires[:16].replace('T', ' ')} UTC unless decided."
    return hint


def _bounded_repr(arguments: object) -> str:
    """Arguments of a refused call, for the audit log: bounded and plain ASCII (escapes keep a
    lone surrogate or a control character visible without making the row unwritable), since
    they may be hostile."""
    try:
        text = json.dumps(arguments, ensure_ascii=True, default=repr)
    except (TypeError, ValueError, RecursionError):
        text = ascii(reprlib.repr(arguments))
    return text if len(text) <= _MAX_AUDITED_ARGUMENTS else text[:_MAX_AUDITED_ARGUMENTS] + "…(truncated)"

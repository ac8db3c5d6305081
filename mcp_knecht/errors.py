"""The errors of mcp-knecht: one hierarchy, each with a machine-readable code.

    KnechtError                      (code "internal")
    ├── UsageError                   "usage"          an operator's input is wrong (a flag, an argument)
    ├── ConfigError                  "config"         a config file, flag or variable is wrong
    │   └── ScopeCatalogueError      "scope_catalogue"  a tool names a scope the catalogue lacks
    ├── AuthError                    "unauthenticated"  no token, or a token we refuse
    ├── ToolError                    (raised by the gate and by tools; becomes an error *result*)
    │   ├── UnknownToolError         "unknown_tool"   unknown, or outside the actor's scopes
    │   ├── InvalidArgumentsError    "invalid_arguments"  names each bad field
    │   ├── PolicyDeniedError        "denied"         the policy says deny
    │   ├── MissingScopeError        "missing_scope"  an action of a visible tool needs another scope
    │   ├── NotFoundError            "not_found"      the thing addressed does not exist (for you)
    │   └── ConflictError            "conflict"       the state does not allow this now
    ├── DecisionError                (an operator's approve/reject could not take effect)
    │   ├── NotPendingError          "not_pending"    unknown, expired, already decided (lost race)
    │   │   └── UnknownProposalError "not_found"      no proposal has this id
    │   ├── SelfApprovalError        "self_approval"  operators cannot approve their own proposals
    │   ├── AlreadyApprovedError     "already_approved"  a quorum needs another operator, not you again
    │   └── HashMismatchError        "hash_mismatch"  the frozen call is not the one the operator saw
    ├── StoreError                   "store"          the database refused or is unreachable
    │   └── StoreBusyError           "store_busy"     the store cannot keep up right now: retry
    ├── TamperedError                "tampered"       a stored record fails its server-keyed check
    └── DeliveryError                "delivery"       a notification channel did not take a message

A `ToolError` reaches the model as a tool result with `isError` and the message; anything else
raised inside a tool is logged and reaches the model only as "internal error" with a reference,
so that internal details (paths, SQL, stack) never leak. The CLIs turn these errors into exit
codes in one place (`mcp_knecht.cli.errors`).
"""

from __future__ import annotations

from typing import Any


class KnechtError(Exception):
    """Base of all our errors. `message` is safe to show to the user who caused it."""

    code = "internal"

    def __init__(self, message: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}


class UsageError(KnechtError):
    code = "usage"


class ConfigError(KnechtError):
    code = "config"


class ScopeCatalogueError(ConfigError):
    code = "scope_catalogue"


class AuthError(KnechtError):
    code = "unauthenticated"


class ToolError(KnechtError):
    code = "tool_error"


class UnknownToolError(ToolError):
    code = "unknown_tool"

    def __init__(self, name: str) -> None:
        # The same message for "does not exist" and "not in your scopes": never reveal which.
        super().__init__(f"Unknown tool: {name!r}.", details={"tool": name})


class InvalidArgumentsError(ToolError):
    code = "invalid_arguments"

    def __init__(self, tool: str, problems: list[dict[str, str]]) -> None:
        lines = "; ".join(f"{p['field']}: {p['problem']}" for p in problems)
        super().__init__(f"Invalid arguments for {tool}: {lines}", details={"problems": problems})
        self.problems = problems


class PolicyDeniedError(ToolError):
    code = "denied"


class MissingScopeError(ToolError):
    code = "missing_scope"


class NotFoundError(ToolError):
    code = "not_found"


class ConflictError(ToolError):
    code = "conflict"


class DecisionError(KnechtError):
    code = "decision"


class NotPendingError(DecisionError):
    code = "not_pending"


class UnknownProposalError(NotPendingError):
    code = "not_found"


class SelfApprovalError(DecisionError):
    code = "self_approval"


class AlreadyApprovedError(DecisionError):
    code = "already_approved"


class HashMismatchError(DecisionError):
    code = "hash_mismatch"


class StoreError(KnechtError):
    code = "store"


class StoreBusyError(StoreError, ToolError):
    code = "store_busy"


class StoreInterruptedError(StoreError, ToolError):
    """A write transaction the database rolled back under us: its connection closed or broke (a server
    restart, a network cut, a session the server ended as idle). Nothing of it was written, and trying
    again is safe; the message names no data, so a caller may be shown it."""

    code = "store_interrupted"


class TamperedError(KnechtError):
    code = "tampered"


class DeliveryError(KnechtError):
    """A channel refused or did not answer. `permanent`: retrying cannot help (HTTP 410 Gone, a
    channel no longer configured); the delivery fails at once instead of backing off."""

    code = "delivery"

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent

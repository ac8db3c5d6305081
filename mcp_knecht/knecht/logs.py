"""Logs: `get_run_log` and `get_action_log`, read without ever loading a log whole: windows by line
number, tail, and bounded grep.

Logs are stored line by line (`log_lines`, primary key run/action/line), so a window or a tail is
one range scan of the primary key, whatever the log's size. grep is a literal, case-insensitive
substring (it cannot backtrack, so no pattern can hang the server), scanned in chunks of lines
under a time budget: a search that runs out of budget stops and says where to continue.

Lines are masked here, at their source, and a search matches, counts and pages on exactly the
masked text the caller may see — never on what is behind a mask, which would let it guess a
secret one character at a time. SQL only narrows the candidates: masking adds no text but `***`,
so a needle without `*` that matches a masked line also matches the stored one (ASCII case
folding, as SQLite's LIKE does); a needle with `*` scans every line.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import Field

from mcp_knecht.core.database import Database, Row
from mcp_knecht.core.scrub import Masked, Scrubber, SecretRegistry
from mcp_knecht.core.tools import Tool, ToolContext, ToolInput
from mcp_knecht.errors import InvalidArgumentsError, NotFoundError

# --- Inputs --------------------------------------------------------------------------------------

DEFAULT_LOG_LINES = 200
MAX_LOG_LINES = 1_000
MAX_GREP_LENGTH = 200


class LogWindow(ToolInput):
    """Which lines of a log to read: the arguments both log tools share."""

    tail: int | None = Field(
        default=None,
        ge=1,
        le=MAX_LOG_LINES,
        description=f"Return the last N lines (1 to {MAX_LOG_LINES}). The best first look at a failure: "
        "errors are usually at the end. Cannot be combined with `offset`.",
    )
    offset: int | None = Field(
        default=None,
        ge=0,
        description="Skip this many lines from the start (line 1 is offset 0). Pass the `next_offset` of "
        "the previous page to continue reading.",
    )
    limit: int = Field(
        default=DEFAULT_LOG_LINES,
        ge=1,
        le=MAX_LOG_LINES,
        description=f"At most this many lines (default {DEFAULT_LOG_LINES}, max {MAX_LOG_LINES}); the output "
        "is also capped at about 24 KB.",
    )
    grep: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_GREP_LENGTH,
        description="Only lines containing this text (a literal substring, not a regex; ignores ASCII case). "
        "Combine with `offset` to continue a search; with `tail`, returns the last N matching lines.",
    )


class GetRunLogInput(LogWindow):
    run_id: int = Field(ge=1, description="The numeric id of the run.")


class GetActionLogInput(LogWindow):
    run_id: int = Field(ge=1, description="The numeric id of the run.")
    action: int | str = Field(
        description="The action: its numeric id (`actions[].id` of get_run) or its name within the run "
        "(e.g. 'test', 'install'). 0 means the run's own log.",
    )


# --- Descriptions --------------------------------------------------------------------------------

_LOG_LIMITS = f"""\
Output is bounded: at most `limit` lines (default {DEFAULT_LOG_LINES}, max {MAX_LOG_LINES}) and about 24 KB; \
very long lines are cut. When more remains, `truncated` is true and `next_offset` says where to continue \
("truncated — next offset N"). `tail`: the last N lines (best first look at a failure). `offset`/`limit`: a \
window, line 1 is offset 0. `grep`: only lines containing a literal text (case-insensitive, no regex), \
searched forwards from `offset`, or backwards with `tail`; a search of a huge log stops after a time budget \
and says which lines it searched. Every line comes with its number `n`. Secrets are masked."""

GET_RUN_LOG = f"""\
Read the run's own log (the runner's output around the actions: queueing, runner, inputs, each action's \
start, end and exit code, and how the run ended). Good for the overall story of a run; the details of a \
failure are in the failed action's log (get_action_log). {_LOG_LIMITS}"""

GET_ACTION_LOG = f"""\
Read the log of one action of a run, addressed by the action's id or by its name (e.g. 'test', \
'install'; get_run lists them). To diagnose a failure: tail the failed action's log first; if the cause is \
not there (e.g. a build warning that led to a later crash), read earlier actions' logs. {_LOG_LIMITS}"""

# --- Tools ---------------------------------------------------------------------------------------


class LogTools:
    """The log tools, bound to one store; `secrets` masks every line before it is searched or shown
    (without it, the secret shapes only)."""

    def __init__(self, db: Database, secrets: SecretRegistry | None = None) -> None:
        self.db = db
        self.secrets = secrets

    def _scrubber(self) -> Scrubber:
        return self.secrets.scrubber if self.secrets is not None else _patterns_only

    async def get_run_log(self, args: GetRunLogInput, ctx: ToolContext) -> dict[str, Any]:
        _one_window("get_run_log", args)
        await find_action(self.db, args.run_id, RUN_LOG)
        page = await read_log(self.db, args.run_id, RUN_LOG, args, self._scrubber())
        return {"run_id": args.run_id, **page}

    async def get_action_log(self, args: GetActionLogInput, ctx: ToolContext) -> dict[str, Any]:
        _one_window("get_action_log", args)
        action = await find_action(self.db, args.run_id, args.action)
        page = await read_log(self.db, args.run_id, action["id"], args, self._scrubber())
        return {"run_id": args.run_id, "action": action, **page}

    def tools(self) -> list[Tool]:
        return [
            Tool(name="get_run_log", description=GET_RUN_LOG, scope="logs:read", input_model=GetRunLogInput,
                 handler=self.get_run_log, title="Read a run's log"),
            Tool(name="get_action_log", description=GET_ACTION_LOG, scope="logs:read",
                 input_model=GetActionLogInput, handler=self.get_action_log, title="Read an action's log"),
        ]


# --- Queries -------------------------------------------------------------------------------------

MAX_OUTPUT_CHARS = 24_000
"""About 6,000 tokens of log text per call: enough to see a failure, small enough for any context."""
MAX_LINE_CHARS = 2_000
GREP_CHUNK_LINES = 40_000
"""About 5 ms of scanning per query on SQLite: the budget is checked between chunks."""
GREP_BATCH_LINES = 2_000
"""Candidate lines fetched (and masked) at a time."""
GREP_BUDGET_SECONDS = 0.03
RUN_LOG = 0

# Case-insensitive substring match: the one SQL dialect difference of this module. SQLite's LIKE
# ignores ASCII case natively (3x faster than lower(text) LIKE); PostgreSQL's LIKE does not.
_CONTAINS = {
    "sqlite": "text LIKE ? ESCAPE '\\'",
    "postgresql": "text ILIKE ? ESCAPE '\\'",
}
_CONTAINS_PORTABLE = "lower(text) LIKE lower(?) ESCAPE '\\'"

_patterns_only = Scrubber()
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _fold(text: str) -> str:
    """ASCII case folding only: exactly what SQLite's LIKE ignores (so SQL never misses a match)."""
    return text.translate(_ASCII_LOWER)


def _shown(text: str) -> str:
    """A masked line as shown: bounded (masking came first, so a cut cannot leave half a key)."""
    if len(text) <= MAX_LINE_CHARS:
        return text
    return f"{text[:MAX_LINE_CHARS]}… [line cut: {len(text)} characters]"


def _like_pattern(needle: str) -> str:
    escaped = needle.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


async def find_action(db: Database, run_id: int, action: int | str) -> Row:
    """An action of a run by id or by name; 0 (or 'run') addresses the run's own log."""
    run = await db.fetch_one("SELECT id FROM runs WHERE id = ?", (run_id,))
    if run is None:
        raise NotFoundError(f"Run {run_id} does not exist.")
    if action in (RUN_LOG, "0", "run"):
        return {"id": RUN_LOG, "name": "run", "position": 0, "status": None}
    columns = "SELECT id, name, position, status, exit_code FROM actions WHERE run_id = ?"
    if isinstance(action, int) or action.isdigit():
        row = await db.fetch_one(f"{columns} AND id = ?", (run_id, int(action)))
    else:
        row = await db.fetch_one(f"{columns} AND name = ? ORDER BY position LIMIT 1", (run_id, action))
    if row is None:
        names = await db.fetch_all("SELECT id, name FROM actions WHERE run_id = ? ORDER BY position", (run_id,))
        listing = ", ".join(f"{r['name']} (id {r['id']})" for r in names) or "none"
        raise NotFoundError(f"Run {run_id} has no action {action!r}. Its actions: {listing}.")
    return row


def _one_window(tool: str, window: LogWindow) -> None:
    if window.tail is not None and window.offset is not None:
        raise InvalidArgumentsError(tool, [{"field": "tail", "problem": "give either tail or offset, not both"}])


async def read_log(db: Database, run_id: int, action_id: int, window: LogWindow,
                   scrub: Scrubber = _patterns_only) -> dict[str, Any]:
    """A page of one log: `tail`, or `offset`/`limit`, or the lines matching `grep` (the tools have
    made sure it is not both tail and offset)."""
    size = await db.fetch_one(
        "SELECT MAX(line_no) AS n FROM log_lines WHERE run_id = ? AND action_id = ?", (run_id, action_id)
    )
    total = int(size["n"] or 0) if size else 0
    if window.grep is not None:
        return await _grep(db, run_id, action_id, total, window, scrub)
    if window.tail is not None:
        first = max(total - window.tail, 0)
        rows = await _lines(db, run_id, action_id, first, total)
        return _page(total, _masked(rows, scrub), from_end=True)
    offset = window.offset or 0
    rows = await _lines(db, run_id, action_id, offset, min(offset + window.limit, total))
    return _page(total, _masked(rows, scrub), from_end=False)


def _masked(rows: list[Row], scrub: Scrubber) -> list[Row]:
    return [{"line_no": row["line_no"], "text": scrub(row["text"])} for row in rows]


async def _lines(db: Database, run_id: int, action_id: int, after: int, upto: int) -> list[Row]:
    if upto <= after:
        return []
    return await db.fetch_all(
        "SELECT line_no, text FROM log_lines WHERE run_id = ? AND action_id = ? AND line_no > ? AND line_no <= ?"
        " ORDER BY line_no",
        (run_id, action_id, after, upto),
    )


def _bounded(rows: list[Row], from_end: bool) -> tuple[list[dict[str, Any]], bool]:
    """Lines within the output budget, keeping the start (or, for a tail, the end)."""
    shown: list[dict[str, Any]] = []
    used = 0
    for row in reversed(rows) if from_end else rows:
        text = _shown(row["text"])
        used += len(text) + 16
        if used > MAX_OUTPUT_CHARS and shown:
            break
        shown.append({"n": row["line_no"], "text": Masked(text)})
    if from_end:
        shown.reverse()
    return shown, len(shown) < len(rows)


def _page(total: int, rows: list[Row], *, from_end: bool) -> dict[str, Any]:
    lines, cut = _bounded(rows, from_end)
    result: dict[str, Any] = {"total_lines": total, "lines": lines}
    last = lines[-1]["n"] if lines else None
    result["first_line"] = lines[0]["n"] if lines else None
    result["last_line"] = last
    if from_end:
        earlier = lines[0]["n"] - 1 if lines else total
        result["truncated"] = earlier > 0
        if earlier > 0:
            result["note"] = (
                f"Showing the last lines only; {earlier} earlier lines — read them with offset/limit "
                f"(e.g. offset={max(earlier - 200, 0)})."
            )
        result["next_offset"] = None
        return result
    more = last is not None and last < total
    result["truncated"] = more or cut
    result["next_offset"] = last if more else None
    if more:
        result["note"] = f"Output truncated — next offset {last}: call again with offset={last} to continue."
    return result


async def _grep(db: Database, run_id: int, action_id: int, total: int, window: LogWindow,
                scrub: Scrubber) -> dict[str, Any]:
    assert window.grep is not None
    needle = window.grep
    folded = _fold(needle)
    # SQL narrows the candidates only where that is exact (see the module doc); every candidate is
    # masked and matched here, so matches, counts and offsets are those of the text shown.
    narrow = "*" not in needle
    contains = f" AND {_CONTAINS.get(db.dialect, _CONTAINS_PORTABLE)}" if narrow else ""
    wanted = window.tail or window.limit
    backwards = window.tail is not None
    order = "DESC" if backwards else "ASC"
    deadline = time.perf_counter() + GREP_BUDGET_SECONDS
    matches: list[Row] = []
    low, high = (window.offset or 0), total  # the not yet searched range is (low, high]
    while low < high and len(matches) < wanted:
        if backwards:
            after, upto = max(high - GREP_CHUNK_LINES, low), high
        else:
            after, upto = low, min(low + GREP_CHUNK_LINES, high)
        batch = min(wanted - len(matches), GREP_BATCH_LINES) if narrow else GREP_BATCH_LINES
        candidates = await db.fetch_all(
            "SELECT line_no, text FROM log_lines WHERE run_id = ? AND action_id = ? AND line_no > ?"
            f" AND line_no <= ?{contains} ORDER BY line_no {order} LIMIT ?",
            (run_id, action_id, after, upto, *([_like_pattern(needle)] if narrow else []), batch),
        )
        for row in candidates:
            text = scrub(row["text"])
            if folded in _fold(text):
                matches.append({"line_no": row["line_no"], "text": text})
                if len(matches) >= wanted:
                    break
        if len(matches) >= wanted:
            # Stopped at a match: the search resumes after it.
            if backwards:
                high = matches[-1]["line_no"] - 1
            else:
                low = matches[-1]["line_no"]
            break
        if len(candidates) == batch:  # more candidates in this chunk: continue after the last one
            if backwards:
                high = candidates[-1]["line_no"] - 1
            else:
                low = candidates[-1]["line_no"]
        elif backwards:
            high = after
        else:
            low = upto
        if time.perf_counter() > deadline:
            break
    if backwards:
        matches.reverse()
    lines, cut = _bounded(matches, from_end=backwards)
    result: dict[str, Any] = {
        "total_lines": total,
        "grep": needle,
        "matches": len(lines),
        "lines": lines,
        "first_line": lines[0]["n"] if lines else None,
        "last_line": lines[-1]["n"] if lines else None,
    }
    if backwards:
        result["searched"] = {"from_line": high + 1, "to_line": total}
        result["truncated"] = high > (window.offset or 0) or cut
        result["next_offset"] = None
        if high > (window.offset or 0):
            result["note"] = (
                f"Searched lines {high + 1} to {total} only; lines 1 to {high} were not searched "
                f"(grep with offset/limit searches forwards)."
            )
        return result
    resume = lines[-1]["n"] if cut and lines else low
    result["searched"] = {"from_line": (window.offset or 0) + 1, "to_line": resume}
    result["truncated"] = resume < total
    result["next_offset"] = resume if resume < total else None
    if resume < total:
        reason = "match limit reached" if len(matches) >= wanted else "search time budget used up"
        result["note"] = (
            f"Output truncated ({reason}) — next offset {resume}: call again with the same grep and "
            f"offset={resume} to continue."
        )
    return result

"""Scrubbing: mask secrets in what leaves the server.

    scrub = Scrubber({"s3cr3t-value"})
    scrub('password=hunter2 key AKIAABCDEFGHIJKLMNOP')  →  'password=*** key AKIA***'
    scrub.data({"log": 'the "s3cr3t-value"', "password": "x"})  →  {"log": 'the "***"', "password": "***"}

One precompiled alternation finds every known secret shape (cloud keys, GitHub/GitLab/Slack
tokens, JWTs, PEM private keys, `password=`/`token:` pairs, credentials in URLs) and the literal
values registered from configuration (a project's secret variables). A cheap prefilter on
lower-cased text skips the regex for clean text, so scrubbing every result costs microseconds.

Structured results are masked value by value (`data`), never as serialised JSON: a mask replaces
characters inside a string and can never change a result's structure, whatever a secret's value
(`": null`, a quote, a backslash, a newline). A dict entry whose key names a secret (`password`,
`api_key`, …) has its whole string value masked.

Literal values: 6 characters or more are masked wherever they occur; 3 to 5 characters only
where they stand as a whole token (not inside a longer word or number: `abc12` is masked in
`pass abc12 now`, not in `xabc12y`); shorter ones are not masked at all — they protect nothing.

What the caller sent it may see again: `keep` (the literals found in the caller's own arguments,
`found_in`) are not masked in the answer to that call, so echoing a guess back can never tell
whether the guess was a secret. Data a tool masked at its source is wrapped in `Masked` and left
as it is.

Every mask ends in `***`, the only text scrubbing adds, and a mask never spans a quote or a
backslash: a search for text without `*` that matches scrubbed text also matches the original.

Most results hold no secret at all. `render` therefore first serialises a result once (in C) and
scans that one text for everything that could be masked; only when something could be (or the
result is not plain JSON) is it walked value by value. The scan can only err towards walking: in
JSON text without a backslash every string stands verbatim between quotes, so whatever matches
inside one string matches in the text too.

That scan, and the first look at every text, is one pass of a RE2 automaton (`_prefilter`) over
the text's UTF-8 bytes: every literal, the start of every token shape, every pair keyword in any
case, a backslash. It matches wherever the precise checks could (a superset: it only ever sends
a text on to them), in a few microseconds however many literals there are; `str.find` per literal
and per keyword cost 45 µs on a 3 KB result with 20 literals.
"""

from __future__ import annotations

import bisect
import enum
import json
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import msgspec
import orjson

logger = logging.getLogger(__name__)

MASK = "***"
_REFRESH_EVERY = 0.25
"""How often `SecretRegistry.refresh` asks a watched source whether its values changed (seconds)."""
MIN_LITERAL_LENGTH = 6
"""Literal values this long are masked wherever they occur."""
MIN_TOKEN_LITERAL_LENGTH = 3
"""Shorter literal values (3 to 5 characters) are masked where they stand as a whole token; values
shorter than this are not masked at all (masking 'on' or '1' everywhere would destroy outputs)."""

# Characters a secret value may contain: stops at whitespace, quotes, backslashes and separators.
_VALUE = r"[^\s\"'\\,;&<>]+"
_KEY_WORDS = r"(?:password|passwd|pwd|secret|token|api[_-]?key|apikey|access[_-]?key|private[_-]?key|credentials?)"

# Token shapes, matched case-sensitively and without a leading `\b`: each then starts with a
# literal, which lets the regex engine jump to candidates instead of trying every position (the
# difference is 1 µs against 75 µs on 3 KB). The word boundary before a token is checked by hand.
_TOKENS: dict[str, re.Pattern[str]] = {
    "pem": re.compile(
        r"(?P<begin>-----BEGIN[A-Z ]{0,30}PRIVATE KEY-----)(?:(?!-----END)[\s\S]){0,8000}"
        r"(?P<end>-----END[A-Z ]{0,30}PRIVATE KEY-----)?", re.IGNORECASE),
    "aws_key_id": re.compile(r"(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    "github": re.compile(r"gh[pousr]_[A-Za-z0-9]{20,255}\b|github_pat_[A-Za-z0-9_]{22,255}\b"),
    "gitlab": re.compile(r"glpat-[A-Za-z0-9_\-]{20,64}"),
    "slack": re.compile(r"xox[abprs]-[A-Za-z0-9\-]{10,255}"),
    "jwt": re.compile(r"eyJ[A-Za-z0-9_\-]{5,}\.eyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]{5,}"),
    # scheme://user:password@host — the match starts at "://", keeps the user, masks the password.
    "url": re.compile(r"(?P<head>://[^\s:/@\"'\\]{1,200}:)[^\s@/\"'\\]{1,300}(?=@)"),
}


# key = value, key: value, "key": "value", KEY="value" — keep the key, mask the value. The match
# starts at the keyword: whatever precedes it (AWS_, DB_) is part of the key and stays. Matched on
# the lower-cased text at the places a keyword occurs.
_PAIR_START = re.compile(r"passw(?:or)?d|pwd|secret|token|api[_-]?key|access[_-]?key|private[_-]?key|credential")
_PAIR_WORDS = ("passwd", "password", "pwd", "secret", "token", "credential")
_KEY_PREFIXES = tuple(word + sep for word in ("api", "access", "private") for sep in ("", "_", "-"))
_PAIR = re.compile(
    r"(?P<key>" + _KEY_WORDS + r"[a-z0-9_.\-]{0,40})"
    r"(?P<close>\\{0,7}[\"'])?[ \t]{0,3}[:=][ \t]{0,3}(?P<open>\\{0,7}[\"'])?"
    r"(?P<value>" + _VALUE + ")"
)
_PAIR_ANY_CASE = re.compile(_PAIR.pattern.replace("[a-z0-9_.", "[A-Za-z0-9_."), re.IGNORECASE)
_HARMLESS_VALUES = frozenset({"", "null", "none", "true", "false", MASK, "[redacted]"})
_MAX_DEPTH = 64
_PLAIN_ONLY = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS
"""orjson refuses these (and non-str keys, lone surrogates, ints beyond 64 bits) instead of
converting them its own way: the walk decides how they look, for both paths alike."""
_SECRET_KEY = re.compile(_KEY_WORDS + r"[a-z0-9_.\-]{0,40}$")
"""A dict key that names a secret (`password`, `DB_PASSWORD`, `api_key`): its string value is masked."""


_LITERALS_WORTH_A_PREFILTER = 40
"""`found_in` asks the prefilter first only with more literals than this (below, `in` is cheaper)."""

_PREFILTER_SHAPES = (
    r"\\",  # a backslash: in JSON text, an escape (strings no longer verbatim)
    "\u0130",  # İ: its lower case is two characters (the pair check's offsets), and `re.I` matches it to i
    r"(?i:-----beg).(?i:n)",  # PEM; any letter for the I (Python's IGNORECASE also takes U+0130, U+0131)
    r"AKIA|ASIA|gh[pousr]_|github_pat_|glpat-|xox[abprs]-|eyJ",
    r"://[^\s:/@\"'\\]+:[^\s@/\"'\\]+@",  # a password in a URL (unbounded: counted repeats blow up a DFA)
    r"(?i:passw(?:or)?d|pwd|secret|token|api[_-]?key|access[_-]?key|private[_-]?key|credential)",
)


def _prefilter(literals: Iterable[str]) -> Any:
    """One RE2 automaton over UTF-8 bytes that matches wherever a literal, a token or a pair could be
    masked (see the module), or None when a literal cannot be written in it (a lone surrogate).

    Built outside `re2.compile`'s cache: that keeps the last 128 patterns alive, each with up to
    8 MB of automaton, and every change of the secret values makes a new one (a soak grew the
    server by 150 MB in ten minutes). Only the current scrubber's automaton lives. RE2 does not log:
    should a search outgrow its memory it falls back to a slower engine, with the same answer."""
    import re2  # type: ignore[import-untyped]  # with the first automaton: a cold start needs none

    options = re2.Options()
    options.log_errors = False
    try:
        alternatives = [re2.escape(literal) for literal in sorted(literals)] + list(_PREFILTER_SHAPES)
        return re2._Regexp("|".join(alternatives).encode(), options)
    except Exception:  # unencodable literal, or beyond RE2's memory: the precise checks alone, as before
        return None


def _word_char(char: str) -> bool:
    return char.isalnum() or char == "_"


def _may_hold_pair(lowered: str) -> bool:
    """Whether `_PAIR_START` occurs in `lowered`: the same answer, by substring search (a regex
    alternation without a common first letter tries every position: 30 µs on 3 KB against 3)."""
    if any(word in lowered for word in _PAIR_WORDS):
        return True
    at = lowered.find("key")
    while at != -1:
        if lowered.endswith(_KEY_PREFIXES, 0, at):
            return True
        at = lowered.find("key", at + 3)
    return False


def _mask_tokens(text: str, name: str, pattern: re.Pattern[str]) -> str:
    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        if name not in ("url", "pem") and match.start() and _word_char(text[match.start() - 1]):
            return token  # inside a longer word: not a token of this kind
        if name == "aws_key_id":
            return token[:4] + MASK
        if name == "github":
            return token[: len("github_pat_") if token.startswith("github_pat_") else 4] + MASK
        if name in ("gitlab", "slack"):
            return token[: token.index("-") + 1] + MASK
        if name == "jwt":
            return "eyJ" + MASK
        if name == "pem":  # the armour lines stay as they were: only the key material goes
            return match.group("begin") + MASK + (match.group("end") or "")
        return match.group("head") + MASK  # url

    return pattern.sub(replace, text)


def _pair_replacement(text: str, match: re.Match[str]) -> str | None:
    """The masked form of a key/value match, or None to leave it (JSON's `"secret": true`)."""
    if match.group("close") and not match.group("open"):
        return None  # a quoted key with an unquoted value: a JSON literal, not a secret
    value = text[match.start("value"):match.end("value")]
    if value.lower() in _HARMLESS_VALUES:
        return None
    return text[match.start():match.start("value")] + MASK


def _mask_pairs(text: str) -> str:
    lowered = text.lower()
    if len(lowered) != len(text):  # case folding changed lengths (rare scripts): the slow, exact way
        return _PAIR_ANY_CASE.sub(lambda m: _pair_replacement(text, m) or m.group(0), text)
    out, done = [], 0
    for start in (found.start() for found in _PAIR_START.finditer(lowered)):
        if start < done:
            continue
        match = _PAIR.match(lowered, start)
        if match is None or (masked := _pair_replacement(text, match)) is None:
            continue
        out += [text[done:start], masked]
        done = match.end()
    return "".join(out) + text[done:] if out else text


def _encodable(text: str) -> str:
    """`text` as it can be sent: a lone surrogate (never valid UTF-8) becomes U+FFFD."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


class Masked:
    """A value a tool has already masked at its source (with the full set of literals): the gate
    passes it on as it is. Only for text the tool scrubbed itself, e.g. log lines it searched."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


_UNBUILT: Any = object()


class Scrubber:
    """`scrubber(text) -> text` with secrets masked. Immutable: `with_literals` returns a new one."""

    __slots__ = ("_by_length", "_lengths", "_literals", "_ordered", "_prefilter", "_short", "_short_pattern")

    def __init__(self, literals: Iterable[str] = ()) -> None:
        values = {v for v in literals if isinstance(v, str) and len(v.strip()) >= MIN_TOKEN_LITERAL_LENGTH}
        self._literals = frozenset(values)
        self._by_length = tuple(sorted(values, key=lambda v: (len(v), v)))  # for `found_in`: shortest first
        self._lengths = tuple(len(v) for v in self._by_length)
        # Longest first, so a value that contains another is masked whole.
        self._ordered = tuple(sorted((v for v in values if len(v) >= MIN_LITERAL_LENGTH), key=lambda v: (-len(v), v)))
        self._short = frozenset(v for v in values if len(v) < MIN_LITERAL_LENGTH)
        self._short_pattern = (
            re.compile(r"(?<![0-9A-Za-z])(?:" + "|".join(re.escape(v) for v in sorted(self._short, key=len,
                       reverse=True)) + r")(?![0-9A-Za-z])")
            if self._short else None
        )
        self._prefilter: Any = _UNBUILT  # built by the first text to scan (`_automaton`)

    @property
    def literals(self) -> frozenset[str]:
        return self._literals

    def with_literals(self, values: Iterable[str]) -> Scrubber:
        """A scrubber that also masks `values` (exact, case-sensitive; see the module's rules on length)."""
        return Scrubber(self._literals | set(values))

    async def refresh(self, *, force: bool = False) -> None:
        """Nothing to refresh: a `Scrubber` is immutable (see `SecretRegistry.refresh`)."""

    def found_in(self, texts: Iterable[str]) -> frozenset[str]:
        """The literal values that occur in any of `texts` (the caller's own arguments)."""
        if not self._literals:
            return frozenset()
        # Beyond a few dozen literals one automaton pass per text beats a search per literal (2,000
        # literals: 4.5 µs against 83 µs for two short arguments); where it finds nothing, no literal occurs.
        prefilter = len(self._literals) > _LITERALS_WORTH_A_PREFILTER
        found: set[str] = set()
        shortest = self._lengths[0]
        for text in texts:
            if len(text) < shortest or (prefilter and self._clean(text)):
                continue
            # Only a literal no longer than the text can occur in it: arguments are mostly short
            # (slugs, ids, branch names), secret values mostly long, so most are never searched for.
            fits = bisect.bisect_right(self._lengths, len(text))
            found.update(v for v in self._by_length[:fits] if v in text)
        return frozenset(found)

    def __call__(self, text: str, keep: frozenset[str] = frozenset()) -> str:
        if not text or self._clean(text):
            return text
        return self._masked(text, keep)

    def _automaton(self) -> Any:
        """The prefilter, built on first use: a start that scans no text pays neither it nor RE2."""
        if (prefilter := self._prefilter) is _UNBUILT:
            prefilter = self._prefilter = _prefilter(self._literals)
        return prefilter

    def _clean(self, text: str) -> bool:
        """True when the prefilter proves nothing in `text` could be masked."""
        prefilter = self._automaton()
        if prefilter is None:
            return False
        try:
            encoded = text.encode()
        except UnicodeEncodeError:  # a lone surrogate: the precise checks look
            return False
        return prefilter.search(encoded) is None

    def _masked(self, text: str, keep: frozenset[str]) -> str:
        """`text` with every secret masked: the precise checks, each on the whole text."""
        for literal in self._ordered:
            if literal in text and literal not in keep:
                text = text.replace(literal, MASK)
        if self._short_pattern is not None and any(v in text for v in self._short):
            text = self._short_pattern.sub(lambda m: m.group(0) if m.group(0) in keep else MASK, text)
        # Only the patterns whose hints occur can match; usually none do, and the text is clean.
        for name, pattern in _TOKENS.items():
            if pattern.search(text):  # each starts with a literal: a fast scan, usually finding nothing
                text = _mask_tokens(text, name, pattern)
        if _may_hold_pair(text.lower()):
            text = _mask_pairs(text)
        return text

    def data(self, value: Any, keep: frozenset[str] = frozenset()) -> Any:
        """A JSON-ready copy of `value` with every string masked: dicts, lists and tuples walked,
        keys masked too (without ever merging two), other values made JSON-safe. Never raises."""
        return _walk(value, lambda text: self(text, keep), None, 0)

    def render(self, value: Any, keep: frozenset[str] = frozenset()) -> tuple[Any, str]:
        """`data(value, keep)` and its JSON text, by one scan of the whole text when nothing in it
        could need masking (the usual case), value by value otherwise. Never raises."""
        text = self._plain_json(value)
        if text is not None:
            return orjson.loads(text), text
        data = self.data(value, keep)
        return data, json_text(data)

    def _plain_json(self, value: Any) -> str | None:
        """`value` as JSON text if it is plain JSON in which nothing could be masked, else None."""
        try:  # dicts with str keys, lists, tuples, scalars; enums and UUIDs come out as the walk shows them
            encoded = orjson.dumps(value, option=_PLAIN_ONLY)
        except (TypeError, RecursionError):
            return None  # not plain JSON (a model, `Masked`, a lone surrogate, a cycle): walked instead
        prefilter = self._automaton()
        if prefilter is not None and prefilter.search(encoded) is None:
            return encoded.decode()
        return self._plain_text(encoded.decode())

    def _plain_text(self, text: str) -> str | None:
        """`text` (a value's JSON) if the precise checks find nothing in it that could be masked."""
        if "\\" in text:
            return None  # an escaped character: strings no longer stand verbatim in the text
        if any(literal in text for literal in self._literals):
            return None
        if any(pattern.search(text) for pattern in _TOKENS.values()):
            return None
        lowered = text.lower()
        if len(lowered) != len(text) or _may_hold_pair(lowered):
            return None  # a key/value pair, or a key naming a secret (its keywords are the pairs')
        return text


def json_text(data: Any) -> str:
    """JSON-ready `data` as compact JSON text, as `render` writes it on either path."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def _walk(value: Any, scrub: Callable[[str], str] | None, key: str | None, depth: int) -> Any:
    """`value` made JSON-safe, each string passed through `scrub` (None: left as it is)."""
    if isinstance(value, str):
        if scrub is None:
            return _encodable(value)
        masked = _encodable(scrub(value))
        if key is not None and masked.lower() not in _HARMLESS_VALUES and _SECRET_KEY.search(key.lower()):
            return MASK
        return masked
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None  # JSON has no NaN or infinity
    if isinstance(value, enum.Enum):
        return _walk(value.value, scrub, key, depth)
    if isinstance(value, Masked):
        return _walk(value.value, None, None, depth)
    if depth > _MAX_DEPTH:
        return MASK  # deeper than any result we build: not worth walking
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for raw_key, item in value.items():
            name = raw_key if isinstance(raw_key, str) else str(raw_key)
            shown = _encodable(scrub(name)) if scrub is not None else _encodable(name)
            while shown in out:  # two keys masked alike must not become one
                shown += "*"
            out[shown] = _walk(item, scrub, name, depth + 1)
        return out
    if isinstance(value, list | tuple | set | frozenset):
        return [_walk(item, scrub, None, depth + 1) for item in value]
    if hasattr(value, "model_dump"):  # a pydantic model
        return _walk(value.model_dump(mode="json"), scrub, key, depth + 1)
    return _walk(str(value), scrub, key, depth)


LiteralLoader = Callable[[], Awaitable[Iterable[str]]]
VersionProbe = Callable[[], Awaitable[object]]


class _Source(msgspec.Struct):
    """One source of secret literals: the values it gave, and how to tell when they change."""
    values: frozenset[str] = frozenset()
    load: LiteralLoader | None = None
    version: VersionProbe | None = None
    seen: object = None
    checked: float = -math.inf


class SecretRegistry:
    """A scrubber whose literal values can be replaced at run time (when variables change).

    Pass the registry itself where a scrubber is expected; changes swap the compiled scrubber
    atomically, so concurrent calls see either the old or the new set. Literals come from named
    sources (each toolset its own), so one source replacing its values leaves the others' alone.

    A source can be `watch`ed: `refresh()` (the gate calls it before every call) asks its cheap
    `version` probe whether the values changed — in this process, another one, another replica, or
    the CI system writing the store directly — at most every quarter second, and reloads them.
    """

    __slots__ = ("_next_check", "_refreshing", "_scrubber", "_sources")

    def __init__(self, literals: Iterable[str] = ()) -> None:
        self._sources: dict[str, _Source] = {"": _Source(frozenset(literals))}
        self._scrubber = Scrubber(literals)
        self._refreshing = False
        self._next_check = math.inf
        """When the next watched source is due to be asked (`time.monotonic`): until then `refresh`
        returns at once (it runs before every call)."""

    @property
    def literals(self) -> frozenset[str]:
        return self._scrubber.literals

    @property
    def scrubber(self) -> Scrubber:
        """The current set, frozen (for a whole result scrubbed alike)."""
        return self._scrubber

    def _compile(self) -> None:
        self._scrubber = Scrubber(frozenset().union(*(source.values for source in self._sources.values())))

    def update(self, values: Iterable[str], *, source: str = "") -> None:
        """Replace the values of `source` (the default source unless named)."""
        self._sources.setdefault(source, _Source()).values = frozenset(values)
        self._compile()

    def add(self, values: Iterable[str], *, source: str = "") -> None:
        entry = self._sources.setdefault(source, _Source())
        entry.values = entry.values | set(values)
        self._compile()

    def watch(self, source: str, load: LiteralLoader, version: VersionProbe) -> None:
        """Keep `source` current: `refresh` reloads it when `version()` answers something new."""
        self._sources[source] = _Source(self._sources.get(source, _Source()).values, load, version)
        self._next_check = -math.inf

    async def refresh(self, *, force: bool = False) -> None:
        """Reload every watched source whose version changed. Never raises: on a failure the last
        set stays in force (and the failure is logged)."""
        if self._refreshing and not force:
            return  # another call is at it; this one uses the set as it is
        now = time.monotonic()
        if now < self._next_check and not force:
            return
        self._refreshing = True
        try:
            for name, source in list(self._sources.items()):
                if source.load is None or source.version is None:
                    continue
                if not force and now - source.checked < _REFRESH_EVERY:
                    continue
                source.checked = now
                try:
                    version = await source.version()
                    if force or version != source.seen:
                        values = frozenset(await source.load())
                        source.seen = version
                        if values != source.values:
                            source.values = values
                            self._compile()
                except Exception:
                    logger.exception("Could not refresh the secret values of %s; the last ones stay in force", name)
        finally:
            self._next_check = min((source.checked + _REFRESH_EVERY for source in self._sources.values()
                                    if source.load is not None and source.version is not None), default=math.inf)
            self._refreshing = False

    def found_in(self, texts: Iterable[str]) -> frozenset[str]:
        return self._scrubber.found_in(texts)

    def data(self, value: Any, keep: frozenset[str] = frozenset()) -> Any:
        return self._scrubber.data(value, keep)

    def render(self, value: Any, keep: frozenset[str] = frozenset()) -> tuple[Any, str]:
        return self._scrubber.render(value, keep)

    def __call__(self, text: str, keep: frozenset[str] = frozenset()) -> str:
        return self._scrubber(text, keep)

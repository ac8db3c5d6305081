"""Scrubbing: mask secrets in text before it leaves the server.

    scrub = Scrubber().with_literals({"s3cr3t-value"})
    scrub('password=hunter2 key AKIAABCDEFGHIJKLMNOP')  →  'password=*** key AKIA****************'

One precompiled alternation finds every known secret shape (cloud keys, GitHub/GitLab/Slack
tokens, JWTs, PEM private keys, `password=`/`token:` pairs, credentials in URLs) and the literal
values registered from configuration (a project's secret variables). A cheap prefilter on
lower-cased text skips the regex for clean text, so scrubbing every result costs microseconds.

Masks contain no quotes and no backslashes, and a match never spans a quote or backslash, so
JSON text stays valid JSON after scrubbing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MASK = "***"
MIN_LITERAL_LENGTH = 6
"""Shorter literal values are not masked: masking 'on' or '1' everywhere would destroy outputs."""

# Characters a secret value may contain: stops at whitespace, quotes, backslashes and separators.
_VALUE = r"[^\s\"'\\,;&<>]+"
_KEY_WORDS = r"(?:password|passwd|pwd|secret|token|api[_-]?key|apikey|access[_-]?key|private[_-]?key|credentials?)"

# name → (regex, lower-cased substrings of which at least one occurs in any match).
_PATTERNS: dict[str, tuple[str, tuple[str, ...]]] = {
    "pem": (
        r"-----BEGIN[A-Z ]{0,30}PRIVATE KEY-----(?:(?!-----END)[\s\S]){0,8000}"
        r"(?:-----END[A-Z ]{0,30}PRIVATE KEY-----)?",
        ("-----begin",),
    ),
    "aws_key_id": (r"(?-i:\b(?:AKIA|ASIA)[0-9A-Z]{16}\b)", ("akia", "asia")),
    "github": (r"\b(?:gh[pousr]_[A-Za-z0-9]{20,255}|github_pat_[A-Za-z0-9_]{22,255})\b", ("gh",)),
    "gitlab": (r"\bglpat-[A-Za-z0-9_\-]{20,64}", ("glpat-",)),
    "slack": (r"\bxox[abprs]-[A-Za-z0-9\-]{10,255}", ("xox",)),
    "jwt": (r"\beyJ[A-Za-z0-9_\-]{5,}\.eyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]{5,}", ("eyj",)),
    # scheme://user:password@host — the match starts at "://", keeps the user, masks the password.
    "url": (r"(?P<url_head>://[^\s:/@\"'\\]{1,200}:)[^\s@/\"'\\]{1,300}(?=@)", ("://",)),
    # key = value, key: value, "key": "value", KEY="value" — keep the key, mask the value. The match
    # starts at the keyword: whatever precedes it (AWS_, DB_) is part of the key and stays.
    "pair": (
        r"(?P<pair_key>" + _KEY_WORDS + r"[A-Za-z0-9_.\-]{0,40})"
        r"(?P<pair_close>\\{0,7}[\"'])?[ \t]{0,3}[:=][ \t]{0,3}(?P<pair_open>\\{0,7}[\"'])?"
        r"(?P<pair_value>" + _VALUE + ")",
        ("pass", "pwd", "secret", "token", "key", "credential"),
    ),
}


def _compile(names: tuple[str, ...], literals: tuple[str, ...]) -> re.Pattern[str]:
    parts = [f"(?P<{name}>{_PATTERNS[name][0]})" for name in names]
    if literals:
        parts.insert(0, "(?P<literal>(?-i:" + "|".join(re.escape(value) for value in literals) + "))")
    return re.compile("|".join(parts), re.IGNORECASE)


def _mask_token(token: str, keep: int) -> str:
    """Keep a short, harmless prefix (e.g. `ghp_`) so a reader knows what kind of secret it was."""
    return token[:keep] + MASK


def _replace(match: re.Match[str]) -> str:
    kind = match.lastgroup
    text = match.group(0)
    if kind == "literal":
        return MASK
    if kind == "aws_key_id":
        return _mask_token(text, 4)
    if kind == "github":
        return _mask_token(text, len("github_pat_") if text.startswith("github_pat_") else 4)
    if kind in ("gitlab", "slack"):
        return _mask_token(text, text.index("-") + 1)
    if kind == "jwt":
        return "eyJ" + MASK
    if kind == "pem":
        return "-----BEGIN PRIVATE KEY----- " + MASK + " -----END PRIVATE KEY-----"
    if kind == "url":
        return match.group("url_head") + MASK
    # A pair. A quoted key followed by an unquoted value is JSON's `"secret": true`: not a secret.
    if match.group("pair_close") and not match.group("pair_open"):
        return text
    value = match.group("pair_value")
    if value == MASK or value.lower() in ("null", "none", "true", "false", "***", "[redacted]"):
        return text
    return text[: match.start("pair_value") - match.start()] + MASK


class Scrubber:
    """`scrubber(text) -> text` with secrets masked. Immutable: `with_literals` returns a new one."""

    __slots__ = ("_compiled", "_literal_probe", "_literals", "_ordered")

    def __init__(self, literals: Iterable[str] = ()) -> None:
        self._literals = frozenset(v for v in literals if len(v) >= MIN_LITERAL_LENGTH)
        # Longest first, so a value that contains another is masked whole.
        self._ordered = tuple(sorted(self._literals, key=lambda v: (-len(v), v)))
        self._literal_probe = (
            re.compile("|".join(re.escape(v) for v in self._ordered)) if self._ordered else None
        )
        self._compiled: dict[tuple[tuple[str, ...], bool], re.Pattern[str]] = {}

    @property
    def literals(self) -> frozenset[str]:
        return self._literals

    def with_literals(self, values: Iterable[str]) -> Scrubber:
        """A scrubber that also masks `values` (exact, case-sensitive; shorter than 6 ignored)."""
        return Scrubber(self._literals | set(values))

    def _pattern(self, names: tuple[str, ...], literals: bool) -> re.Pattern[str]:
        key = (names, literals)
        pattern = self._compiled.get(key)
        if pattern is None:
            pattern = self._compiled[key] = _compile(names, self._ordered if literals else ())
        return pattern

    def __call__(self, text: str) -> str:
        if not text:
            return text
        lowered = text.lower()
        # Only the patterns whose hints occur can match; usually none do, and the text is clean.
        names = tuple(name for name, (_, hints) in _PATTERNS.items() if any(h in lowered for h in hints))
        literals = self._literal_probe is not None and self._literal_probe.search(text) is not None
        if not names and not literals:
            return text
        return self._pattern(names, literals).sub(_replace, text)


class SecretRegistry:
    """A scrubber whose literal values can be replaced at run time (when variables change).

    Pass the registry itself where a `Callable[[str], str]` is expected; `update` swaps the
    compiled scrubber atomically, so concurrent calls see either the old or the new set.
    """

    __slots__ = ("_scrubber",)

    def __init__(self, literals: Iterable[str] = ()) -> None:
        self._scrubber = Scrubber(literals)

    @property
    def literals(self) -> frozenset[str]:
        return self._scrubber.literals

    def update(self, values: Iterable[str]) -> None:
        self._scrubber = Scrubber(values)

    def add(self, values: Iterable[str]) -> None:
        self._scrubber = Scrubber(self._scrubber.literals | set(values))

    def __call__(self, text: str) -> str:
        return self._scrubber(text)

"""What the CLIs print cannot rewrite the operator's terminal.

Proposals, audit rows and errors carry text an agent chose. Control characters (an escape
sequence, a carriage return, a backspace) and invisible or bidirectional formatting (U+202E
RIGHT-TO-LEFT OVERRIDE, zero-width characters) could hide, reorder or fake what an operator
reads before approving. Everything the CLIs print passes `printable`: such characters become
visible escapes (`\\u202e`) — the same escapes JSON uses, so `--json` output stays valid JSON
with the same content. Newlines and tabs stay.

    with safe_output():      # sys.stdout and sys.stderr neutralise what is written to them
        ...
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f"  # C0 (but tab and newline) and C1 controls, DEL
    "\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f"  # soft hyphen, invisible joiners and fillers
    "\u200b-\u200f\u2028-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff9-\ufffb"  # zero-width, bidi
    "\ud800-\udfff]"  # lone surrogates: they cannot even be encoded
)


def printable(text: str) -> str:
    """`text` with every control, bidi and invisible formatting character as a visible escape."""
    return _UNSAFE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


class _Neutralised:
    """A text stream that writes `printable` text to the stream it wraps."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(printable(text))
        return len(text)

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


@contextmanager
def safe_output() -> Iterator[None]:
    """Neutralise everything printed to stdout and stderr inside the block."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Neutralised(out), _Neutralised(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err

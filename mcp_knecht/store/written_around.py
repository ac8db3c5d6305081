"""What a row reads as when someone wrote into it around the store, with values of a kind our code never
writes: one such proposal must fail no read but its own seal check (and that check must refuse it,
audited, rather than raise), and one such audit row must not stop `audit list`.

SQLite keeps a BLOB as bytes in any column, and text in an INTEGER column when it is no number; JSON
columns hold whatever text was written (`core.stored_json` reads those). Read as they came, they raised
(`TypeError` in the seal's canonical JSON, `ValueError` in a quorum size, `JSONDecodeError` in a preview)
wherever the row went: every listing holding it failed, for everyone. PostgreSQL's typed columns refuse
most of these when they are written.

The checks are cheap enough for every read: a row holds no bytes unless written around the store, and
that is asked once per row.
"""

from __future__ import annotations

from mcp_knecht.core.database import Row
from mcp_knecht.core.stored_json import decoded


def as_text(row: Row) -> Row:
    """The row with every bytes value read as text (a changed value then fails the seal, as any would)."""
    if bytes not in map(type, row.values()):  # a C loop: 0.8 µs a row of 26 values
        return row
    return {column: decoded(value) for column, value in row.items()}


def quorum_size(value: object) -> int:
    """A stored number of approvers. One that is no integer reads as 1: the seal covers every other size, so
    a proposal that needed more fails it, and one that needed 1 still needs 1."""
    try:
        return int(value or 1)  # type: ignore[call-overload,no-any-return]
    except (TypeError, ValueError):
        return 1


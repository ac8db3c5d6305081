"""A repr that leaves secrets out.

Value objects are msgspec Structs (created in C: the stdlib's dataclasses compile six methods per
frozen class, a third of a cold start's extra instructions), and Structs have no per-field
`repr=False`. A class holding a secret defines `__repr__` with this.
"""

from __future__ import annotations

from collections.abc import Collection

import msgspec


def repr_without(value: msgspec.Struct, hidden: Collection[str]) -> str:
    """`Name(field=value, ...)` as msgspec shows a Struct, leaving out the fields named in `hidden`."""
    shown = ", ".join(f"{name}={getattr(value, name)!r}" for name in value.__struct_fields__ if name not in hidden)
    return f"{type(value).__name__}({shown})"

"""A repr that leaves secrets out.

Value objects are msgspec Structs, created in C: Python 3.11's dataclasses compile each of a frozen
class's six methods with an `exec` of its own, which was over half of what a cold start spent beyond
a bare SDK server's (README, "Performance"). Structs have no per-field `repr=False`: a class holding
a secret defines `__repr__` with this.
"""

from __future__ import annotations

from collections.abc import Collection

import msgspec


def repr_without(value: msgspec.Struct, hidden: Collection[str]) -> str:
    """`Name(field=value, ...)` as msgspec shows a Struct, leaving out the fields named in `hidden`."""
    shown = ", ".join(f"{name}={getattr(value, name)!r}" for name in value.__struct_fields__ if name not in hidden)
    return f"{type(value).__name__}({shown})"

"""Who is calling: built only from a verified token, never from tool arguments."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Actor:
    """Who calls: a verified token's subject, its client and the scopes it grants."""
    subject: str
    client: str
    scopes: frozenset[str]
    claims: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def holds(self, scope: str) -> bool:
        return scope in self.scopes

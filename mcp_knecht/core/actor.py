"""Who is calling: built only from a verified token, never from tool arguments."""

from __future__ import annotations

from typing import Any

import msgspec


class Actor(msgspec.Struct, frozen=True):
    """Who calls: a verified token's subject, its client and the scopes it grants."""
    subject: str
    client: str
    scopes: frozenset[str]
    claims: dict[str, Any] = msgspec.field(default_factory=dict)
    """The token's claims as verified: what it says, not who it is (equality and hash leave them out)."""

    def __eq__(self, other: object) -> bool:
        if type(other) is not Actor:
            return NotImplemented
        return (self.subject, self.client, self.scopes) == (other.subject, other.client, other.scopes)

    def __hash__(self) -> int:
        return hash((self.subject, self.client, self.scopes))

    def holds(self, scope: str) -> bool:
        return scope in self.scopes

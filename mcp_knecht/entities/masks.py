"""Field masks: what one caller may read and propose to write, as seed 000 defines it.

    readable  = role read mask ∧ list        (plus the primary key, when anything is readable)
    writable  = role write mask ∧ persist
    deletable = the role's `delete = true`

Neither mask alone is enough. The role comes from a verified token claim (`role_claim`, default
`knecht_role`), else `default_role`; a caller without a role, or whose role the entity does not
declare, may do nothing with the entity.
"""

from __future__ import annotations

import msgspec

from mcp_knecht.core.actor import Actor
from mcp_knecht.entities.declaration import Declaration, EntitySpec
from mcp_knecht.errors import PolicyDeniedError


class Access(msgspec.Struct, frozen=True):
    role: str
    read: tuple[str, ...]
    """Readable fields, in declaration order (the primary key first)."""
    write: frozenset[str]
    delete: bool


def role_of(actor: Actor, declaration: Declaration) -> str | None:
    claimed = actor.claims.get(declaration.role_claim)
    if isinstance(claimed, str) and claimed:
        return claimed
    return declaration.default_role


def access(entity: EntitySpec, role: str | None, claim: str) -> Access:
    """The caller's masks for `entity`; refused when the role has no access to it at all."""
    mask = entity.roles.get(role) if role is not None else None
    if role is None or mask is None:
        who = f"role {role!r}" if role is not None else f"no role (token claim {claim!r})"
        raise PolicyDeniedError(
            f"Your token carries {who}, which has no access to {entity.name}; ask an admin for a role "
            f"that entities.toml grants on it.",
            details={"entity": entity.name},
        )
    read = [f for f in entity.list if f in mask.read and f != entity.primary_key]
    if read or entity.primary_key in mask.read:
        read.insert(0, entity.primary_key)
    return Access(role, tuple(read), frozenset(f for f in entity.persist if f in mask.write), mask.delete)

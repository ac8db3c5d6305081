"""Load pyjwt for a process whose only token key is an HMAC secret: without `cryptography`.

pyjwt imports `cryptography` whenever it is installed (20 ms of a stdio server's 800 ms cold start)
although HS256 needs only `hmac`; without it pyjwt runs as it does when installed without its
`crypto` extra, a configuration it supports: HMAC algorithms only. Only `mcp-knecht serve` over
stdio asks for this, after reading its key settings (one verifier, one secret, for the life of the
process). Anything imported later may still import `cryptography` itself.
"""

from __future__ import annotations

import sys


def import_jwt_without_cryptography() -> None:
    """Import pyjwt with `cryptography` out of its sight; nothing when either is loaded already."""
    if "jwt" in sys.modules or "cryptography" in sys.modules:
        return
    sys.modules["cryptography"] = None  # type: ignore[assignment]  # import fails: pyjwt's documented fallback
    try:
        import jwt  # noqa: F401
    finally:
        del sys.modules["cryptography"]

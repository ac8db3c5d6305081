"""The server key's MACs: HMAC-SHA256 exactly, whatever the message, however often it is used.

Seals, arguments hashes and audit links already stored were made with `hmac.digest`; the MAC must
stay that function bit for bit, or every existing chain and seal would fail to verify.
"""

from __future__ import annotations

import hashlib
import hmac

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_knecht.core.keys import ServerKeys
from mcp_knecht.errors import ConfigError

KEYS = ServerKeys(b"test-server-key-" * 4)
PURPOSES = ("seal", "approval", "arguments", "audit", "audit-anchor")


def stdlib_mac(keys: ServerKeys, purpose: str, message: str) -> str:
    key = hmac.new(keys.secret, b"mcp-knecht/" + purpose.encode(), hashlib.sha256).digest()
    return hmac.digest(key, message.encode("utf-8", "surrogatepass"), "sha256").hex()


@given(purpose=st.sampled_from(PURPOSES), message=st.text(alphabet=st.characters(), max_size=3000))
def test_a_mac_is_hmac_sha256_of_the_message_under_the_purposes_derived_key(purpose: str, message: str) -> None:
    assert KEYS.mac(purpose, message) == stdlib_mac(KEYS, purpose, message)


@pytest.mark.parametrize("message", ["", "a", "\udc80 lone surrogate", "x" * 55, "x" * 64, "é" * 5000])
def test_messages_at_block_edges_and_beyond_hashlibs_locking_size_mac_alike(message: str) -> None:
    for purpose in PURPOSES:
        assert KEYS.mac(purpose, message) == stdlib_mac(KEYS, purpose, message)


def test_a_mac_leaves_the_keyed_state_as_it_was_for_the_next_message() -> None:
    keys = ServerKeys(b"k" * 32)
    first = keys.mac("audit", "row 1")
    keys.mac("audit", "a much longer row " * 200)
    assert keys.mac("audit", "row 1") == first == stdlib_mac(keys, "audit", "row 1")
    assert keys.verify("audit", "row 1", first)
    assert not keys.verify("audit", "row 2", first)
    assert not keys.verify("seal", "row 1", first)  # each purpose its own key


def test_a_short_server_key_is_refused() -> None:
    with pytest.raises(ConfigError, match="at least 32 bytes"):
        ServerKeys(b"k" * 31)

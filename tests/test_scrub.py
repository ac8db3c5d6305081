"""The scrubber: secret formats masked, keys kept, JSON kept valid, clean text untouched.
(Its speed is measured by scripts/bench_scrub.py.)"""

from __future__ import annotations

import json

import pytest

from mcp_knecht.core.scrub import MASK, Scrubber, SecretRegistry

scrub = Scrubber()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE", "AWS_ACCESS_KEY_ID=***"),
        ("key ASIAIOSFODNN7EXAMPLE here", "key ASIA*** here"),
        ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "aws_secret_access_key = ***"),
        ("push with ghp_abcdefghijklmnopqrstuvwxyz0123456789 now", "push with ghp_*** now"),
        ("gho_abcdefghijklmnopqrstuvwxyz0123456789", "gho_***"),
        ("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", "github_pat_***"),
        ("glpat-abcdefghij0123456789xy", "glpat-***"),
        ("hook xoxb-123456789012-abcdefghijklmnop", "hook xoxb-***"),
        ("Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlMTIz", "Bearer eyJ***"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
         "-----BEGIN PRIVATE KEY----- *** -----END PRIVATE KEY-----"),
        ("DEBUG db config: password=hunter22 host=db", "DEBUG db config: password=*** host=db"),
        ("passwd: s3cr3t!", "passwd: ***"),
        ("token: abcdef123", "token: ***"),
        ("DB_PASSWORD='abc123xyz'", "DB_PASSWORD='***'"),
        ("api_key=K3y-V4lue&x=1", "api_key=***&x=1"),
        ("postgres://app:Sup3rS3cret@db.internal:5432/app", "postgres://app:***@db.internal:5432/app"),
        ("https://user:pa55@example.com/x", "https://user:***@example.com/x"),
    ],
)
def test_secret_formats_are_masked_and_keys_kept(text: str, expected: str) -> None:
    assert scrub(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "collected 312 items; 312 passed in 41.27s",
        "https://git.acme.internal/acme/payments-api.git",
        '{"name": "DEPLOY_TOKEN", "secret": true, "value": null}',
        "the token bucket refills every second",
        "commit 3f9a0c2 by anna.schmidt",
        "",
    ],
)
def test_clean_text_is_returned_unchanged(text: str) -> None:
    assert scrub(text) == text


def test_json_stays_valid_json() -> None:
    data = {
        "lines": ["password=hunter22", 'token: "abc123xyz"', "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
                  "postgres://u:p4ssw0rd@h/db", "AKIAIOSFODNN7EXAMPLE"],
        "password": "hunter22",
        "secret": False,
        "nested": json.dumps({"api_key": "abcdefgh"}),
    }
    for text in (json.dumps(data), json.dumps(data, ensure_ascii=False, indent=2), json.dumps(json.dumps(data))):
        scrubbed = scrub(text)
        decoded = json.loads(scrubbed)
        assert "hunter22" not in scrubbed and "p4ssw0rd" not in scrubbed and "abcdefgh" not in scrubbed
        assert decoded is not None
    assert json.loads(scrub(json.dumps(data)))["secret"] is False


def test_literal_values_are_masked_exactly() -> None:
    literals = Scrubber().with_literals({"Zq9-literal-value", "short"})
    assert literals("x Zq9-literal-value y") == f"x {MASK} y"
    assert literals("short stays") == "short stays"  # too short to mask without destroying text
    assert "Zq9-literal-value" in literals.literals and "short" not in literals.literals


def test_the_registry_swaps_its_values() -> None:
    registry = SecretRegistry({"first-secret-value"})
    assert registry("first-secret-value") == MASK
    registry.update({"second-secret-value"})
    assert registry("first-secret-value") == "first-secret-value"
    registry.add({"third-secret-value"})
    assert registry("second-secret-value third-secret-value") == f"{MASK} {MASK}"

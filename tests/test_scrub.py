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
         "-----BEGIN RSA PRIVATE KEY-----***-----END RSA PRIVATE KEY-----"),
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
    literals = Scrubber().with_literals({"Zq9-literal-value", "short", "on"})
    assert literals("x Zq9-literal-value y") == f"x {MASK} y"
    assert literals("xZq9-literal-valuey") == f"x{MASK}y"  # six characters or more: wherever it occurs
    # Three to five characters: only as a whole token, never inside a longer word or number.
    assert literals("short stays; so does shortly and unshort, but (short) and short=1 go") == (
        f"{MASK} stays; so does shortly and unshort, but ({MASK}) and {MASK}=1 go")
    assert literals("on and on") == "on and on"  # shorter than three: protects nothing, not masked
    assert "Zq9-literal-value" in literals.literals and "on" not in literals.literals


@pytest.mark.parametrize("literal", ['": null', "failed", 'quo"te-value', "back\\slash-value",
                                     "new\nline-value", "<b>&amp;-value"])
def test_masking_works_inside_values_and_never_changes_a_results_structure(literal: str) -> None:
    """Issue 11, items 2 and 3: a literal is masked in the decoded value, whatever characters it has,
    and the result keeps its shape (keys, types, nesting) — masking can never break an output."""
    result = {"status": "failed", "note": f"a {literal} b", "nested": [{"text": literal, "n": 3, "ok": None}],
              "flag": True, literal: "key"}
    masked = Scrubber([literal]).data(result)
    assert json.loads(json.dumps(masked)) == masked
    assert not any(literal in text for text in _strings(masked))
    assert masked["note"] == f"a {MASK} b" and masked["nested"] == [{"text": MASK, "n": 3, "ok": None}]
    assert masked["flag"] is True and set(masked) == {"status", "note", "nested", "flag", MASK}
    assert masked["status"] == (MASK if literal == "failed" else "failed")


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [*value, *(s for item in value.values() for s in _strings(item))]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


def test_keys_that_name_secrets_have_their_values_masked_and_keys_never_merge() -> None:
    scrub_data = Scrubber(["alpha-secret", "beta-secret"]).data
    masked = scrub_data({"password": "hunter22", "DB_PASSWORD": "x y z", "secret": True, "token": None,
                         "alpha-secret": 1, "beta-secret": 2, "name": "DEPLOY_TOKEN"})
    assert masked["password"] == MASK and masked["DB_PASSWORD"] == MASK
    assert masked["secret"] is True and masked["token"] is None and masked["name"] == "DEPLOY_TOKEN"
    assert sorted(v for k, v in masked.items() if k.startswith(MASK)) == [1, 2]  # two keys, both kept


def test_what_the_caller_sent_is_not_masked_back_and_masked_data_is_left_alone() -> None:
    from mcp_knecht.core.scrub import Masked

    scrub = Scrubber(["Summer2026!", "other-secret"])
    keep = scrub.found_in(["grep for Summer2026!", "nothing"])
    assert keep == {"Summer2026!"}
    assert scrub("no match for 'Summer2026!' in other-secret", keep) == f"no match for 'Summer2026!' in {MASK}"
    assert scrub.data({"echo": Masked("other-secret"), "x": "other-secret"}) == {"echo": "other-secret", "x": MASK}


def test_values_that_cannot_be_sent_are_made_safe() -> None:
    masked = Scrubber().data({"lone": "a\ud800b", "nan": float("nan"), "tuple": (1, 2), 3: "int key"})
    assert masked == {"lone": "a\ufffdb", "nan": "nan", "tuple": [1, 2], "3": "int key"}
    json.dumps(masked).encode("utf-8")


def test_the_registry_swaps_its_values() -> None:
    registry = SecretRegistry({"first-secret-value"})
    assert registry("first-secret-value") == MASK
    registry.update({"second-secret-value"})
    assert registry("first-secret-value") == "first-secret-value"
    registry.add({"third-secret-value"})
    assert registry("second-secret-value third-secret-value") == f"{MASK} {MASK}"

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
    assert masked == {"lone": "a\ufffdb", "nan": None, "tuple": [1, 2], "3": "int key"}
    json.dumps(masked).encode("utf-8")


def test_the_registry_swaps_its_values() -> None:
    registry = SecretRegistry({"first-secret-value"})
    assert registry("first-secret-value") == MASK
    registry.update({"second-secret-value"})
    assert registry("first-secret-value") == "first-secret-value"
    registry.add({"third-secret-value"})
    assert registry("second-secret-value third-secret-value") == f"{MASK} {MASK}"


# --- the one-scan path: `render` gives exactly what the value-by-value walk gives -----------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mcp_knecht.core.scrub import _PAIR_START, _may_hold_pair  # noqa: E402

_SECRETY = st.sampled_from([
    "password", "passwd", "PWD", "secret", "Token", "api_key", "api-key", "apikey", "Access_Key",
    "private-key", "credential", "key", "keys", "monkey", "pass", "=", ":", " ", '"', "'", "\\", "\n", "\t",
    "AKIAIOSFODNN7EXAMPLE", "ghp_abcdefghijklmnopqrstuvwxyz0123456789", "eyJhbGciOi.eyJzdWIiOi.c2lnbmF0",
    "://u:p@h", "s3cr3t-value", "abc", "ΣΑΣ", "İ", "\ud800", "null",
    "\u212a", "\u0131", "\u017f", "-----BEGİN RSA PR\u0131VATE KEY-----", "-----begin private key-----", "xoxb-",
    "https://user:pw@host", "glpat-", "github_pat_",
])
_TEXT = st.lists(st.one_of(_SECRETY, st.text(max_size=6)), max_size=8).map("".join)
_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), _TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_TEXT, inner, max_size=4)),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(_TEXT)
def test_the_pair_prefilter_answers_exactly_as_the_pair_pattern(text: str) -> None:
    lowered = text.lower()
    assert _may_hold_pair(lowered) == (_PAIR_START.search(lowered) is not None)


@settings(max_examples=400, deadline=None)
@given(_JSON, st.sampled_from([(), ("s3cr3t-value",), ("abc", "s3cr3t-value")]))
def test_rendering_in_one_scan_gives_what_masking_value_by_value_gives(
        value: object, literals: tuple[str, ...]) -> None:
    scrubber = Scrubber(literals)
    data, text = scrubber.render(value)
    assert data == scrubber.data(value)
    assert json.loads(text) == data


@settings(max_examples=600, deadline=None)
@given(_TEXT, st.sampled_from([(), ("s3cr3t-value",), ("abc", "s3cr3t-value")]))
def test_a_text_the_prefilter_passes_is_one_the_precise_checks_leave_alone(
        text: str, literals: tuple[str, ...]) -> None:
    scrubber = Scrubber(literals)
    if scrubber._clean(text):
        assert scrubber._masked(text, frozenset()) == text


@settings(max_examples=600, deadline=None)
@given(_JSON, st.sampled_from([(), ("s3cr3t-value",), ("abc", "s3cr3t-value")]))
def test_a_result_the_prefilter_passes_is_one_the_precise_scan_passes(
        value: object, literals: tuple[str, ...]) -> None:
    import orjson

    scrubber = Scrubber(literals)
    try:
        text = orjson.dumps(value).decode()
    except TypeError:
        return  # not plain JSON: walked without a scan
    if scrubber._automaton().search(text.encode()) is None:
        assert scrubber._plain_text(text) == text


@settings(max_examples=400, deadline=None)
@given(st.lists(_TEXT, max_size=4), st.sampled_from([("s3cr3t-value",), ("abc", "s3cr3t-value", "\u212aey")]))
def test_the_literals_found_in_a_callers_arguments_are_all_of_them(texts: list[str],
                                                                    literals: tuple[str, ...]) -> None:
    """The prefilter only skips texts in which no literal can occur (the echo rule depends on it)."""
    many = {f"filler-literal-{n:03d}" for n in range(60)}  # enough for found_in to ask the prefilter
    for scrubber in (Scrubber(literals), Scrubber({*literals, *many})):
        assert scrubber.found_in(texts) == {v for v in scrubber.literals if any(v in text for text in texts)}



@st.composite
def _literals_and_texts(draw: st.DrawFn) -> tuple[list[str], list[str]]:
    literals = draw(st.lists(st.text(min_size=3, max_size=14), min_size=1, max_size=8))
    pieces = st.one_of(st.sampled_from(literals), st.text(max_size=6))
    texts = draw(st.lists(st.lists(pieces, max_size=3).map("".join), max_size=4))
    return literals, texts


@settings(max_examples=400, deadline=None)
@given(_literals_and_texts())
def test_a_literal_is_found_in_an_argument_exactly_as_long_as_it_or_longer(
        literals_and_texts: tuple[list[str], list[str]]) -> None:
    """`found_in` searches each text only for the literals that fit in it (by length): one the
    same length as the whole argument, or inside a longer one, is still found."""
    literals, texts = literals_and_texts
    scrubber = Scrubber(literals)
    assert scrubber.found_in(texts) == {v for v in scrubber.literals if any(v in text for text in texts)}
    for literal in scrubber.literals:
        assert scrubber.found_in([literal]) >= {literal}
        assert literal in scrubber.found_in(["x" + literal])

def test_the_prefilter_finds_each_kind_of_secret_and_passes_ordinary_text() -> None:
    scrubber = Scrubber({"s3cr3t-value", "abc"})
    for dirty in ("the s3cr3t-value", "x abc y", "PassWord: x", "AKIAIOSFODNN7EXAMPLE", "postgres://u:pw@db/x",
                  "-----BEGIN RSA PRIVATE KEY-----", "-----BEGİN PRIVATE KEY-----", "api\u212aey=1", 'a \\ b'):
        assert not scrubber._clean(dirty), dirty
    clean = '{"slug":"payments-api","url":"https://git.acme.internal/a.git","branch":"feature/idempotency-keys"}'
    assert scrubber._clean(clean)
    assert not Scrubber({"\ud800abc"})._clean(clean)  # no prefilter for an unencodable literal: precise checks


def test_a_clean_result_is_rendered_in_one_scan_and_a_secret_in_it_is_still_masked() -> None:
    scrubber = Scrubber({"s3cr3t-value"})
    clean = {"project": "payments-api", "branches": [{"name": "feature/idempotency-keys"}], "n": 3}
    assert scrubber._plain_json(clean) is not None
    for dirty in ({"log": "the s3cr3t-value"}, {"api_key": "x"}, {"note": "password=hunter22"},
                  {"t": "AKIAIOSFODNN7EXAMPLE"}, {"q": 'say "hi"'}, {1: "int key"}):
        assert scrubber._plain_json(dirty) is None
    assert scrubber.render({"log": "the s3cr3t-value", "api_key": "x"})[0] == {"log": "the ***", "api_key": MASK}


def test_a_new_set_of_secrets_leaves_no_automaton_behind() -> None:
    """Each change of the secret values builds a new scrubber; re2's own cache of compiled patterns
    (128 of them, up to 8 MB each) must not keep the old automata alive: a soak grew by 150 MB."""
    import re2

    cached = re2._Regexp._make.cache_info().currsize
    scrubbers = [Scrubber({f"secret-value-{n}"}) for n in range(20)]
    assert all(s._automaton() is not None for s in scrubbers)
    assert re2._Regexp._make.cache_info().currsize == cached
    long_text = "a log line of ordinary words " * 40_000 + "then postgres://app:pw-41x@db/main"
    assert scrubbers[0](long_text).endswith("postgres://app:***@db/main")  # a megabyte in, found all the same


def test_a_watched_source_is_asked_at_once_then_at_most_every_quarter_second() -> None:
    """Values written elsewhere (another process, the CI system) are masked within a quarter
    second; in between, `refresh` (run before every call) asks nobody."""
    import time

    import anyio

    from mcp_knecht.core import scrub as scrub_module

    values = {"current": ["first-secret-value"]}
    asked: list[float] = []

    async def load() -> list[str]:
        return values["current"]

    async def version() -> object:
        asked.append(time.monotonic())
        return tuple(values["current"])

    async def scenario() -> None:
        registry = SecretRegistry()
        registry.watch("variables", load, version)
        await registry.refresh()
        assert registry("the first-secret-value") == "the ***"
        values["current"] = ["second-secret-value"]
        for _ in range(50):
            await registry.refresh()
        assert len(asked) == 1  # not due yet: nobody asked, the old set stays in force
        assert registry("the second-secret-value") == "the second-secret-value"
        await anyio.sleep(scrub_module._REFRESH_EVERY + 0.05)
        await registry.refresh()
        assert len(asked) == 2
        assert registry("the second-secret-value the first-secret-value") == "the *** the first-secret-value"
        registry.watch("other", load, version)  # a new source is asked at the next call, not a quarter second later
        await registry.refresh()
        assert len(asked) == 3

    anyio.run(scenario)

"""The public API's access decisions with plain values: key files, key checks, bind safety."""

from __future__ import annotations

import pytest

from router.public_access import (ApiKeyError, ApiKeys, bearer_token, exposure_problem, is_loopback, load_api_keys,
                                  parse_api_keys)

KEY_A = "a" * 32
KEY_B = "b" * 32


def test_key_file_skips_comments_and_blank_lines_and_keeps_each_key_once_in_order():
    text = f"# the current key\n{KEY_A}\n\n   {KEY_B}  \n  # old, remove after the roll\n{KEY_A}\n"
    assert parse_api_keys(text) == (KEY_A, KEY_B)


@pytest.mark.parametrize("line, why", [("short", "at least 16 characters"),
                                       ("has a space inside it too", "without spaces"),
                                       ("caf\u00e9" * 8, "printable ASCII")])
def test_a_bad_key_is_refused_naming_its_line_and_how_to_make_one(line, why):
    with pytest.raises(ApiKeyError, match=why) as refused:
        parse_api_keys(f"# header\n{line}\n", "keys.txt")
    assert "keys.txt, line 2" in str(refused.value) and "openssl rand -hex 32" in str(refused.value)


def test_load_reads_the_file_then_adds_the_environment_key(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"{KEY_A}\n")
    assert load_api_keys(str(path), f"{KEY_B}\n") == (KEY_A, KEY_B)
    assert load_api_keys(str(path), KEY_A) == (KEY_A,)
    assert load_api_keys("", KEY_B) == (KEY_B,)
    assert load_api_keys("", "") == ()


def test_a_named_key_file_that_is_missing_or_empty_is_an_error(tmp_path):
    with pytest.raises(ApiKeyError, match="cannot read the API key file"):
        load_api_keys(str(tmp_path / "absent"))
    (tmp_path / "empty").write_text("# nothing yet\n")
    with pytest.raises(ApiKeyError, match="holds no key"):
        load_api_keys(str(tmp_path / "empty"))


def test_api_keys_accept_every_configured_key_and_nothing_else():
    keys = ApiKeys((KEY_A, KEY_B))
    assert keys.accepts(KEY_A) and keys.accepts(KEY_B)
    assert not keys.accepts(None)
    assert not keys.accepts("")
    assert not keys.accepts(KEY_A[:-1])
    assert not keys.accepts(KEY_A + "a")
    assert not keys.accepts(KEY_A.upper())


def test_api_keys_compare_against_every_key_without_stopping_at_a_match(monkeypatch):
    import router.public_access as access

    compared = []
    real = access.hmac.compare_digest
    monkeypatch.setattr(access.hmac, "compare_digest", lambda a, b: compared.append(len(b)) or real(a, b))
    keys = ApiKeys((KEY_A, KEY_B, "c" * 40))
    assert keys.accepts(KEY_A)
    assert compared == [32, 32, 32]  # all three, digests of equal length whatever the key's length
    compared.clear()
    assert not keys.accepts("x")
    assert compared == [32, 32, 32]


def test_no_keys_is_not_an_api_keys_value():
    with pytest.raises(ApiKeyError):
        ApiKeys(())


@pytest.mark.parametrize("header, token", [(f"Bearer {KEY_A}", KEY_A), (f"bearer  {KEY_A} ", KEY_A),
                                           (f"Basic {KEY_A}", None), ("Bearer", None), ("Bearer ", None),
                                           (KEY_A, None), ("", None), (None, None)])
def test_bearer_token_takes_the_token_of_a_bearer_authorization_only(header, token):
    assert bearer_token(header) == token


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("[::1]", True),
                                            ("localhost", True), ("0.0.0.0", False), ("::", False), ("", False),
                                            ("10.0.0.7", False), ("router.example", False)])
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_loopback_needs_nothing():
    assert exposure_problem("127.0.0.1", tls=False, api_keys=False, insecure=False) is None


def test_beyond_loopback_tls_and_keys_together_are_enough():
    assert exposure_problem("0.0.0.0", tls=True, api_keys=True, insecure=False) is None


def test_beyond_loopback_insecure_allows_what_is_missing():
    assert exposure_problem("0.0.0.0", tls=False, api_keys=False, insecure=True) is None


@pytest.mark.parametrize("tls, api_keys, missing", [(False, False, "without TLS and API keys"),
                                                    (True, False, "without API keys"),
                                                    (False, True, "without TLS:")])
def test_beyond_loopback_what_is_missing_is_named_with_every_way_to_fix_it(tls, api_keys, missing):
    problem = exposure_problem("10.0.0.7", tls=tls, api_keys=api_keys, insecure=False)
    assert f"on 10.0.0.7 {missing}" in problem
    for fix in ("--tls-cert-file", "--tls-key-file", "--api-key-file", "PDSERVE_API_KEY", "127.0.0.1", "--insecure"):
        assert fix in problem

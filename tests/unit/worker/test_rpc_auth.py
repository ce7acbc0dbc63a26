"""Worker gRPC's authentication decisions with plain values: tokens, freshness, replays
(the interceptors on real gRPC servers: test_worker_rpc_auth_grpc.py)."""

import pytest

from pdserve.rpc_auth import FRESHNESS_S, HEADER, ReplayCache, check, mac, make_token

SECRET = b"0123456789abcdef0123456789abcdef"
WORKER = frozenset({"10.0.0.7:50061"})
DECODE = "/pdserve.v1.Worker/Decode"
NOW_S = 1_800_000_000.0
NONCE = "ab" * 16


def test_a_token_is_version_time_nonce_and_an_hmac_that_only_the_same_claims_reproduce():
    token = make_token(SECRET, "10.0.0.7:50061", DECODE, NOW_S, NONCE)
    version, at_ms, nonce, digest = token.split(".")
    assert (version, int(at_ms), nonce) == ("v1", 1_800_000_000_000, NONCE)
    assert digest == mac(SECRET, "10.0.0.7:50061", DECODE, 1_800_000_000_000, NONCE) and len(digest) == 64
    assert SECRET.decode() not in token
    others = {mac(b"another secret, 32 bytes long!!!", "10.0.0.7:50061", DECODE, 1_800_000_000_000, NONCE),
              mac(SECRET, "10.0.0.8:50061", DECODE, 1_800_000_000_000, NONCE),
              mac(SECRET, "10.0.0.7:50061", "/pdserve.v1.Worker/Prefill", 1_800_000_000_000, NONCE),
              mac(SECRET, "10.0.0.7:50061", DECODE, 1_800_000_000_001, NONCE),
              mac(SECRET, "10.0.0.7:50061", DECODE, 1_800_000_000_000, "cd" * 16)}
    assert digest not in others and len(others) == 5
    assert HEADER == HEADER.lower()   # gRPC metadata keys must be lower case


def test_the_right_token_is_accepted_with_its_nonce_and_when_it_goes_stale():
    verdict = check(SECRET, WORKER, DECODE, make_token(SECRET, "10.0.0.7:50061", DECODE, NOW_S, NONCE), NOW_S + 2)
    assert (verdict.accepted, verdict.why, verdict.nonce, verdict.expires_at_s) == (True, "", NONCE, NOW_S + FRESHNESS_S)


@pytest.mark.parametrize("offered, why", [
    (None, "carries no proof"),
    ("", "carries no proof"),
    ("v1.1.2", "malformed"),
    ("v2." + make_token(SECRET, "10.0.0.7:50061", DECODE, NOW_S, NONCE)[3:], "malformed"),
    ("v1.-5." + NONCE + "." + "0" * 64, "malformed"),
    ("v1.5." + "zz" * 16 + "." + "0" * 64, "malformed"),
    ("v1.5." + NONCE + "." + "0" * 10_000, "malformed"),                      # too long to parse
    (make_token(b"another secret, 32 bytes long!!!", "10.0.0.7:50061", DECODE, NOW_S, NONCE), "does not match"),
    (make_token(SECRET, "10.0.0.8:50061", DECODE, NOW_S, NONCE), "does not match"),             # another worker's
    (make_token(SECRET, "10.0.0.7:50061", "/pdserve.v1.Worker/GetLoad", NOW_S, NONCE), "does not match"),
    (make_token(SECRET, "10.0.0.7:50061", DECODE, NOW_S - FRESHNESS_S - 1, NONCE), "stale proof: made +61.0 s"),
    (make_token(SECRET, "10.0.0.7:50061", DECODE, NOW_S + FRESHNESS_S + 1, NONCE), "stale proof: made -61.0 s"),
])
def test_a_missing_malformed_foreign_or_stale_token_is_refused_and_says_why(offered, why):
    verdict = check(SECRET, WORKER, DECODE, offered, NOW_S)
    assert not verdict.accepted and why in verdict.why
    assert verdict.nonce == ""


def test_a_worker_without_an_advertised_address_accepts_nothing():
    token = make_token(SECRET, "10.0.0.7:50061", DECODE, NOW_S, NONCE)
    assert not check(SECRET, frozenset(), DECODE, token, NOW_S).accepted


def test_a_nonce_is_accepted_once_within_its_freshness_and_forgotten_after():
    cache = ReplayCache()
    assert cache.first_use(NONCE, expires_at_s=NOW_S + 60, now_s=NOW_S) is True
    assert cache.first_use(NONCE, expires_at_s=NOW_S + 60, now_s=NOW_S + 59) is False
    assert cache.first_use("cd" * 16, expires_at_s=NOW_S + 130, now_s=NOW_S + 70) is True   # NONCE expired here
    assert len(cache) == 1


def test_a_full_replay_cache_drops_its_oldest_nonce_and_never_grows_past_capacity():
    cache = ReplayCache(capacity=3)
    for nonce in ("01", "02", "03", "04"):
        assert cache.first_use(nonce, expires_at_s=NOW_S + 60, now_s=NOW_S)
    assert len(cache) == 3
    assert cache.first_use("04", NOW_S + 60, NOW_S) is False
    assert cache.first_use("01", NOW_S + 60, NOW_S) is True    # dropped when full: only secret holders fill it
    with pytest.raises(ValueError, match="at least one nonce"):
        ReplayCache(capacity=0)

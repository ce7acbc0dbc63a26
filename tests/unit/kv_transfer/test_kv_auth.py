"""The KV plane's authentication decisions with plain values: proofs, who may use a transfer, the
secret file, and how launchers pass it (the exchange over sockets: test_kv_auth_sockets.py)."""

import logging
import os
import stat

import pytest

from kv_transfer.auth import (AuthFailed, Credentials, SecretFileError, Transcript, authorize, create_secret_file,
                              identity_problem, introduction, load_secret, proof, proof_matches,
                              warn_if_unauthenticated)
from launch.commands import worker_argv

SECRET = b"0123456789abcdef0123456789abcdef"
TRANSCRIPT = Transcript("decode-0", "sha256:aa", "11" * 32, "prefill-0", "sha256:aa", "22" * 32)


def test_a_proof_is_an_hmac_sha256_of_role_and_transcript_that_only_the_same_inputs_reproduce():
    consumer = proof(SECRET, "consumer", TRANSCRIPT)
    assert len(consumer) == 64 and int(consumer, 16) >= 0
    assert proof(SECRET, "consumer", TRANSCRIPT) == consumer
    assert proof(SECRET, "producer", TRANSCRIPT) != consumer          # no reflection of one role's proof
    assert proof(b"another secret, 32 bytes long!!!", "consumer", TRANSCRIPT) != consumer
    for field, value in (("consumer_nonce", "33" * 32), ("producer_nonce", "44" * 32),
                         ("consumer_identity", "decode-1"), ("producer_fingerprint", "sha256:bb")):
        changed = Transcript(**{**TRANSCRIPT.__dict__, field: value})
        assert proof(SECRET, "consumer", changed) != consumer, field


def test_proofs_are_checked_only_where_there_is_a_secret_and_never_match_when_empty_or_not_text():
    right = proof(SECRET, "consumer", TRANSCRIPT)
    assert proof_matches(SECRET, "consumer", TRANSCRIPT, right) is True
    tampered = right[:-1] + ("1" if right.endswith("0") else "0")
    assert proof_matches(SECRET, "consumer", TRANSCRIPT, tampered) is False
    assert proof_matches(SECRET, "consumer", TRANSCRIPT, "") is False
    assert proof_matches(SECRET, "consumer", TRANSCRIPT, None) is False
    assert proof_matches(SECRET, "consumer", TRANSCRIPT, ["not", "text"]) is False
    assert proof(None, "consumer", TRANSCRIPT) == ""
    assert proof_matches(None, "consumer", TRANSCRIPT, "anything") is True   # unauthenticated side: no check


def test_a_transfer_is_usable_by_its_consumer_by_anyone_while_unbound_and_by_the_producers_own_worker():
    assert authorize(None, "decode-1", owner="prefill-0") is True
    assert authorize("decode-1", "decode-1", owner="prefill-0") is True
    assert authorize("decode-1", "decode-2", owner="prefill-0") is False
    assert authorize("decode-1", "prefill-0", owner="prefill-0") is True     # the router's abort through it


def test_an_introduction_with_a_bad_identity_fingerprint_or_nonce_is_refused():
    good = {"op": "AUTH", "identity": "decode-0", "fingerprint": "sha256:aa", "nonce": "ab" * 32}
    assert introduction(good) == ("decode-0", "sha256:aa", "ab" * 32)
    for bad in ({"identity": ""}, {"identity": "x" * 129}, {"identity": 7}, {"identity": "a\nb"},
                {"fingerprint": None}, {"fingerprint": "f" * 257},
                {"nonce": "ab" * 31}, {"nonce": "zz" * 32}, {"nonce": None}):
        with pytest.raises(AuthFailed):
            introduction({**good, **bad})


def test_credentials_check_their_identity_and_secret_length():
    assert Credentials("decode-0").authenticated is False
    assert Credentials("decode-0", SECRET).authenticated is True
    assert identity_problem("decode-0") == ""
    with pytest.raises(ValueError, match="1 to 128 characters"):
        Credentials("")
    with pytest.raises(SecretFileError, match="at least 16 bytes"):
        Credentials("decode-0", b"short")


def test_a_created_secret_file_is_0600_random_and_replaced_on_the_next_cluster(tmp_path):
    path = create_secret_file(tmp_path / "cluster-secret")
    first = load_secret(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert len(first) == 64 and bytes.fromhex(first.decode())
    assert load_secret(create_secret_file(path)) != first
    assert Credentials.from_file(path, "w").secret == load_secret(path)
    assert Credentials.from_file("", "w").secret is None


def test_a_missing_or_short_secret_file_stops_the_worker_and_a_readable_one_warns(tmp_path, caplog):
    with pytest.raises(SecretFileError, match="cannot read the cluster secret file"):
        load_secret(tmp_path / "nope")
    short = tmp_path / "short"
    short.write_text("abc\n")
    with pytest.raises(SecretFileError, match="holds 3 bytes"):
        load_secret(short)
    shared = tmp_path / "shared"
    shared.write_bytes(SECRET)
    shared.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="kv_transfer.auth"):
        assert load_secret(shared) == SECRET
    assert "may be read by other users (mode 644): chmod 600 it" in caplog.text


def test_an_unauthenticated_plane_is_warned_about_once_per_side(caplog):
    with caplog.at_level(logging.WARNING, logger="kv_transfer.auth"):
        for _ in range(3):
            warn_if_unauthenticated(Credentials("w-1"), "test side")
        warn_if_unauthenticated(Credentials("w-1", SECRET), "test side with a secret")
    assert [r.message.count("the KV plane is unauthenticated") for r in caplog.records] == [1]


def test_a_worker_command_line_carries_the_secret_files_path_never_the_secret(tmp_path):
    from pdserve.engine import EngineSettings

    path = create_secret_file(tmp_path / "cluster-secret")
    common = dict(role="decode", worker_id="decode-0", redis_url="redis://x", cluster="c", transport="shm",
                  cpu_cores="", lease_s=30.0, ttl_s=3.0, engine=EngineSettings(model="m"))
    argv = worker_argv(**common, cluster_secret_file=str(path))
    assert argv[argv.index("--cluster-secret-file") + 1] == str(path)
    assert not any(load_secret(path).decode() in arg for arg in argv)
    assert "--cluster-secret-file" not in worker_argv(**common)


def test_the_worker_flag_defaults_to_the_file_the_environment_names(monkeypatch):
    from cli.main import build_parser

    monkeypatch.setenv("PDSERVE_CLUSTER_SECRET_FILE", "/run/secrets/kv")
    args = build_parser().parse_args(["worker", "--role", "decode", "--redis-url", "redis://x", "--model", "m"])
    assert args.cluster_secret_file == "/run/secrets/kv"

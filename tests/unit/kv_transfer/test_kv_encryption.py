"""KV encryption's decisions with plain values: which links `auto` encrypts, how two settings agree,
the session keys, and where a worker's setting is checked and carried (the exchange over real
sockets: test_kv_encryption_sockets.py)."""

from dataclasses import asdict

import pytest

from kv_transfer.auth import Credentials, Transcript
from kv_transfer.config import ConnectorConfig
from kv_transfer.encryption import (EncryptionMismatch, agree, derive_session_keys, effective_mode, is_cross_host,
                                    next_key, setting_problem)
from launch.commands import worker_argv

SECRET = b"0123456789abcdef0123456789abcdef"
C_NONCE, P_NONCE = "11" * 32, "22" * 32


@pytest.mark.parametrize("local, peer, crosses", [
    ("127.0.0.1", "127.0.0.1", False), ("10.0.0.5", "127.0.0.1", False), ("127.0.0.1", "127.8.9.10", False),
    ("::1", "::1", False), ("::ffff:127.0.0.1", "::ffff:127.0.0.1", False), ("10.0.0.5", "localhost", False),
    ("10.0.0.5", "10.0.0.5", False), ("::ffff:10.0.0.5", "10.0.0.5", False), ("fe80::1%eth0", "fe80::1", False),
    ("10.0.0.5", "10.0.0.6", True), ("10.0.0.5", "192.168.1.9", True), ("fd00::1", "fd00::2", True),
    ("10.0.0.5", "prefill-0.pdserve.svc", True),
])
def test_a_link_leaves_the_host_unless_the_peer_is_loopback_or_this_hosts_own_address(local, peer, crosses):
    assert is_cross_host(local, peer) is crosses


@pytest.mark.parametrize("consumer, producer, cross_host, sealed", [
    ("auto", "auto", True, True), ("auto", "auto", False, False),
    ("on", "auto", False, True), ("auto", "on", False, True), ("on", "on", False, True),
    ("off", "auto", True, False), ("auto", "off", True, False), ("off", "off", True, False),
])
def test_two_settings_agree_on_whether_a_connection_is_sealed(consumer, producer, cross_host, sealed):
    assert agree(consumer, producer, cross_host) is sealed


@pytest.mark.parametrize("consumer, producer", [("on", "off"), ("off", "on")])
def test_on_against_off_is_a_mismatch_naming_both_settings(consumer, producer):
    with pytest.raises(EncryptionMismatch, match=f"the consumer is set to '{consumer}' and the producer to "
                                                 f"'{producer}'; give both workers the same --kv-encryption"):
        agree(consumer, producer, cross_host=True)


def test_a_side_without_the_cluster_secret_asks_for_no_encryption():
    assert [effective_mode(m, True) for m in ("off", "auto", "on")] == ["off", "auto", "on"]
    assert [effective_mode(m, False) for m in ("off", "auto")] == ["off", "off"]
    assert Credentials("decode-0").effective_encryption == "off"
    assert Credentials("decode-0", SECRET).effective_encryption == "auto"


def test_session_keys_are_deterministic_separated_by_direction_and_bound_to_every_input():
    keys = derive_session_keys(SECRET, C_NONCE, P_NONCE, b"transcript")
    assert keys == derive_session_keys(SECRET, C_NONCE, P_NONCE, b"transcript")
    assert len(keys.consumer_to_producer) == len(keys.producer_to_consumer) == 32
    assert keys.consumer_to_producer != keys.producer_to_consumer
    assert keys.for_role("consumer") == (keys.consumer_to_producer, keys.producer_to_consumer)
    assert keys.for_role("producer") == (keys.producer_to_consumer, keys.consumer_to_producer)
    for other in (derive_session_keys(b"another secret, 32 bytes long!!!", C_NONCE, P_NONCE, b"transcript"),
                  derive_session_keys(SECRET, "33" * 32, P_NONCE, b"transcript"),
                  derive_session_keys(SECRET, C_NONCE, "44" * 32, b"transcript"),
                  derive_session_keys(SECRET, P_NONCE, C_NONCE, b"transcript"),
                  derive_session_keys(SECRET, C_NONCE, P_NONCE, b"another transcript")):
        assert {other.consumer_to_producer, other.producer_to_consumer}.isdisjoint(
            {keys.consumer_to_producer, keys.producer_to_consumer})
    assert "transcript" not in repr(keys) and keys.consumer_to_producer.hex() not in repr(keys)


def test_a_transcript_has_keys_only_when_sealed_and_signs_the_setting_and_the_decision():
    clear = Transcript("decode-0", "fp", C_NONCE, "prefill-0", "fp", P_NONCE, "auto", False)
    sealed = Transcript("decode-0", "fp", C_NONCE, "prefill-0", "fp", P_NONCE, "auto", True)
    assert clear.session_keys(SECRET) is None and sealed.session_keys(None) is None
    assert sealed.session_keys(SECRET) == sealed.session_keys(SECRET)
    downgraded = Transcript("decode-0", "fp", C_NONCE, "prefill-0", "fp", P_NONCE, "off", True)
    assert len({clear.signed_bytes("producer"), sealed.signed_bytes("producer"),
                downgraded.signed_bytes("producer")}) == 3


def test_a_direction_steps_to_a_new_key_that_does_not_lead_back():
    key = derive_session_keys(SECRET, C_NONCE, P_NONCE, b"t").consumer_to_producer
    assert next_key(key) == next_key(key) and next_key(key) != key and next_key(next_key(key)) not in (key, next_key(key))


@pytest.mark.parametrize("mode, transport, has_secret, why", [
    ("auto", "torch", False, ""), ("on", "tcp", True, ""), ("on", "shm", None, ""), ("off", "torch", False, ""),
    ("yes", "tcp", True, "kv_encryption must be one of off, auto, on, not 'yes'"),
    ("on", "torch", True, "kv_encryption=on cannot hold with the torch transport"),
    ("on", "tcp", False, "kv_encryption=on needs the cluster secret (--cluster-secret-file)"),
])
def test_a_worker_setting_is_checked_with_a_reason_that_says_how_to_fix_it(mode, transport, has_secret, why):
    problem = setting_problem(mode, transport, has_secret)
    assert problem.startswith(why) and bool(problem) == bool(why)


def test_the_connector_config_and_credentials_refuse_settings_that_cannot_hold():
    assert ConnectorConfig(kv_encryption="on", cluster_secret_file="/run/secret").kv_encryption == "on"
    assert ConnectorConfig().kv_encryption == "auto"
    carried = asdict(ConnectorConfig(kv_encryption="off"))   # what the worker hands vLLM's engine processes
    assert ConnectorConfig.from_extra(carried, environ={}).kv_encryption == "off"
    with pytest.raises(ValueError, match="cannot hold with the torch transport"):
        ConnectorConfig(transport="torch", kv_encryption="on", cluster_secret_file="/run/secret")
    with pytest.raises(ValueError, match="needs the cluster secret"):
        ConnectorConfig(kv_encryption="on")
    with pytest.raises(ValueError, match="needs the cluster secret"):
        Credentials("decode-0", None, "on")
    with pytest.raises(ValueError, match="must be one of off, auto, on"):
        Credentials("decode-0", SECRET, "always")


def test_a_worker_command_line_carries_the_encryption_setting():
    from pdserve.engine import EngineSettings

    argv = worker_argv(role="decode", worker_id="d0", redis_url="redis://127.0.0.1:1/0", cluster="c",
                       transport="tcp", cpu_cores="", lease_s=30.0, ttl_s=3.0,
                       engine=EngineSettings(model="models/tiny"), kv_encryption="on")
    assert argv[argv.index("--kv-encryption") + 1] == "on"


def test_a_worker_config_refuses_settings_that_cannot_hold_when_it_is_built():
    from pdserve.engine import EngineSettings
    from pdserve.worker.config import WorkerConfig

    def config(**fields):
        return WorkerConfig(role="decode", engine=EngineSettings(model="models/tiny"), redis_url="redis://h:1/0",
                            **fields)

    assert config(kv_encryption="on", cluster_secret_file="/run/secret").kv_encryption == "on"
    assert config().kv_encryption == "auto"
    with pytest.raises(ValueError, match="needs the cluster secret"):
        config(kv_encryption="on")
    with pytest.raises(ValueError, match="cannot hold with the torch transport"):
        config(kv_encryption="on", cluster_secret_file="/run/secret", transport="torch")

"""The model fingerprint: the same checkpoint anywhere matches, different weights never do."""

import shutil

import pytest

from kv_transfer.fingerprint import SAMPLE_BYTES, FingerprintError, model_fingerprint


def test_a_byte_identical_checkpoint_at_another_path_and_name_has_the_same_fingerprint(tmp_path, make_checkpoint):
    original = make_checkpoint(tmp_path / "a" / "llama")
    copy = tmp_path / "mnt" / "models" / "llama-renamed"
    shutil.copytree(original, copy)
    assert model_fingerprint(original) == model_fingerprint(copy)
    assert model_fingerprint(original).startswith("sha256:") and len(model_fingerprint(original)) == 7 + 64


def test_only_the_path_recorded_in_config_json_may_differ(tmp_path, make_checkpoint):
    first = make_checkpoint(tmp_path / "first" / "m")
    second = make_checkpoint(tmp_path / "second" / "m")  # _name_or_path differs, nothing else
    assert model_fingerprint(first) == model_fingerprint(second)


def test_a_different_checkpoint_with_the_same_directory_name_has_another_fingerprint(tmp_path, make_checkpoint):
    assert model_fingerprint(make_checkpoint(tmp_path / "x" / "llama", seed=0)) != \
        model_fingerprint(make_checkpoint(tmp_path / "y" / "llama", seed=1))


def test_changing_the_last_element_of_one_tensor_changes_the_fingerprint(tmp_path, make_checkpoint):
    original = make_checkpoint(tmp_path / "x" / "llama")
    tuned = tmp_path / "y" / "llama"
    shutil.copytree(original, tuned)
    shard = tuned / "model-00002-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01  # the last byte of lm_head: inside its sampled tail
    shard.write_bytes(bytes(data))
    assert SAMPLE_BYTES < 256 * 64 * 4  # lm_head is longer than one sample
    assert model_fingerprint(original) != model_fingerprint(tuned)


def test_a_config_change_changes_the_fingerprint(tmp_path, make_checkpoint):
    assert model_fingerprint(make_checkpoint(tmp_path / "x" / "m")) != \
        model_fingerprint(make_checkpoint(tmp_path / "y" / "m", config_extra={"rope_theta": 500000.0}))


def test_checkpoints_without_safetensors_are_fingerprinted_by_their_weight_files(tmp_path):
    for name, payload in (("a", b"\x01" * 10000), ("b", b"\x01" * 9999 + b"\x02")):
        directory = tmp_path / name / "m"
        directory.mkdir(parents=True)
        (directory / "config.json").write_text('{"hidden_size": 64}')
        (directory / "pytorch_model.bin").write_bytes(payload)
    assert model_fingerprint(tmp_path / "a" / "m") != model_fingerprint(tmp_path / "b" / "m")


def test_what_cannot_be_fingerprinted_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(FingerprintError, match="holds no weight files"):
        model_fingerprint(tmp_path / "empty")
    with pytest.raises(FingerprintError, match="neither a directory nor in the local Hugging Face cache"):
        model_fingerprint(tmp_path / "does-not-exist")

"""build_model / `pdserve make-model`: byte-identical rebuilds, the skip stamp, and refusing foreign folders."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from cli.main import main
from cli.commands.make_model import DelayedProgress
from pdserve.make_model import MODEL_FILES, STAMP_FILE, build_model, is_up_to_date

ALL_FILES = (*MODEL_FILES, STAMP_FILE)
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model("tiny", tmp_path_factory.mktemp("tiny") / "model")


def _bytes_by_name(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def test_build_writes_exactly_the_checkpoint_files_and_the_stamp(tiny_dir: Path) -> None:
    assert sorted(path.name for path in tiny_dir.iterdir()) == sorted(ALL_FILES)


def test_rebuild_in_a_fresh_process_is_byte_identical(tiny_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "again"
    code = f"from pdserve.make_model import build_model; build_model('tiny', {str(other)!r})"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=120)
    first, second = _bytes_by_name(tiny_dir), _bytes_by_name(other)
    assert sorted(second) == sorted(ALL_FILES)
    assert [name for name in first if first[name] != second[name]] == []


def test_second_build_of_the_same_recipe_rewrites_nothing(tiny_dir: Path) -> None:
    mtimes_ns = {name: (tiny_dir / name).stat().st_mtime_ns for name in ALL_FILES}
    assert is_up_to_date("tiny", tiny_dir)
    assert build_model("tiny", tiny_dir) == tiny_dir
    assert {name: (tiny_dir / name).stat().st_mtime_ns for name in ALL_FILES} == mtimes_ns


def test_edited_file_makes_the_build_stale_and_a_rebuild_restores_it(tmp_path: Path) -> None:
    out = build_model("tiny", tmp_path / "model")
    original = (out / "tokenizer_config.json").read_bytes()
    (out / "tokenizer_config.json").write_text("{}", encoding="utf-8")
    assert not is_up_to_date("tiny", out)
    build_model("tiny", out)
    assert (out / "tokenizer_config.json").read_bytes() == original
    assert is_up_to_date("tiny", out)


def test_other_seed_changes_the_weights_but_not_the_tokenizer(tiny_dir: Path, tmp_path: Path) -> None:
    assert not is_up_to_date("tiny", tiny_dir, seed=1)
    seed1 = build_model("tiny", tmp_path / "seed1", seed=1)
    assert (seed1 / "model.safetensors").read_bytes() != (tiny_dir / "model.safetensors").read_bytes()
    assert (seed1 / "tokenizer.json").read_bytes() == (tiny_dir / "tokenizer.json").read_bytes()
    assert json.loads((seed1 / STAMP_FILE).read_text())["recipe"]["seed"] == 1


def test_folder_with_other_files_is_refused_and_left_alone(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(ValueError, match=r"not a pdserve checkpoint \(notes.txt\): pass a new or empty"):
        build_model("tiny", tmp_path)
    assert [path.name for path in tmp_path.iterdir()] == ["notes.txt"]


def test_unknown_size_and_negative_seed_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown model size 'huge': choose one of tiny, bench"):
        build_model("huge", tmp_path)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed must be >= 0, got -1"):
        build_model("tiny", tmp_path, seed=-1)


def test_cli_builds_then_reports_nothing_to_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli"
    assert main(["make-model", "--size", "tiny", "--out", str(out)]) == 0
    assert "3.4M parameters, 4 layers, vocab 2048, built in" in capsys.readouterr().out
    assert main(["make-model", "--size", "tiny", "--out", str(out)]) == 0
    assert f"{out} already holds the tiny model (seed 0); nothing to do" in capsys.readouterr().out


def test_cli_refusal_exits_2_with_the_fix_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "data.bin").write_bytes(b"x")
    assert main(["make-model", "--out", str(tmp_path)]) == 2
    assert "pass a new or empty directory" in capsys.readouterr().err


def _run_with_progress(delay_s: float, work_s: float) -> str:
    output = io.StringIO()
    with DelayedProgress(Console(file=output, force_terminal=True, width=80), delay_s=delay_s) as progress:
        task = progress.add_task("drawing weights", total=2)
        time.sleep(work_s)
        progress.advance(task, 2)
    return output.getvalue()


def test_progress_bar_appears_only_when_the_work_outlasts_the_delay() -> None:
    assert "drawing weights" not in _run_with_progress(delay_s=5.0, work_s=0.0)
    assert "drawing weights" in _run_with_progress(delay_s=0.05, work_s=0.3)

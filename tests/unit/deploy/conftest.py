"""Render deploy/k8s with the real Kustomize (kubectl's built-in, or the standalone binary).

Tests here check the objects Kubernetes would receive, never the YAML sources. They skip only
when no renderer is installed; everything else they need comes with `pip install -e .[dev,k8s]`.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
K8S = REPO / "deploy" / "k8s"
OVERLAYS = ("cpu", "gpu", "dev", "hybrid")
NO_RENDERER = (
    "no Kustomize renderer: `pip install -e .[k8s]` (brings kubectl, whose `kubectl kustomize` "
    "renders deploy/k8s), or put kubectl or the standalone `kustomize` on PATH"
)


def _which(tool: str) -> str | None:
    """The tool from this interpreter's environment (`pip install .[k8s]`), else from PATH."""
    return shutil.which(tool, path=str(Path(sys.executable).parent)) or shutil.which(tool)


def renderer_command() -> list[str] | None:
    """`kubectl kustomize` if kubectl is installed, else standalone `kustomize build`."""
    if kubectl := _which("kubectl"):
        return [kubectl, "kustomize"]
    if kustomize := _which("kustomize"):
        return [kustomize, "build"]
    return None


@functools.cache
def _render_text(kustomization: str) -> str:
    command = renderer_command()
    if command is None:
        pytest.skip(NO_RENDERER)
    done = subprocess.run(
        [*command, str(K8S / kustomization)], capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(command)} {kustomization} failed:\n{done.stderr}")
    return done.stdout


def render(kustomization: str) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize deploy/k8s/<kustomization>` prints (a fresh copy)."""
    return [doc for doc in yaml.safe_load_all(_render_text(kustomization)) if doc]


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def pod_templates(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Pod template (metadata + spec) of every workload, by workload name."""
    templates = {}
    for o in objects:
        if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            templates[o["metadata"]["name"]] = o["spec"]["template"]
    return templates


def all_containers(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod_spec.get("initContainers", []), *pod_spec["containers"]]


class K8sHelpers:
    """What tests use, handed out by the `k8s` fixture (fixtures work in every import mode)."""

    repo = REPO
    render = staticmethod(render)
    by_kind = staticmethod(by_kind)
    pod_templates = staticmethod(pod_templates)
    all_containers = staticmethod(all_containers)


@pytest.fixture
def k8s() -> type[K8sHelpers]:
    return K8sHelpers


@pytest.fixture(params=OVERLAYS)
def overlay(request) -> tuple[str, list[dict[str, Any]]]:
    """(name, rendered objects) for each overlay."""
    return request.param, render(f"overlays/{request.param}")

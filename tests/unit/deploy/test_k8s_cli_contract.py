"""The manifests start pdserve with flags the real `pdserve` CLI accepts.

Each pdserve container's args, with $(VAR) filled from its ConfigMap and env the way the kubelet
fills them, go through `pdserve.cli.build_parser()`: a renamed or missing flag fails here rather
than as a CrashLoopBackOff in someone's cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re

import pytest

from pdserve.cli import build_parser

POD_VALUES = {"status.podIP": "10.0.0.7", "metadata.namespace": "pdserve"}


def expanded_args(container, config_maps) -> list[str]:
    values = {}
    for source in container.get("envFrom", []):
        values |= config_maps[source["configMapRef"]["name"]]["data"]
    for env in container.get("env", []):
        values[env["name"]] = env.get("value") or POD_VALUES[env["valueFrom"]["fieldRef"]["fieldPath"]]
    return [re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], arg) for arg in container["args"]]


def subcommands(parser: argparse.ArgumentParser) -> set[str]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(action.choices)


def pdserve_containers(k8s, objects):
    for name, template in k8s.pod_templates(objects).items():
        for container in template["spec"]["containers"]:
            if container["image"].startswith("pdserve"):
                yield name, container


@pytest.mark.parametrize("component", ["router", "prefill", "decode", "planner"])
def test_container_args_parse_with_the_pdserve_cli(k8s, overlay, component):
    _, objects = overlay
    config_maps = k8s.by_kind(objects, "ConfigMap")
    (container,) = [c for n, c in pdserve_containers(k8s, objects) if n == f"pdserve-{component}"]
    args = expanded_args(container, config_maps)
    parser = build_parser()
    if args[0] not in subcommands(parser):
        pytest.skip(f"`pdserve {args[0]}` is not built yet, so its flags cannot be checked")

    errors = io.StringIO()
    with contextlib.redirect_stderr(errors), contextlib.suppress(SystemExit):
        parsed = parser.parse_args(args)
        errors.write("OK")
    assert errors.getvalue() == "OK", f"pdserve {' '.join(args)}\n{errors.getvalue()}"
    assert callable(parsed.func)


def test_listening_processes_bind_every_interface_and_workers_advertise_the_pod_ip(k8s, overlay):
    _, objects = overlay
    config_maps = k8s.by_kind(objects, "ConfigMap")
    containers = dict(pdserve_containers(k8s, objects))

    for name in ("pdserve-router", "pdserve-prefill", "pdserve-decode"):
        assert "--host=0.0.0.0" in expanded_args(containers[name], config_maps), name
    for name in ("pdserve-prefill", "pdserve-decode"):
        env = {e["name"]: e for e in containers[name]["env"]}
        assert env["PDSERVE_ADVERTISE_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}


def test_make_model_job_args_parse_with_the_pdserve_cli(k8s):
    (container,) = k8s.pod_templates(k8s.render("model"))["pdserve-make-model"]["spec"]["containers"]
    parser = build_parser()
    if container["args"][0] not in subcommands(parser):
        pytest.skip("`pdserve make-model` is not built yet, so its flags cannot be checked")

    parsed = parser.parse_args(container["args"])
    assert callable(parsed.func)
    assert "--out=/models/tiny" in container["args"]

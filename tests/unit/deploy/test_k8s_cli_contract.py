"""The manifests start pdserve with flags the real `pdserve` CLI accepts.

Each pdserve container's args, with $(VAR) filled from its ConfigMap and env the way the kubelet
fills them, go through `cli.main.build_parser()`: a renamed or missing flag fails here rather
than as a CrashLoopBackOff in someone's cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re

import pytest

from cli.main import build_parser

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


def parsed_args(container, config_maps) -> argparse.Namespace:
    return build_parser().parse_args(expanded_args(container, config_maps))


def subcommand_options(command: str) -> set[str]:
    (action,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return {option for a in action.choices[command]._actions for option in a.option_strings}


def engine_options() -> set[str]:
    """The flags every engine-starting command shares (`cli.commands.engine_options`)."""
    from cli.commands.engine_options import add_engine_options

    parser = argparse.ArgumentParser()
    add_engine_options(parser)
    return {option for a in parser._actions for option in a.option_strings} - {"-h", "--help"}


def option_for(key: str) -> str:
    """ConfigMap key -> the flag it feeds: PDSERVE_MAX_MODEL_LEN -> --max-model-len."""
    return "--" + key.removeprefix("PDSERVE_").lower().replace("_", "-")


def test_every_engine_setting_of_the_config_map_reaches_every_container_whose_cli_takes_it(k8s, overlay):
    """An engine value the router or a worker does not get is silently its default: the router
    would check prompts against another max model length than the workers enforce."""
    _, objects = overlay
    (config_map,) = k8s.by_kind(objects, "ConfigMap").values()
    engine_keys = {key for key in config_map["data"] if option_for(key) in engine_options()}
    assert {"PDSERVE_MODEL", "PDSERVE_MAX_MODEL_LEN", "PDSERVE_BLOCK_SIZE", "PDSERVE_KV_CACHE_MB"} <= engine_keys

    reached: dict[str, set[str]] = {key: set() for key in engine_keys}
    for name, container in pdserve_containers(k8s, objects):
        parsed = parsed_args(container, {config_map["metadata"]["name"]: config_map})
        if parsed.command == "planner":
            # its engine flags describe the workers its *local* actuator would start; unused here
            assert parsed.actuator == "kubernetes"
            continue
        for key in sorted(engine_keys):
            option = option_for(key)
            if option not in subcommand_options(parsed.command):
                continue
            assert f"{option}=$({key})" in container["args"], f"{name} runs without {option}=$({key})"
            value = getattr(parsed, option[2:].replace("-", "_"))
            assert str(value) == config_map["data"][key], f"{name}: {option} is {value}"
            reached[key].add(name)
    assert reached["PDSERVE_MAX_MODEL_LEN"] == {"pdserve-router", "pdserve-prefill", "pdserve-decode"}
    assert reached["PDSERVE_MODEL"] == {"pdserve-router", "pdserve-prefill", "pdserve-decode"}
    assert all(reached[key] == {"pdserve-prefill", "pdserve-decode"} for key in engine_keys
               - {"PDSERVE_MAX_MODEL_LEN", "PDSERVE_MODEL"}), reached


MARGIN_S = 10  # after the drain: the gRPC server's last second, the engine's shutdown, process exit


def prestop_sleep_s(container) -> int:
    command = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    return int(command[1]) if command[:1] == ["sleep"] else 0


def test_termination_grace_covers_prestop_and_the_drain_for_every_draining_role(k8s, overlay):
    """Past terminationGracePeriodSeconds the kubelet SIGKILLs: the drain a process is told to do
    must end before that, or the requests it promised to finish are cut off anyway."""
    _, objects = overlay
    config_maps = k8s.by_kind(objects, "ConfigMap")
    draining = set()
    for name, container in pdserve_containers(k8s, objects):
        if "--drain-timeout-s" not in subcommand_options(container["args"][0]):
            continue
        drain_s = parsed_args(container, config_maps).drain_timeout_s
        grace_s = k8s.by_kind(objects, "Deployment")[name]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert any(arg.startswith("--drain-timeout-s=") for arg in container["args"]), f"{name}: default drain"
        assert grace_s >= prestop_sleep_s(container) + drain_s + MARGIN_S, (
            f"{name}: grace {grace_s} s < preStop {prestop_sleep_s(container)} s + drain {drain_s:g} s + {MARGIN_S} s")
        draining.add(name)
    assert draining == {"pdserve-router", "pdserve-prefill", "pdserve-decode"}

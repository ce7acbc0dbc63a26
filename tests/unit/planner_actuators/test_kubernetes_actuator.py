"""KubernetesActuator against the scale-API stand-in in conftest.py (no real API server here)."""

from __future__ import annotations

import argparse
import socket

import pytest
from kubernetes import client as k8s_client

from planner.actuators.base import Actuator
from planner.actuators.kubernetes import (
    KubernetesActuator,
    KubernetesActuatorConfig,
    KubernetesScaleError,
    add_cli_arguments,
    config_from_cli_args,
)

PREFILL_PATH = "/apis/apps/v1/namespaces/pdserve/deployments/pdserve-prefill/scale"
DECODE_PATH = "/apis/apps/v1/namespaces/pdserve/deployments/pdserve-decode/scale"


def actuator_for(url: str, config: KubernetesActuatorConfig | None = None) -> KubernetesActuator:
    configuration = k8s_client.Configuration(
        host=url, api_key={"BearerToken": "planner-token"}, api_key_prefix={"BearerToken": "Bearer"}
    )
    configuration.retries = 0
    apps = k8s_client.AppsV1Api(k8s_client.ApiClient(configuration))
    return KubernetesActuator(config or KubernetesActuatorConfig(), apps)


def test_current_reads_the_scale_of_both_pool_deployments(scale_api):
    actuator = actuator_for(scale_api.url)

    assert actuator.current() == {"prefill": 2, "decode": 3}

    assert [(r.method, r.path, r.body) for r in scale_api.received] == [
        ("GET", PREFILL_PATH, None),
        ("GET", DECODE_PATH, None),
    ]
    assert {r.authorization for r in scale_api.received} == {"Bearer planner-token"}


def test_scale_sends_one_merge_patch_of_spec_replicas_to_that_role_only(scale_api):
    actuator = actuator_for(scale_api.url)

    actuator.scale("decode", 5)

    (patch,) = scale_api.received
    assert patch.method == "PATCH"
    assert patch.path == DECODE_PATH
    assert patch.content_type == "application/merge-patch+json"
    assert patch.body == {"spec": {"replicas": 5}}
    assert patch.query == {"fieldManager": "pdserve-planner"}
    assert scale_api.replicas == {("pdserve", "pdserve-prefill"): 2, ("pdserve", "pdserve-decode"): 5}
    assert actuator.current() == {"prefill": 2, "decode": 5}


def test_scale_to_zero_reads_back_as_zero_though_the_server_omits_the_field(scale_api):
    actuator = actuator_for(scale_api.url)

    actuator.scale("prefill", 0)

    assert scale_api.received[0].body == {"spec": {"replicas": 0}}
    assert actuator.current() == {"prefill": 0, "decode": 3}


def test_configured_namespace_and_deployment_names_are_the_ones_requested(scale_api):
    scale_api.replicas = {("serving", "llama-p"): 1, ("serving", "llama-d"): 4}
    config = KubernetesActuatorConfig(
        namespace="serving", prefill_deployment="llama-p", decode_deployment="llama-d"
    )
    actuator = actuator_for(scale_api.url, config)

    assert actuator.current() == {"prefill": 1, "decode": 4}
    actuator.scale("prefill", 2)

    assert [r.path for r in scale_api.received] == [
        "/apis/apps/v1/namespaces/serving/deployments/llama-p/scale",
        "/apis/apps/v1/namespaces/serving/deployments/llama-d/scale",
        "/apis/apps/v1/namespaces/serving/deployments/llama-p/scale",
    ]
    assert scale_api.replicas[("serving", "llama-p")] == 2


def test_forbidden_names_the_rbac_to_fix(scale_api):
    scale_api.forbidden = {"pdserve-decode"}
    actuator = actuator_for(scale_api.url)

    with pytest.raises(KubernetesScaleError, match=r"forbidden to patch deployments/pdserve-decode/scale"
                       r" in namespace pdserve.*planner-rbac\.yaml"):
        actuator.scale("decode", 2)
    assert scale_api.replicas[("pdserve", "pdserve-decode")] == 3


def test_missing_deployment_names_the_flags_to_check(scale_api):
    del scale_api.replicas[("pdserve", "pdserve-prefill")]
    actuator = actuator_for(scale_api.url)

    with pytest.raises(KubernetesScaleError, match=r"no Deployment for the prefill pool.*"
                       r"--k8s-namespace and --k8s-prefill-deployment"):
        actuator.current()


def test_unreachable_api_server_raises_a_scale_error():
    with socket.socket() as probe:  # a port nothing listens on once this closes
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    actuator = actuator_for(f"http://127.0.0.1:{port}")

    with pytest.raises(KubernetesScaleError, match="cannot reach the Kubernetes API server to get"):
        actuator.current()


@pytest.mark.parametrize(
    ("role", "replicas", "message"),
    [
        ("router", 1, "role must be one of"),
        ("decode", -1, "must be an int >= 0, got -1"),
        ("decode", 2.0, "must be an int >= 0, got 2.0"),
        ("decode", True, "must be an int >= 0, got True"),
    ],
)
def test_invalid_scale_requests_are_refused_before_any_call(scale_api, role, replicas, message):
    actuator = actuator_for(scale_api.url)

    with pytest.raises(ValueError, match=message):
        actuator.scale(role, replicas)
    assert scale_api.received == []


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"namespace": "PdServe"}, "not a Kubernetes namespace name"),
        ({"decode_deployment": "decode_pool"}, "decode_deployment 'decode_pool' is not a Deployment name"),
        ({"decode_deployment": "pdserve-prefill"}, "each pool needs its own Deployment"),
        ({"read_timeout_s": 0.0}, "timeouts must be > 0 s"),
    ],
)
def test_config_rejects_what_kubernetes_would_reject(fields, message):
    with pytest.raises(ValueError, match=message):
        KubernetesActuatorConfig(**fields)


def test_actuator_satisfies_the_planner_protocol(scale_api):
    assert isinstance(actuator_for(scale_api.url), Actuator)


def test_cli_flags_build_the_config_and_default_to_deploy_k8s_names():
    parser = argparse.ArgumentParser()
    add_cli_arguments(parser)

    defaults = config_from_cli_args(parser.parse_args(["--kubeconfig=/k"]))
    assert defaults == KubernetesActuatorConfig(
        namespace="pdserve", prefill_deployment="pdserve-prefill", decode_deployment="pdserve-decode",
        kubeconfig="/k",
    )
    args = parser.parse_args(["--k8s-namespace=team-a", "--k8s-decode-deployment=big-decode", "--kubeconfig=/k"])
    assert config_from_cli_args(args) == KubernetesActuatorConfig(
        namespace="team-a", prefill_deployment="pdserve-prefill", decode_deployment="big-decode",
        kubeconfig="/k",
    )


def write_kubeconfig(path, server: str, token: str) -> None:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: standin\n"
        f"clusters:\n- name: standin\n  cluster:\n    server: {server}\n"
        f"users:\n- name: planner\n  user:\n    token: {token}\n"
        "contexts:\n- name: standin\n  context:\n    cluster: standin\n    user: planner\n"
    )


def test_connect_outside_a_cluster_uses_the_kubeconfig(scale_api, tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    write_kubeconfig(tmp_path / "config", scale_api.url, "from-kubeconfig")

    actuator = KubernetesActuator.connect(KubernetesActuatorConfig(kubeconfig=str(tmp_path / "config")))

    assert actuator.current() == {"prefill": 2, "decode": 3}
    assert {r.authorization for r in scale_api.received} == {"Bearer from-kubeconfig"}


def test_connect_without_credentials_says_how_to_provide_them(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    with pytest.raises(KubernetesScaleError, match="no Kubernetes credentials: run the planner in the cluster"):
        KubernetesActuator.connect(KubernetesActuatorConfig(kubeconfig=str(tmp_path / "missing")))

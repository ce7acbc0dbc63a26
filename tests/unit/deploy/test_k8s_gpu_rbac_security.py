"""Who gets a GPU, what the planner may do, and that every pod passes Pod Security "restricted"."""

from __future__ import annotations

import argparse

import pytest

from planner.actuators.kubernetes import add_cli_arguments, config_from_cli_args

GPU = "nvidia.com/gpu"
# Volume types the "restricted" Pod Security Standard allows.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}


def gpu_by_container(k8s, objects) -> dict[str, dict[str, str]]:
    found = {}
    for name, template in k8s.pod_templates(objects).items():
        for container in k8s.all_containers(template["spec"]):
            resources = container.get("resources", {})
            found[f"{name}/{container['name']}"] = {
                part: resources.get(part, {}).get(GPU) for part in ("requests", "limits")
            }
    return found


@pytest.mark.parametrize("overlay_name", ["cpu", "dev"])
def test_cpu_overlays_ask_for_no_gpu_anywhere(k8s, overlay_name):
    found = gpu_by_container(k8s, k8s.render(f"overlays/{overlay_name}"))
    none = {"requests": None, "limits": None}

    assert found == {
        "pdserve-prefill/worker": none,
        "pdserve-decode/worker": none,
        "pdserve-router/router": none,
        "pdserve-planner/planner": none,
        "pdserve-redis/redis": none,
    }


def test_gpu_overlay_gives_one_gpu_to_each_worker_and_none_to_the_rest(k8s):
    found = gpu_by_container(k8s, k8s.render("overlays/gpu"))
    one = {"requests": "1", "limits": "1"}
    none = {"requests": None, "limits": None}

    assert found == {
        "pdserve-prefill/worker": one,
        "pdserve-decode/worker": one,
        "pdserve-router/router": none,
        "pdserve-planner/planner": none,
        "pdserve-redis/redis": none,
    }


def test_gpu_workers_tolerate_gpu_taints_and_roll_without_a_spare_gpu(k8s):
    deployments = k8s.by_kind(k8s.render("overlays/gpu"), "Deployment")
    for role in ("prefill", "decode"):
        spec = deployments[f"pdserve-{role}"]["spec"]
        assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
        assert spec["template"]["spec"]["tolerations"] == [
            {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}
        ]
    assert "tolerations" not in deployments["pdserve-router"]["spec"]["template"]["spec"]


def test_pdserve_containers_run_the_image_of_their_overlay(k8s, overlay):
    name, objects = overlay
    images = {
        f"{n}/{c['name']}": c["image"]
        for n, t in k8s.pod_templates(objects).items() for c in t["spec"]["containers"]
    }
    tag = {"cpu": "pdserve:cpu", "gpu": "pdserve:cuda", "dev": "pdserve:cpu", "hybrid": "pdserve:cpu"}[name]

    assert images == {
        "pdserve-router/router": tag, "pdserve-prefill/worker": tag, "pdserve-decode/worker": tag,
        "pdserve-planner/planner": tag, "pdserve-redis/redis": "redis:7.4-alpine",
    }


def test_planner_role_grants_only_scale_of_the_two_pool_deployments(k8s, overlay):
    _, objects = overlay

    (role,) = k8s.by_kind(objects, "Role").values()
    assert role["rules"] == [{
        "apiGroups": ["apps"],
        "resources": ["deployments/scale"],
        "resourceNames": ["pdserve-prefill", "pdserve-decode"],
        "verbs": ["get", "patch"],
    }]
    assert set(role["rules"][0]["resourceNames"]) <= set(k8s.by_kind(objects, "Deployment"))
    assert k8s.by_kind(objects, "ClusterRole") == {}
    assert k8s.by_kind(objects, "ClusterRoleBinding") == {}


def test_only_the_planner_pod_runs_as_the_bound_service_account_with_a_token(k8s, overlay):
    _, objects = overlay
    (binding,) = k8s.by_kind(objects, "RoleBinding").values()
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "pdserve-planner"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "pdserve-planner",
                                    "namespace": "pdserve"}]

    with_token = {
        name: t["spec"].get("serviceAccountName")
        for name, t in k8s.pod_templates(objects).items()
        if t["spec"].get("automountServiceAccountToken", True)
    }
    assert with_token == {"pdserve-planner": "pdserve-planner"}


def test_planner_flags_name_exactly_the_deployments_its_role_may_scale(k8s, overlay):
    _, objects = overlay
    planner = k8s.by_kind(objects, "Deployment")["pdserve-planner"]["spec"]["template"]["spec"]
    (container,) = planner["containers"]
    parser = argparse.ArgumentParser()
    add_cli_arguments(parser)
    args = [a.replace("$(POD_NAMESPACE)", "pdserve") for a in container["args"]]
    known, _ = parser.parse_known_args(args)
    config = config_from_cli_args(known)

    (role,) = k8s.by_kind(objects, "Role").values()
    assert "--actuator=kubernetes" in container["args"]
    assert [config.prefill_deployment, config.decode_deployment] == role["rules"][0]["resourceNames"]
    assert config.namespace == role["metadata"]["namespace"]


def restricted_violations(name: str, pod_spec) -> list[str]:
    """The Pod Security Standard "restricted" checks, as the admission controller applies them."""
    problems = []
    pod_security = pod_spec.get("securityContext", {})
    if pod_security.get("seccompProfile", {}).get("type") not in ("RuntimeDefault", "Localhost"):
        problems.append(f"{name}: seccompProfile")
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(key):
            problems.append(f"{name}: {key}")
    for volume in pod_spec.get("volumes", []):
        if not set(volume) - {"name"} <= RESTRICTED_VOLUMES:
            problems.append(f"{name}: volume {volume['name']}")
    for container in pod_spec.get("initContainers", []) + pod_spec["containers"]:
        security = container.get("securityContext", {})
        where = f"{name}/{container['name']}"
        if not security.get("runAsNonRoot", pod_security.get("runAsNonRoot")):
            problems.append(f"{where}: runAsNonRoot")
        if security.get("runAsUser", pod_security.get("runAsUser")) == 0:
            problems.append(f"{where}: runAsUser 0")
        if security.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: allowPrivilegeEscalation")
        if "ALL" not in security.get("capabilities", {}).get("drop", []):
            problems.append(f"{where}: capabilities.drop ALL")
        if set(security.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{where}: capabilities.add")
        if security.get("privileged"):
            problems.append(f"{where}: privileged")
    return problems


def test_every_pod_passes_the_restricted_pod_security_standard(k8s):
    namespace = k8s.by_kind(k8s.render("overlays/cpu"), "Namespace")["pdserve"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"

    problems = []
    for kustomization in ("overlays/cpu", "overlays/gpu", "overlays/dev", "model"):
        for name, template in k8s.pod_templates(k8s.render(kustomization)).items():
            problems += restricted_violations(f"{kustomization}:{name}", template["spec"])
    assert problems == []


def test_restricted_check_catches_a_root_container(k8s):
    """Guards the check above: it must flag what the admission controller would refuse."""
    template = k8s.pod_templates(k8s.render("overlays/cpu"))["pdserve-router"]
    spec = template["spec"]
    spec["securityContext"]["runAsUser"] = 0
    del spec["containers"][0]["securityContext"]["allowPrivilegeEscalation"]

    assert restricted_violations("router", spec) == [
        "router/router: runAsUser 0", "router/router: allowPrivilegeEscalation",
    ]


def test_pdserve_pods_run_as_the_images_user(k8s, overlay):
    _, objects = overlay
    users = {
        name: t["spec"]["securityContext"]["runAsUser"]
        for name, t in k8s.pod_templates(objects).items()
    }
    assert users == {"pdserve-router": 10001, "pdserve-prefill": 10001, "pdserve-decode": 10001,
                     "pdserve-planner": 10001, "pdserve-redis": 999}

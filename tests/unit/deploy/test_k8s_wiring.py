"""The rendered objects fit together: selectors, ports, probes, config and volumes line up."""

from __future__ import annotations

import re

WORKER_PORTS = {"grpc": 50061, "kv": 14579, "metrics": 9100}
ROUTER_PORTS = {"grpc": 50051, "http": 8000}


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def container_ports(template) -> dict[str, int]:
    return {
        port["name"]: port["containerPort"]
        for container in template["spec"]["containers"]
        for port in container.get("ports", [])
    }


def test_each_deployment_selector_matches_its_own_pods_and_no_other_workload(k8s, overlay):
    _, objects = overlay
    templates = k8s.pod_templates(objects)
    deployments = k8s.by_kind(objects, "Deployment")

    for name, deployment in deployments.items():
        selector = deployment["spec"]["selector"]["matchLabels"]
        matched = sorted(n for n, t in templates.items() if selects(selector, t["metadata"]["labels"]))
        assert matched == [name], f"{name}'s selector {selector} matches {matched}"


def test_services_select_pods_that_declare_every_target_port(k8s, overlay):
    _, objects = overlay
    templates = k8s.pod_templates(objects)
    services = k8s.by_kind(objects, "Service")
    expected = {"pdserve-router": ["pdserve-router"], "pdserve-redis": ["pdserve-redis"]}

    for name, service in services.items():
        selector = service["spec"]["selector"]
        backends = sorted(n for n, t in templates.items() if selects(selector, t["metadata"]["labels"]))
        assert backends == expected[name]
        ports = container_ports(templates[backends[0]])
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports, f"{name} targets {port['targetPort']}, pod has {ports}"
            assert ports[port["targetPort"]] == port["port"]


def test_router_service_exposes_grpc_and_http(k8s, overlay):
    _, objects = overlay
    service = k8s.by_kind(objects, "Service")["pdserve-router"]

    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == ROUTER_PORTS
    assert {p["name"]: p["appProtocol"] for p in service["spec"]["ports"]} == {"grpc": "https", "http": "https"}


def _probe_port(probe, ports: dict[str, int]) -> int:
    for kind in ("grpc", "httpGet", "tcpSocket"):
        if kind in probe:
            port = probe[kind]["port"]
            return ports[port] if isinstance(port, str) else port
    raise AssertionError(f"probe without a network check: {probe}")


def test_every_network_probe_points_at_a_port_its_container_declares(k8s, overlay):
    _, objects = overlay
    checked = 0
    for name, template in k8s.pod_templates(objects).items():
        for container in template["spec"]["containers"]:
            ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                probe = container.get(kind)
                if probe and "exec" not in probe:
                    assert _probe_port(probe, ports) in ports.values(), f"{name} {kind}"
                    checked += 1
    assert checked == 9  # router 2, prefill 3, decode 3, redis liveness 1


def test_workers_probe_grpc_health_on_the_grpc_port_and_drain_on_termination(k8s, overlay):
    _, objects = overlay
    deployments = k8s.by_kind(objects, "Deployment")

    for role in ("prefill", "decode"):
        pod = deployments[f"pdserve-{role}"]["spec"]["template"]
        (worker,) = pod["spec"]["containers"]
        assert {p["name"]: p["containerPort"] for p in worker["ports"]} == WORKER_PORTS
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert worker[kind]["grpc"] == {"port": WORKER_PORTS["grpc"]}
        assert f"--role={role}" in worker["args"]
        assert "--grpc-port=50061" in worker["args"] and "--kv-port=14579" in worker["args"]
        assert "--metrics-port=9100" in worker["args"]
        assert worker["lifecycle"]["preStop"] == {"exec": {"command": ["sleep", "5"]}}
        assert pod["spec"]["terminationGracePeriodSeconds"] == 120
        assert pod["metadata"]["annotations"] == {
            "prometheus.io/scrape": "true", "prometheus.io/port": "9100", "prometheus.io/path": "/metrics",
        }
        assert {"name": "PDSERVE_ADVERTISE_HOST",
                "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in worker["env"]


def test_router_scrape_annotation_names_its_http_port(k8s, overlay):
    _, objects = overlay
    pod = k8s.by_kind(objects, "Deployment")["pdserve-router"]["spec"]["template"]

    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(ROUTER_PORTS["http"])
    assert container_ports(pod)["http"] == ROUTER_PORTS["http"]


def test_pool_deployments_leave_replicas_to_the_planner(k8s, overlay):
    _, objects = overlay
    deployments = k8s.by_kind(objects, "Deployment")

    assert "replicas" not in deployments["pdserve-prefill"]["spec"]
    assert "replicas" not in deployments["pdserve-decode"]["spec"]
    assert deployments["pdserve-planner"]["spec"]["replicas"] == 1
    assert deployments["pdserve-planner"]["spec"]["strategy"] == {"type": "Recreate"}


def test_every_arg_variable_is_defined_for_its_container(k8s, overlay):
    """Kubernetes leaves an undefined $(VAR) in args as literal text: catch it here."""
    _, objects = overlay
    config_maps = k8s.by_kind(objects, "ConfigMap")
    for name, template in k8s.pod_templates(objects).items():
        for container in template["spec"]["containers"]:
            defined = {e["name"] for e in container.get("env", [])}
            for source in container.get("envFrom", []):
                config_map = config_maps[source["configMapRef"]["name"]]  # KeyError: dangling ref
                defined |= set(config_map["data"])
            used = {v for arg in container.get("args", []) for v in re.findall(r"\$\((\w+)\)", arg)}
            assert used <= defined, f"{name}: {sorted(used - defined)} undefined"


def test_transport_follows_the_overlay(k8s, overlay):
    name, objects = overlay
    (config_map,) = k8s.by_kind(objects, "ConfigMap").values()

    assert config_map["data"]["PDSERVE_TRANSPORT"] == {"cpu": "tcp", "gpu": "torch", "dev": "tcp", "hybrid": "tcp"}[name]
    assert config_map["data"]["PDSERVE_REDIS_URL"] == "redis://pdserve-redis:6379/0"
    assert config_map["data"]["PDSERVE_KV_CACHE_MB"] == {"cpu": "4096", "gpu": "16384", "dev": "256",
                                                         "hybrid": "4096"}[name]


def test_the_router_runs_the_overlays_topology(k8s, overlay):
    name, objects = overlay
    (config_map,) = k8s.by_kind(objects, "ConfigMap").values()
    (router,) = [c for n, c in k8s.pod_templates(objects).items() if n == "pdserve-router"]
    assert config_map["data"]["PDSERVE_TOPOLOGY"] == ("hybrid" if name == "hybrid" else "disaggregated")
    assert "--topology=$(PDSERVE_TOPOLOGY)" in router["spec"]["containers"][0]["args"]


def test_model_volume_is_the_claim_model_kustomization_creates_and_is_read_only(k8s, overlay):
    _, objects = overlay
    (claim,) = k8s.by_kind(k8s.render("model"), "PersistentVolumeClaim").keys()
    mounted = {}
    for name, template in k8s.pod_templates(objects).items():
        for volume in template["spec"].get("volumes", []):
            if "persistentVolumeClaim" in volume:
                mounted[name] = volume["persistentVolumeClaim"]
    assert mounted == {
        n: {"claimName": claim, "readOnly": True}
        for n in ("pdserve-router", "pdserve-prefill", "pdserve-decode")
    }


def test_pod_disruption_budgets_cover_exactly_their_pool(k8s, overlay):
    _, objects = overlay
    templates = k8s.pod_templates(objects)
    for name, budget in k8s.by_kind(objects, "PodDisruptionBudget").items():
        selector = budget["spec"]["selector"]["matchLabels"]
        assert sorted(n for n, t in templates.items() if selects(selector, t["metadata"]["labels"])) == [name]
        assert budget["spec"]["maxUnavailable"] == 1


def test_every_namespaced_object_lands_in_the_pdserve_namespace(k8s, overlay):
    _, objects = overlay
    namespaces = {o["metadata"].get("namespace") for o in objects if o["kind"] != "Namespace"}

    assert namespaces == {"pdserve"}


def quantity(value: str) -> float:
    """A Kubernetes quantity as a number: CPUs ("500m" -> 0.5) or bytes ("2Gi" -> 2**31)."""
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    for suffix, factor in units.items():
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * factor
    return float(value)


def requested(objects, k8s, resource: str) -> float:
    """What one replica of every workload asks the scheduler for, summed over the cluster."""
    return sum(quantity(c.get("resources", {}).get("requests", {}).get(resource, "0"))
               for t in k8s.pod_templates(objects).values() for c in k8s.all_containers(t["spec"]))


def test_dev_overlay_fits_one_laptop_node_and_the_cpu_overlay_does_not(k8s):
    """deploy/README.md promises the dev overlay schedules on a 4-CPU / 8 GiB kind or minikube node
    (less what the node's own pods use) and warns that the cpu overlay goes Pending there."""
    dev, cpu = k8s.render("overlays/dev"), k8s.render("overlays/cpu")

    assert requested(dev, k8s, "cpu") <= 2.0 and requested(dev, k8s, "memory") <= 6 * 2**30
    assert requested(cpu, k8s, "cpu") > 4.0 and requested(cpu, k8s, "memory") > 8 * 2**30
    for name, template in k8s.pod_templates(dev).items():
        for container in template["spec"]["containers"]:
            resources = container["resources"]
            assert quantity(resources["limits"]["memory"]) >= quantity(resources["requests"]["memory"]), name

"""Who may reach what in the rendered manifests, and where the credentials come from.

The NetworkPolicies are evaluated here with Kubernetes' rules (a pod selected by any policy
accepts only what some policy's rule allows; a rule without `from` allows every source, without
`ports` every port; named ports resolve on the target pod, `endPort` makes a range), over the rendered pod templates: no
API server or CNI needed. The schema check of every object is test_k8s_schemas.py.
"""

from __future__ import annotations

import pytest

OUTSIDE = None   # a client outside the namespace (another namespace, an ingress controller)
COMPONENTS = ("router", "prefill", "decode", "redis", "planner")
CREDENTIALS = "pdserve-credentials"
MOUNT = "/etc/pdserve/credentials"


def matches(selector: dict, labels: dict | None) -> bool:
    if labels is None:
        return False
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        value, operator = labels.get(expression["key"]), expression["operator"]
        if operator == "In" and value not in expression["values"]:
            return False
        if operator == "NotIn" and value in expression["values"]:
            return False
        if operator not in ("In", "NotIn"):
            raise AssertionError(f"this evaluator does not know the operator {operator}")
    return True


def port_numbers(template) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])}


def allowed(k8s, objects, source: str | None, target: str, port_name: str) -> bool:
    """May a pod of component `source` (OUTSIDE: from outside the namespace) open a TCP connection
    to `port_name` of a pod of component `target`?"""
    return allowed_port(k8s, objects, source, target, port_name)


def allowed_port(k8s, objects, source: str | None, target: str, port: str | int) -> bool:
    """`allowed` for a port name of the target pod, or any port number."""
    templates = {t["metadata"]["labels"]["app.kubernetes.io/component"]: t for t in k8s.pod_templates(objects).values()}
    source_labels = templates[source]["metadata"]["labels"] if source else None
    target_template = templates[target]
    target_labels, ports = target_template["metadata"]["labels"], port_numbers(target_template)
    policies = [p for p in k8s.by_kind(objects, "NetworkPolicy").values()
                if "Ingress" in p["spec"]["policyTypes"] and matches(p["spec"]["podSelector"], target_labels)]
    if not policies:
        return True
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            peers = rule.get("from")
            sources_ok = peers is None or any("podSelector" in peer and "namespaceSelector" not in peer
                                              and matches(peer["podSelector"], source_labels) for peer in peers)
            rule_ports = rule.get("ports")
            number = ports[port] if isinstance(port, str) else port
            ports_ok = rule_ports is None or any(_covers(p, ports, number) for p in rule_ports)
            if sources_ok and ports_ok:
                return True
    return False


def _covers(rule_port: dict, named: dict[str, int], number: int) -> bool:
    first = named.get(rule_port["port"], rule_port["port"])
    return rule_port.get("protocol", "TCP") == "TCP" and first <= number <= rule_port.get("endPort", first)


@pytest.mark.parametrize("overlay_name", ["cpu", "gpu", "dev", "hybrid"])
def test_only_the_router_reaches_workers_grpc_only_workers_their_kv_and_only_pdserve_pods_redis(k8s, overlay_name):
    objects = k8s.render(f"overlays/{overlay_name}")
    reach = {(source, target, port): allowed(k8s, objects, source, target, port)
             for source in (*COMPONENTS, OUTSIDE)
             for target, port in (("prefill", "grpc"), ("decode", "grpc"), ("prefill", "kv"), ("decode", "kv"),
                                  ("redis", "redis"), ("router", "grpc"), ("router", "http"), ("decode", "metrics"))}

    assert sorted(key for key, ok in reach.items() if ok and key[1] != "router" and key[2] != "metrics") == sorted([
        ("router", "prefill", "grpc"), ("router", "decode", "grpc"),
        ("prefill", "prefill", "kv"), ("prefill", "decode", "kv"), ("decode", "prefill", "kv"), ("decode", "decode", "kv"),
        ("router", "redis", "redis"), ("prefill", "redis", "redis"), ("decode", "redis", "redis"),
        ("planner", "redis", "redis"),
    ])
    for port in (1, 14579, 29500, 50060, 50062, 65535):   # the torch transport's ports are picked at run time
        assert allowed_port(k8s, objects, "decode", "prefill", port)
    assert not allowed_port(k8s, objects, "router", "prefill", 29500)
    for source in (*COMPONENTS, OUTSIDE):   # the public API and the workers' metrics: from anywhere
        assert reach[(source, "router", "grpc")] and reach[(source, "router", "http")]
        assert reach[(source, "decode", "metrics")]


def test_the_evaluator_denies_what_no_rule_allows_and_allows_unselected_pods(k8s):
    """Guards the evaluator: without the default deny and the worker policy, anyone reaches a worker."""
    objects = k8s.render("overlays/cpu")
    assert not allowed(k8s, objects, "planner", "prefill", "grpc")
    opened = [o for o in objects if o["kind"] != "NetworkPolicy"
              or o["metadata"]["name"] not in ("pdserve-default-deny-ingress", "pdserve-worker-ingress")]
    assert allowed(k8s, opened, "planner", "prefill", "grpc")
    assert allowed(k8s, opened, OUTSIDE, "prefill", "kv")


def test_every_pod_is_behind_the_default_deny(k8s, overlay):
    _, objects = overlay
    (deny,) = [p for p in k8s.by_kind(objects, "NetworkPolicy").values() if p["spec"]["podSelector"] == {}]
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    assert deny["metadata"]["namespace"] == "pdserve"


def credential_volumes(template) -> dict[str, dict]:
    return {v["name"]: v["secret"] for v in template["spec"].get("volumes", [])
            if v.get("secret", {}).get("secretName") == CREDENTIALS}


def test_pdserve_pods_mount_the_credentials_secret_where_the_config_map_points(k8s, overlay):
    _, objects = overlay
    (config_map,) = k8s.by_kind(objects, "ConfigMap").values()
    assert config_map["data"]["PDSERVE_CLUSTER_SECRET_FILE"] == f"{MOUNT}/cluster-secret"
    assert config_map["data"]["PDSERVE_REDIS_PASSWORD_FILE"] == f"{MOUNT}/redis-password"
    templates = k8s.pod_templates(objects)

    keys = {}
    for name, template in templates.items():
        (volume,) = credential_volumes(template).values()
        (container,) = template["spec"]["containers"]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] in credential_volumes(template)]
        assert mount == {"name": mount["name"], "mountPath": MOUNT, "readOnly": True}
        assert volume["defaultMode"] == 0o440   # group: the pod's fsGroup, which is the process's group
        assert template["spec"]["securityContext"]["fsGroup"] == template["spec"]["securityContext"]["runAsGroup"]
        keys[name] = sorted(item["key"] for item in volume["items"]) if "items" in volume else "all"
    assert keys == {"pdserve-router": "all", "pdserve-prefill": "all", "pdserve-decode": "all",
                    "pdserve-planner": ["redis-password"], "pdserve-redis": ["redis-password"]}


def test_redis_requires_the_password_from_a_file_and_no_secret_is_on_a_command_line(k8s, overlay):
    _, objects = overlay
    templates = k8s.pod_templates(objects)
    (redis,) = templates["pdserve-redis"]["spec"]["containers"]
    script = redis["args"][0]

    assert redis["command"] == ["/bin/sh", "-c"]
    assert "requirepass" in script and f"$(cat {MOUNT}/redis-password)" in script
    assert "exec redis-server /run/redis/redis.conf" in script and "--protected-mode" not in script
    assert {v["name"]: v.get("emptyDir") for v in templates["pdserve-redis"]["spec"]["volumes"]}["config"]["medium"] \
        == "Memory"
    for name, template in templates.items():
        for container in template["spec"]["containers"]:
            for env in container.get("env", []):   # only Redis's probe gets a secret as a variable
                if "secretKeyRef" in env.get("valueFrom", {}):
                    assert (name, env["name"]) == ("pdserve-redis", "REDISCLI_AUTH")
            assert not any("password" in arg.lower() and "file" not in arg.lower() and arg != script
                           for arg in container.get("args", []))

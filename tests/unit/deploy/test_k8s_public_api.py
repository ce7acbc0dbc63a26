"""The router on Kubernetes serves its public API over TLS with API keys, from two Secrets, and
its probes still reach it (HTTPS to the open /health: kubelet's gRPC probe speaks plaintext only)."""

from __future__ import annotations

from tests.unit.deploy.test_k8s_cli_contract import expanded_args, pdserve_containers

MOUNTS = {"/etc/pdserve/api-keys": "pdserve-api-keys", "/etc/pdserve/tls": "pdserve-router-tls"}


def _router(k8s, objects):
    (container,) = [c for n, c in pdserve_containers(k8s, objects) if n == "pdserve-router"]
    (template,) = [t for n, t in k8s.pod_templates(objects).items() if n == "pdserve-router"]
    return container, template


def test_the_router_reads_keys_and_certificate_from_mounted_secrets(k8s, overlay):
    _, objects = overlay
    container, template = _router(k8s, objects)
    args = expanded_args(container, k8s.by_kind(objects, "ConfigMap"))
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    mounted = {m["mountPath"]: volumes[m["name"]]["secret"] for m in container["volumeMounts"]
               if "secret" in volumes[m["name"]]}

    for path, secret in MOUNTS.items():
        assert mounted[path]["secretName"] == secret
        assert mounted[path]["defaultMode"] == 0o440
        assert not mounted[path].get("optional", False)   # no Secret: the pod waits, it never serves in clear
    assert "--api-key-file=/etc/pdserve/api-keys/api-keys" in args
    assert "--tls-cert-file=/etc/pdserve/tls/tls.crt" in args   # a kubernetes.io/tls Secret's keys
    assert "--tls-key-file=/etc/pdserve/tls/tls.key" in args
    assert "--insecure" not in args


def test_the_routers_probes_use_https_to_the_open_health_path(k8s, overlay):
    _, objects = overlay
    container, template = _router(k8s, objects)
    for kind in ("readinessProbe", "livenessProbe"):
        probe = container[kind]["httpGet"]
        assert (probe["path"], probe["port"], probe["scheme"]) == ("/health", "http", "HTTPS"), kind
    assert template["metadata"]["annotations"]["prometheus.io/scheme"] == "https"


def test_the_routers_flags_pass_its_bind_safety_check(k8s, overlay):
    """What the router decides at start with these flags (0.0.0.0, TLS, keys): allowed."""
    from router.public_access import exposure_problem

    _, objects = overlay
    container, _ = _router(k8s, objects)
    args = expanded_args(container, k8s.by_kind(objects, "ConfigMap"))
    flags = dict(arg.removeprefix("--").split("=", 1) for arg in args if arg.startswith("--") and "=" in arg)
    assert exposure_problem(flags["host"], tls=bool(flags.get("tls-cert-file")),
                            api_keys=bool(flags.get("api-key-file")), insecure="--insecure" in args) is None
    assert exposure_problem(flags["host"], tls=False, api_keys=bool(flags.get("api-key-file")), insecure=False)

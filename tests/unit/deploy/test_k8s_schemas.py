"""Every rendered object is valid Kubernetes, checked offline against the API's JSON schemas.

Strict mode rejects unknown fields (a typo such as `readinesProbe` would otherwise be silently
dropped by the API server). Two versions: the oldest we support and the newest schema shipped.
"""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
import yaml

KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
KUSTOMIZATIONS = ("base", "overlays/cpu", "overlays/gpu", "overlays/dev", "model")


def schema_errors(objects, version: str) -> list[str]:
    errors = []
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as invalid:
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {invalid.message}")
    return errors


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_rendered_object_validates_against_the_kubernetes_schema(k8s, kustomization, version):
    objects = k8s.render(kustomization)

    assert schema_errors(objects, version) == []


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_model_copy_pod_validates_against_the_kubernetes_schema(k8s, version):
    pod = yaml.safe_load((k8s.repo / "deploy/k8s/model/copy-pod.yaml").read_text())

    assert schema_errors([pod], version) == []


def test_the_schema_check_rejects_a_misspelled_probe(k8s):
    """Guards the check itself: a typo in a Deployment must be reported, not ignored."""
    router = copy.deepcopy(k8s.by_kind(k8s.render("overlays/cpu"), "Deployment")["pdserve-router"])
    container = router["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")

    (error,) = schema_errors([router], "1.37.0")
    assert error.startswith("Deployment/pdserve-router: ")
    assert "readinesProbe" in error


def test_every_kustomization_renders_the_expected_objects(k8s):
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in k8s.render("overlays/cpu"))
    config_map = next(name for kind, name in kinds if kind == "ConfigMap")

    assert config_map.startswith("pdserve-config-")  # hashed: a change rolls the pods
    assert kinds == sorted([
        ("ConfigMap", config_map),
        ("Deployment", "pdserve-decode"),
        ("Deployment", "pdserve-planner"),
        ("Deployment", "pdserve-prefill"),
        ("Deployment", "pdserve-redis"),
        ("Deployment", "pdserve-router"),
        ("Namespace", "pdserve"),
        ("NetworkPolicy", "pdserve-default-deny-ingress"),
        ("NetworkPolicy", "pdserve-redis-ingress"),
        ("NetworkPolicy", "pdserve-router-ingress"),
        ("NetworkPolicy", "pdserve-worker-ingress"),
        ("PodDisruptionBudget", "pdserve-decode"),
        ("PodDisruptionBudget", "pdserve-prefill"),
        ("Role", "pdserve-planner"),
        ("RoleBinding", "pdserve-planner"),
        ("Service", "pdserve-redis"),
        ("Service", "pdserve-router"),
        ("ServiceAccount", "pdserve-planner"),
    ])
    assert sorted((o["kind"], o["metadata"]["name"]) for o in k8s.render("model")) == [
        ("Job", "pdserve-make-model"),
        ("Namespace", "pdserve"),
        ("PersistentVolumeClaim", "pdserve-models"),
    ]

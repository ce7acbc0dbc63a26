"""Resize the prefill and decode pools through Kubernetes Deployments' scale subresource.

Each role is one Deployment (deploy/k8s/base: `pdserve-prefill`, `pdserve-decode`). The actuator
only reads and patches `/apis/apps/v1/namespaces/{ns}/deployments/{name}/scale`, which is all the
planner's Role in deploy/k8s/base/planner-rbac.yaml grants. It never touches pod templates, so a
`kubectl apply` of the manifests and the planner do not fight: the manifests leave `replicas` out.

Contract (planner/actuators/base.py):
- `current()` is the Deployments' desired replica count (`spec.replicas` of the scale), not how
  many pods are ready: the planner compares its last decision with its next one.
- `scale(role, n)` returns once the API server has accepted the new count; it is idempotent.
- Every failure raises `KubernetesScaleError` whose message says what to fix (RBAC, names,
  reachability). Every request has a connect and a read timeout.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from planner.actuators.base import ROLES, Role

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
MERGE_PATCH = "application/merge-patch+json"


class KubernetesScaleError(RuntimeError):
    """The API server refused or could not be reached; the message says what to fix."""


@dataclass(frozen=True)
class KubernetesActuatorConfig:
    """Where the pools live. Defaults match deploy/k8s/base."""

    namespace: str = "pdserve"
    prefill_deployment: str = "pdserve-prefill"
    decode_deployment: str = "pdserve-decode"
    field_manager: str = "pdserve-planner"
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 15.0
    # Used only outside a cluster; None: the client's default (~/.kube/config).
    kubeconfig: str | None = None

    def __post_init__(self) -> None:
        if not _DNS_LABEL.match(self.namespace):
            raise ValueError(
                f"namespace {self.namespace!r} is not a Kubernetes namespace name: use lowercase "
                "letters, digits and '-', at most 63 characters (e.g. 'pdserve')"
            )
        for role in ROLES:
            name = self.deployment_for(role)
            if not _DNS_SUBDOMAIN.match(name):
                raise ValueError(
                    f"{role}_deployment {name!r} is not a Deployment name: use lowercase letters, "
                    f"digits, '-' and '.' (e.g. 'pdserve-{role}')"
                )
        if self.prefill_deployment == self.decode_deployment:
            raise ValueError(
                f"prefill and decode both name Deployment {self.prefill_deployment!r}: each pool "
                "needs its own Deployment (deploy/k8s/base has pdserve-prefill and pdserve-decode)"
            )
        if not (self.connect_timeout_s > 0 and self.read_timeout_s > 0):
            raise ValueError(
                f"timeouts must be > 0 s, got connect={self.connect_timeout_s}, read={self.read_timeout_s}"
            )

    def deployment_for(self, role: Role) -> str:
        if role == "prefill":
            return self.prefill_deployment
        if role == "decode":
            return self.decode_deployment
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")


class KubernetesActuator:
    """The planner's Actuator for pools run as Kubernetes Deployments."""

    def __init__(self, config: KubernetesActuatorConfig, apps_api: k8s_client.AppsV1Api) -> None:
        self.config = config
        self._apps = apps_api
        self._timeout_s = (config.connect_timeout_s, config.read_timeout_s)

    @classmethod
    def connect(cls, config: KubernetesActuatorConfig) -> KubernetesActuator:
        """Use the pod's ServiceAccount when running in a cluster, else the local kubeconfig."""
        configuration = _load_client_configuration(config.kubeconfig)
        return cls(config, k8s_client.AppsV1Api(k8s_client.ApiClient(configuration)))

    def current(self) -> dict[Role, int]:
        return {role: self._read_replicas(role) for role in ROLES}

    def scale(self, role: Role, replicas: int) -> None:
        name = self.config.deployment_for(role)
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ValueError(f"replicas for {role} must be an int >= 0, got {replicas!r}")
        with self._explained(role, name, "patch"):
            self._apps.patch_namespaced_deployment_scale(
                name,
                self.config.namespace,
                {"spec": {"replicas": replicas}},
                field_manager=self.config.field_manager,
                _content_type=MERGE_PATCH,
                _request_timeout=self._timeout_s,
            )

    def _read_replicas(self, role: Role) -> int:
        name = self.config.deployment_for(role)
        with self._explained(role, name, "get"):
            scale = self._apps.read_namespaced_deployment_scale(
                name, self.config.namespace, _request_timeout=self._timeout_s
            )
        # The API server omits spec.replicas when it is 0.
        return int(scale.spec.replicas or 0) if scale.spec else 0

    def _explained(self, role: Role, name: str, verb: str) -> AbstractContextManager[None]:
        return _explain_errors(role, name, self.config.namespace, verb)


@contextmanager
def _explain_errors(role: Role, name: str, namespace: str, verb: str) -> Iterator[None]:
    """Turn client exceptions into KubernetesScaleError with the fix in the message."""
    where = f"deployments/{name}/scale in namespace {namespace}"
    try:
        yield
    except ApiException as exc:
        raise KubernetesScaleError(_api_error_message(exc, role, verb, where)) from exc
    except urllib3.exceptions.HTTPError as exc:
        raise KubernetesScaleError(
            f"cannot reach the Kubernetes API server to {verb} {where}: {exc}. "
            "Check the kubeconfig (outside a cluster) or the pod's network (inside one)."
        ) from exc


def _api_error_message(exc: ApiException, role: Role, verb: str, where: str) -> str:
    if exc.status == 403:
        return (
            f"forbidden to {verb} {where}: the planner's ServiceAccount needs get/patch on "
            "deployments/scale for this Deployment (deploy/k8s/base/planner-rbac.yaml grants it)"
        )
    if exc.status == 404:
        return (
            f"no Deployment for the {role} pool: {where} was not found. Check "
            f"--k8s-namespace and --k8s-{role}-deployment against `kubectl get deployments -A`"
        )
    return f"the API server answered {exc.status} {exc.reason} to {verb} {where}: {exc.body}"


def _load_client_configuration(kubeconfig: str | None) -> k8s_client.Configuration:
    configuration = k8s_client.Configuration()
    try:
        k8s_config.load_incluster_config(client_configuration=configuration)
    except ConfigException:
        try:
            k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        except ConfigException as no_kubeconfig:
            raise KubernetesScaleError(
                "no Kubernetes credentials: run the planner in the cluster with its ServiceAccount "
                f"(deploy/k8s) or pass --kubeconfig / set KUBECONFIG ({no_kubeconfig})"
            ) from no_kubeconfig
    return configuration


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags `pdserve planner --actuator kubernetes` reads (used by deploy/k8s/base/planner.yaml)."""
    defaults = KubernetesActuatorConfig()
    group = parser.add_argument_group("Kubernetes actuator (--actuator kubernetes)")
    group.add_argument("--k8s-namespace", default=defaults.namespace,
                       help=f"namespace of the pool Deployments (default: {defaults.namespace})")
    group.add_argument("--k8s-prefill-deployment", default=defaults.prefill_deployment,
                       help=f"Deployment running the prefill pool (default: {defaults.prefill_deployment})")
    group.add_argument("--k8s-decode-deployment", default=defaults.decode_deployment,
                       help=f"Deployment running the decode pool (default: {defaults.decode_deployment})")
    group.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"),
                       help="kubeconfig to use outside a cluster (default: env KUBECONFIG, else "
                            "~/.kube/config); in a pod the ServiceAccount is used")


def config_from_cli_args(args: argparse.Namespace) -> KubernetesActuatorConfig:
    return KubernetesActuatorConfig(
        namespace=args.k8s_namespace,
        prefill_deployment=args.k8s_prefill_deployment,
        decode_deployment=args.k8s_decode_deployment,
        kubeconfig=args.kubeconfig,
    )

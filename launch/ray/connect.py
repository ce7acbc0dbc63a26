"""Connecting this process to a Ray cluster, authenticated: the I/O around `launch.ray.auth`.

    connect_ray("10.0.0.1:6379")                       # the token where Ray keeps it
    connect_ray("10.0.0.1:6379", "/secrets/ray-token")  # --ray-auth-token-file

Before `ray.init` it makes one call to the head's GCS with the token Ray is about to send, so a
missing or wrong token is one clear `RayClusterError` within seconds instead of a minute of
`InvalidAuthToken` retries; a head nobody answers on fails as fast.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import grpc
import ray

from launch.ray.auth import DEFAULT_TOKEN_FILE, TOKEN_PATH_VAR, TokenChoice, choose_token, gcs_verdict, refusal_message

PROBE_TIMEOUT_S = 5.0
# any GCS method does: the token is checked before the call runs; this one has an empty request
PROBE_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"


class RayClusterError(RuntimeError):
    """Ray or the cluster's controller cannot be reached; the message says what to do."""


def connect_ray(address: str, auth_token_file: str = "") -> None:
    """Connects this process to the Ray cluster at `address` unless it already is connected.
    `auth_token_file` is a file holding the cluster's token ("": Ray's own places)."""
    if ray.is_initialized():
        return
    try:
        choice = use_token(auth_token_file)
    except ValueError as error:
        raise RayClusterError(str(error)) from None
    target = _gcs_address(address)
    try:
        if target:
            _check_reachable(target)
            _check_authenticated(address, target, choice)
        ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    except OSError as error:  # ConnectionError, a refused or timed-out connect, an unknown host
        raise RayClusterError(
            f"cannot reach a Ray cluster at {address!r} ({error}). Start one with `ray start --head --port PORT` "
            "and pass HOST:PORT (the GCS address `ray start` prints), or --ray auto on the head node"
        ) from error


def use_token(token_file: str = "") -> TokenChoice:
    """Picks this process's token (`launch.ray.auth.choose_token`) and sets the environment so
    that Ray sends it. Ray reads its mode once, at import: it is read again here."""
    token_file = os.path.abspath(os.path.expanduser(token_file)) if token_file else ""
    default_path = os.path.expanduser(DEFAULT_TOKEN_FILE)
    candidates = (token_file, os.environ.get(TOKEN_PATH_VAR, ""), default_path)
    choice = choose_token(token_file, os.environ, {path for path in candidates if _holds_text(path)}, default_path)
    changes = choice.env_changes()
    for name, value in changes.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if changes:
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")   # as Ray's own `ray start` does after turning token mode on
        AuthenticationTokenLoader.instance().reset_cache()
    return choice


def _holds_text(path: str) -> bool:
    try:
        return bool(path) and bool(Path(path).read_text().strip())
    except OSError:
        return False


def _gcs_address(address: str) -> str:
    """HOST:PORT of the head's GCS; "" when it cannot be known here (ray://, or no cluster for "auto")."""
    if "://" in address:
        return ""
    if address != "auto":
        return address
    from ray._private.services import canonicalize_bootstrap_address

    try:
        return canonicalize_bootstrap_address("auto") or ""
    except (ConnectionError, ValueError):
        return ""


def _check_reachable(target: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Fails fast on a HOST:PORT nobody listens on (ray.init would retry for minutes)."""
    host, _, port = target.rpartition(":")
    if not port.isdigit():
        raise ConnectionError(f"{target!r} is not HOST:PORT")
    with socket.create_connection((host, int(port)), timeout=timeout_s):
        pass


def _check_authenticated(address: str, target: str, choice: TokenChoice) -> None:
    """One GCS call carrying the header Ray will send (none when token mode is off)."""
    from ray._raylet import AuthenticationTokenLoader

    metadata = tuple(AuthenticationTokenLoader.instance().get_token_for_http_header().items())
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(PROBE_METHOD)
        try:
            call(b"", timeout=PROBE_TIMEOUT_S, metadata=metadata)
            status = "OK"
        except grpc.RpcError as error:
            status = error.code().name
    verdict = gcs_verdict(status)
    if verdict == "refused":
        raise RayClusterError(refusal_message(address, choice))
    if verdict == "unreachable":
        raise ConnectionError(f"the GCS at {target} does not answer ({status})")

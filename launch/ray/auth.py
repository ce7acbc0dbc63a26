"""Which Ray authentication token a pdserve driver sends, and what to say when Ray refuses it.

Pure: environment values in, a `TokenChoice` (and the environment changes it needs) out. The
I/O around it (reading the environment, probing the head, `ray.init`) is `launch.ray.connect`.

How Ray 2.60's token authentication works (https://docs.ray.io/en/latest/ray-security/token-auth.html):
- a token is looked up in this order: the `RAY_AUTH_TOKEN` variable, the file `RAY_AUTH_TOKEN_PATH`
  names, `~/.ray/auth_token`. `ray get-auth-token --generate` writes the last one (if missing) and
  `ray get-auth-token` prints the token in use;
- `ray start --head` turns authentication on when a token exists (unless `RAY_AUTH_MODE` says
  otherwise), and every process of that cluster then demands it; a local `ray.init()` generates one;
- a driver sends its token only when `RAY_AUTH_MODE=token` in its own process. Ray sets that for
  `ray.init(address="auto")` when it finds a token, but not for an explicit `HOST:PORT`: such a
  driver sends nothing, the head answers `Unauthenticated: InvalidAuthToken`, and `ray.init`
  retries that for a minute before "Failed to connect to Ray cluster".

So pdserve looks the token up itself, `--ray-auth-token-file` first and then in Ray's order, and
turns token mode on in its own process when it has one (a cluster without authentication ignores
the token). `RAY_AUTH_MODE=disabled`, when the user set it, is respected.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal

MODE_VAR = "RAY_AUTH_MODE"
TOKEN_VAR = "RAY_AUTH_TOKEN"
TOKEN_PATH_VAR = "RAY_AUTH_TOKEN_PATH"
DEFAULT_TOKEN_FILE = "~/.ray/auth_token"
LOOKED_AT = f"--ray-auth-token-file, {TOKEN_VAR}, {TOKEN_PATH_VAR}, {DEFAULT_TOKEN_FILE}"
HOW_TO_GET_ONE = ("`ray get-auth-token` on the head node prints the cluster's token: write it to a file and "
                  f"pass --ray-auth-token-file FILE, or set {TOKEN_VAR} (deploy/ray/README.md, \"Token authentication\")")

Origin = Literal["flag", "env-token", "env-path", "default-file", "none", "disabled"]
GcsVerdict = Literal["serves", "refused", "unreachable", "unknown"]


@dataclass(frozen=True)
class TokenChoice:
    """Where this driver's token comes from. `path` is the file holding it ("" for `env-token`,
    `none` and `disabled`)."""

    origin: Origin
    path: str = ""

    @property
    def has_token(self) -> bool:
        return self.origin not in ("none", "disabled")

    def describe(self) -> str:
        return {"flag": f"--ray-auth-token-file {self.path}", "env-token": TOKEN_VAR,
                "env-path": f"{TOKEN_PATH_VAR}={self.path}", "default-file": f"{DEFAULT_TOKEN_FILE} ({self.path})",
                "none": "no token", "disabled": f"{MODE_VAR}=disabled"}[self.origin]

    def env_changes(self) -> dict[str, str | None]:
        """What to set (a value) or remove (None) in this process's environment before `ray.init`
        so that Ray sends this token: token mode on, and for the flag its file, which must win
        over a `RAY_AUTH_TOKEN` Ray would otherwise read first. Empty: leave Ray as it is."""
        if self.origin == "flag":
            return {MODE_VAR: "token", TOKEN_PATH_VAR: self.path, TOKEN_VAR: None}
        if self.has_token:
            return {MODE_VAR: "token"}
        return {}


def choose_token(token_file: str, environ: Mapping[str, str], files_with_token: Collection[str],
                 default_path: str) -> TokenChoice:
    """The token a driver uses. `token_file` is `--ray-auth-token-file` ("" when not given),
    `files_with_token` the candidate files that exist and are not empty, `default_path` where
    `~/.ray/auth_token` is for this user. Raises ValueError, saying what to fix, when a token
    was asked for (the flag, `RAY_AUTH_TOKEN_PATH`, `RAY_AUTH_MODE=token`) and is not there."""
    mode = environ.get(MODE_VAR, "").strip().lower()
    if mode not in ("", "token", "disabled"):
        raise ValueError(f"{MODE_VAR}={environ[MODE_VAR]!r}: Ray knows 'token' and 'disabled'; unset it to use "
                         "the cluster's token")
    if mode == "disabled":
        if token_file:
            raise ValueError(f"--ray-auth-token-file {token_file} is given but {MODE_VAR}=disabled here: unset "
                             f"{MODE_VAR} so that the token is sent")
        return TokenChoice("disabled")
    if token_file:
        if token_file not in files_with_token:
            raise ValueError(f"--ray-auth-token-file {token_file}: no such file, or it is empty. {HOW_TO_GET_ONE}")
        return TokenChoice("flag", token_file)
    if environ.get(TOKEN_VAR, "").strip():
        return TokenChoice("env-token")
    env_path = environ.get(TOKEN_PATH_VAR, "")
    if env_path:
        if env_path not in files_with_token:
            raise ValueError(f"{TOKEN_PATH_VAR}={env_path}: no such file, or it is empty. {HOW_TO_GET_ONE}")
        return TokenChoice("env-path", env_path)
    if default_path in files_with_token:
        return TokenChoice("default-file", default_path)
    if mode == "token":
        raise ValueError(f"{MODE_VAR}=token but no Ray authentication token was found (looked at {LOOKED_AT}). "
                         f"{HOW_TO_GET_ONE}")
    return TokenChoice("none")


def gcs_verdict(grpc_status: str) -> GcsVerdict:
    """What one call to the head's GCS, answered with `grpc_status` (a grpc.StatusCode name), says
    about connecting: it serves this driver, it refused its token (or the lack of one), nobody
    answers, or the call tells nothing (then `ray.init` decides)."""
    if grpc_status == "OK":
        return "serves"
    if grpc_status == "UNAUTHENTICATED":
        return "refused"
    if grpc_status in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
        return "unreachable"
    return "unknown"


def refusal_message(address: str, choice: TokenChoice) -> str:
    """One line: the Ray cluster at `address` refused this driver, why, and what to do."""
    if choice.origin == "disabled":
        why = (f"the Ray cluster at {address} uses token authentication, but {MODE_VAR}=disabled in this "
               f"environment: unset it so that pdserve sends the cluster's token.")
    elif not choice.has_token:
        why = (f"the Ray cluster at {address} uses token authentication and pdserve found no token "
               f"(looked at {LOOKED_AT}).")
    else:
        why = (f"the Ray cluster at {address} refused the token from {choice.describe()}: "
               "the cluster was started with another token.")
    return f"{why} {HOW_TO_GET_ONE}"

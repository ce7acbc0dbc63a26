"""The flags protecting the router's public API (TLS, mTLS, API keys, --insecure), shared by
`pdserve router` and the commands that start one (`pdserve up`, `pdserve up --ray`).

Only paths travel on command lines (every user of a host can read a process's command line);
the router reads the files when it starts. Each flag defaults to an environment variable, for
containers; PDSERVE_API_KEY may hold one key itself, as vLLM's VLLM_API_KEY does.
"""

from __future__ import annotations

import argparse
import os

from router.public_access import API_KEY_ENV, API_KEYS_FILE_ENV
from router.public_tls import TLS_CERT_FILE_ENV, TLS_CLIENT_CA_FILE_ENV, TLS_KEY_FILE_ENV

HELP = ("Beyond 127.0.0.1 the router serves only with TLS and API keys, unless --insecure says something in front "
        "of it (a gateway, a mesh) does that work. SECURITY.md explains each and how to rotate them.")


def add_public_api_options(parser: argparse.ArgumentParser, host_help: str | None = None) -> None:
    """The public API flags; `host_help` adds --host (the router's listen address) with that help."""
    group = parser.add_argument_group("public API security", HELP)
    if host_help is not None:
        group.add_argument("--host", default="127.0.0.1", help=host_help)
    group.add_argument("--tls-cert-file", default=os.environ.get(TLS_CERT_FILE_ENV, ""), metavar="PEM",
                       help=f"the router's TLS certificate (and chain) for gRPC and HTTP (env {TLS_CERT_FILE_ENV})")
    group.add_argument("--tls-key-file", default=os.environ.get(TLS_KEY_FILE_ENV, ""), metavar="PEM",
                       help=f"its private key, unencrypted (env {TLS_KEY_FILE_ENV})")
    group.add_argument("--tls-client-ca-file", default=os.environ.get(TLS_CLIENT_CA_FILE_ENV, ""), metavar="PEM",
                       help="mTLS: clients must present a certificate signed by a CA in this file "
                            f"(env {TLS_CLIENT_CA_FILE_ENV}; default: no client certificates)")
    group.add_argument("--api-key-file", default=os.environ.get(API_KEYS_FILE_ENV, ""), metavar="FILE",
                       help="API keys clients must send (HTTP `Authorization: Bearer KEY`, gRPC metadata "
                            "`authorization`), one a line, # comments; several let a rotation overlap "
                            f"(env {API_KEYS_FILE_ENV}; {API_KEY_ENV} may hold one key itself; default: none, open API)")
    group.add_argument("--insecure", action="store_true",
                       help="allow listening beyond 127.0.0.1 without TLS or API keys (a gateway or mesh in front "
                            "terminates TLS and authenticates clients)")


def public_api_config(args: argparse.Namespace, command: str, env_key: bool = True):
    """The router's `PublicApiConfig` from the flags, the key file read and PDSERVE_API_KEY added
    (unless not `env_key`); SystemExit saying what to fix."""
    from router.public_access import ApiKeyError, load_api_keys
    from router.public_auth import PublicApiConfig
    from router.public_tls import TlsFiles

    try:
        tls = TlsFiles(args.tls_cert_file, args.tls_key_file, args.tls_client_ca_file)
        keys = load_api_keys(args.api_key_file, os.environ.get(API_KEY_ENV, "") if env_key else "")
    except (ValueError, ApiKeyError) as bad:
        raise SystemExit(f"pdserve {command}: {bad}") from None
    return PublicApiConfig(tls=tls, api_keys=keys, insecure=args.insecure)


def check_exposure(args: argparse.Namespace, command: str, host: str):
    """`public_api_config`, and SystemExit unless the router may listen on `host` so configured."""
    config = public_api_config(args, command)
    problem = config.problem_at(host)
    if problem:
        raise SystemExit(f"pdserve {command}: {problem}")
    return config


def check_ray_exposure(args: argparse.Namespace) -> None:
    """`pdserve up --ray`: its router listens on its node's address, never loopback, so it needs TLS
    and a key file (PDSERVE_API_KEY stays in this process: an actor does not inherit it), or
    --insecure. ValueError saying what to fix. The files are checked here, on the driver's host;
    the router's node must have them at the same paths."""
    try:
        config = public_api_config(args, "up --ray", env_key=False)
    except SystemExit as bad:
        raise ValueError(str(bad)) from None
    problem = config.problem_at("its Ray node's address")
    if problem:
        raise ValueError(f"pdserve up --ray: {problem}")


def public_api_argv(args: argparse.Namespace, with_host: bool = True) -> list[str]:
    """The flags as `pdserve router` takes them, for a launcher to pass on: file paths made absolute
    (a Ray actor runs elsewhere), never a key. PDSERVE_API_KEY reaches a local router through its
    environment, which a child inherits."""
    flags = ["--host", args.host] if with_host and getattr(args, "host", None) else []
    for name in ("tls_cert_file", "tls_key_file", "tls_client_ca_file", "api_key_file"):
        value = getattr(args, name)
        if value:
            flags += [f"--{name.replace('_', '-')}", os.path.abspath(value)]
    return flags + (["--insecure"] if args.insecure else [])


def how_to_connect(args: argparse.Namespace, grpc_target: str, http_url: str) -> list[str]:
    """What `pdserve up` prints: the endpoints, and how a client gives the key and trusts the
    certificate; names the key's file or variable, never the key."""
    import shlex

    tls = bool(args.tls_cert_file)
    key_source = (f"$(grep -m1 -v '^ *#' {shlex.quote(os.path.abspath(args.api_key_file))})" if args.api_key_file
                  else f"${API_KEY_ENV}" if os.environ.get(API_KEY_ENV) else "")
    sdk = ", ".join(["target", *(["api_key=KEY"] if key_source else []),
                     *(["root_certificates=open(CERT, 'rb').read()"] if tls else [])])
    lines = [f"  gRPC   {grpc_target}   (pdserve.client.Client({sdk}))",
             f"  HTTP   {http_url}/v1/completions   (OpenAI-compatible)"]
    if key_source:
        where = f"in {os.path.abspath(args.api_key_file)}" if args.api_key_file else f"in ${API_KEY_ENV}"
        lines.append(f"  key    {where}   (HTTP: Authorization: Bearer KEY; gRPC metadata authorization: Bearer KEY)")
    if tls:
        lines.append(f"  TLS    certificate {os.path.abspath(args.tls_cert_file)}"
                     + ("; clients need a certificate from --tls-client-ca-file's CA" if args.tls_client_ca_file else ""))
    if key_source or tls:
        curl = ["curl", *(["--cacert", shlex.quote(os.path.abspath(args.tls_cert_file))] if tls else []),
                *(["--cert", "CLIENT.pem", "--key", "CLIENT.key"] if args.tls_client_ca_file else []),
                *([f'-H "Authorization: Bearer {key_source}"'] if key_source else []),
                f"{http_url}/v1/completions", "-H 'content-type: application/json'",
                """-d '{"prompt": "Hello", "max_tokens": 16}'"""]
        lines.append(f"  try    {' '.join(curl)}")
    return lines

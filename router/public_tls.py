"""TLS for the router's public ports: one `TlsFiles` value configures both gRPC and HTTP.

Checked when built: a certificate without its key (or the reverse), a client CA without a
certificate, a file that cannot be read, or a certificate and key that do not belong together
raise ValueError saying what to fix, so a mistake stops the process before it serves.
With `client_ca_file`, both ports require a client certificate signed by that CA (mTLS).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

TLS_CERT_FILE_ENV = "PDSERVE_TLS_CERT_FILE"
TLS_KEY_FILE_ENV = "PDSERVE_TLS_KEY_FILE"
TLS_CLIENT_CA_FILE_ENV = "PDSERVE_TLS_CLIENT_CA_FILE"


@dataclass(frozen=True)
class TlsFiles:
    cert_file: str = ""        # PEM: the server's certificate, then its chain
    key_file: str = ""         # PEM: its private key
    client_ca_file: str = ""   # PEM: CA(s) client certificates must chain to; "" = no client certificates

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            given, missing = ("--tls-cert-file", "--tls-key-file") if self.cert_file else ("--tls-key-file", "--tls-cert-file")
            raise ValueError(f"{given} needs {missing} too: TLS takes a certificate and its private key")
        if self.client_ca_file and not self.cert_file:
            raise ValueError("--tls-client-ca-file (mTLS) needs TLS: give --tls-cert-file and --tls-key-file too")
        for flag, path in (("--tls-cert-file", self.cert_file), ("--tls-key-file", self.key_file),
                           ("--tls-client-ca-file", self.client_ca_file)):
            if path and not Path(path).is_file():
                raise ValueError(f"{flag} {path}: no such file")
        if self.enabled:
            self._check_loads()

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file)

    @property
    def mutual(self) -> bool:
        return bool(self.client_ca_file)

    @property
    def http_scheme(self) -> str:
        return "https" if self.enabled else "http"

    def _check_loads(self) -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
        except (ssl.SSLError, OSError) as bad:
            raise ValueError(f"cannot use --tls-cert-file {self.cert_file} with --tls-key-file {self.key_file}: {bad} "
                             "(both PEM; the key must be the certificate's, unencrypted)") from None
        if self.client_ca_file:
            try:
                context.load_verify_locations(cafile=self.client_ca_file)
            except (ssl.SSLError, OSError) as bad:
                raise ValueError(f"cannot use --tls-client-ca-file {self.client_ca_file}: {bad} (PEM certificates)") from None

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """For `server.add_secure_port`; only when `enabled`."""
        ca = Path(self.client_ca_file).read_bytes() if self.client_ca_file else None
        return grpc.ssl_server_credentials([(Path(self.key_file).read_bytes(), Path(self.cert_file).read_bytes())],
                                           root_certificates=ca, require_client_auth=ca is not None)

    def uvicorn_options(self) -> dict:
        """`uvicorn.Config` keyword arguments: none without TLS."""
        if not self.enabled:
            return {}
        options = {"ssl_certfile": self.cert_file, "ssl_keyfile": self.key_file}
        if self.client_ca_file:
            options |= {"ssl_ca_certs": self.client_ca_file, "ssl_cert_reqs": ssl.CERT_REQUIRED}
        return options


def add_port(server: grpc.aio.Server, address: str, tls: TlsFiles) -> int:
    """Binds the public gRPC port, with TLS when configured; returns the port."""
    if tls.enabled:
        return server.add_secure_port(address, tls.grpc_credentials())
    return server.add_insecure_port(address)

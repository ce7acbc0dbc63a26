"""`TlsFiles`: checked when built, so a TLS mistake stops the router before it serves."""

from __future__ import annotations

import ssl

import pytest

from router.public_tls import TlsFiles
from tests.tls_certs import make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_no_files_is_plaintext():
    tls = TlsFiles()
    assert (tls.enabled, tls.mutual, tls.http_scheme, tls.uvicorn_options()) == (False, False, "http", {})


def test_certificate_and_key_configure_both_ports(pki):
    tls = TlsFiles(str(pki.server_cert_file), str(pki.server_key_file))
    assert (tls.enabled, tls.mutual, tls.http_scheme) == (True, False, "https")
    assert tls.uvicorn_options() == {"ssl_certfile": str(pki.server_cert_file), "ssl_keyfile": str(pki.server_key_file)}
    assert tls.grpc_credentials() is not None


def test_a_client_ca_requires_client_certificates_on_http(pki):
    tls = TlsFiles(str(pki.server_cert_file), str(pki.server_key_file), str(pki.ca_file))
    assert tls.mutual
    assert tls.uvicorn_options()["ssl_ca_certs"] == str(pki.ca_file)
    assert tls.uvicorn_options()["ssl_cert_reqs"] == ssl.CERT_REQUIRED


@pytest.mark.parametrize("which, message", [("cert", "--tls-cert-file needs --tls-key-file too"),
                                            ("key", "--tls-key-file needs --tls-cert-file too")])
def test_a_certificate_without_its_key_or_the_reverse_is_refused(pki, which, message):
    files = {"cert": (str(pki.server_cert_file), ""), "key": ("", str(pki.server_key_file))}[which]
    with pytest.raises(ValueError, match=message):
        TlsFiles(*files)


def test_a_client_ca_without_tls_is_refused(pki):
    with pytest.raises(ValueError, match="--tls-client-ca-file .mTLS. needs TLS"):
        TlsFiles(client_ca_file=str(pki.ca_file))


def test_a_missing_file_is_named(pki, tmp_path):
    with pytest.raises(ValueError, match=f"--tls-key-file {tmp_path}/absent.key: no such file"):
        TlsFiles(str(pki.server_cert_file), str(tmp_path / "absent.key"))


def test_a_key_that_is_not_the_certificates_is_refused(pki):
    with pytest.raises(ValueError, match="the key must be the certificate's"):
        TlsFiles(str(pki.server_cert_file), str(pki.client_key_file))


def test_a_client_ca_file_that_is_not_pem_is_refused(pki, tmp_path):
    (tmp_path / "ca.pem").write_text("not a certificate\n")
    with pytest.raises(ValueError, match="cannot use --tls-client-ca-file"):
        TlsFiles(str(pki.server_cert_file), str(pki.server_key_file), str(tmp_path / "ca.pem"))

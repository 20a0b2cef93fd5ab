"""The service's TLS files without a restart (issue 37, item 3): a client certificate the CA's
revocation list names is refused, a new list takes effect within a second or two, and so does a
renewed server certificate. The real service (HTTPS, client certificates, API keys) in front of
the three real workers; its TLS files are copies it alone reads."""

from __future__ import annotations

import datetime
import os
import shutil
import ssl
import time
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from tests.serving.federation import Federation, breast_ids, make_certs

RELOADED = 2.5
"""Seconds for a change of a TLS file to take effect: it is looked at once a second."""


def _write_crl(tls: Path, revoked: list[str], out: Path) -> None:
    """The test CA's certificate revocation list naming ``revoked`` clients' certificates,
    replacing ``out`` at once."""
    ca_key = serialization.load_pem_private_key((tls / "ca.key").read_bytes(), None)
    ca = x509.load_pem_x509_certificate((tls / "ca.pem").read_bytes())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateRevocationListBuilder().issuer_name(ca.subject)
               .last_update(now - datetime.timedelta(minutes=5))
               .next_update(now + datetime.timedelta(days=1)))
    for name in revoked:
        cert = x509.load_pem_x509_certificate((tls / f"{name}.pem").read_bytes())
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(cert.serial_number)
            .revocation_date(now - datetime.timedelta(minutes=5)).build())
    crl = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    partial = out.with_suffix(".part")
    partial.write_bytes(crl.public_bytes(serialization.Encoding.PEM))
    os.replace(partial, out)


def _status(fed: Federation, base: str, key: str, client: str, ca: Path) -> int | str:
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(fed.tls / f"{client}.pem", fed.tls / f"{client}.key")
    try:
        with httpx.Client(base_url=base, verify=context, timeout=10,
                          headers={"Authorization": f"Bearer {key}"}) as http:
            return http.post("/v1/score", json={"ids": breast_ids()[:1]}).status_code
    except httpx.TransportError:  # TLS 1.3: a refused client certificate shows after the
        return "refused"            # client's handshake, as a closed connection


def test_a_revocation_list_and_a_renewed_certificate_take_effect_without_a_restart(
        federation: Federation, api_key: str, tmp_path: Path) -> None:
    files = tmp_path / "tls"
    files.mkdir()
    for name in ("server.pem", "server.key", "ca.pem"):
        shutil.copy(federation.tls / name, files / name)
    _write_crl(federation.tls, [], files / "crl.pem")
    service = federation.serve(
        "--api-keys", str(federation.keys), "--tls-cert", str(files / "server.pem"),
        "--tls-key", str(files / "server.key"), "--tls-client-ca", str(files / "ca.pem"),
        "--tls-crl", str(files / "crl.pem"), "--rate", "1000", log_name="tls-files")
    try:
        ca = federation.tls / "ca.pem"
        assert _status(federation, service.base, api_key, "client_b", ca) == 200
        _write_crl(federation.tls, ["client_b"], files / "crl.pem")  # the CA revokes client_b
        time.sleep(RELOADED)
        assert _status(federation, service.base, api_key, "client_b", ca) == "refused"
        assert _status(federation, service.base, api_key, "client_a", ca) == 200
        # a renewed server certificate, from another CA: clients that trust it get in
        renewed = make_certs(tmp_path / "renewed", [])
        for name in ("server.key", "server.pem"):
            partial = files / f"{name}.part"
            shutil.copy(renewed / name, partial)
            os.replace(partial, files / name)
        time.sleep(RELOADED)
        assert _status(federation, service.base, api_key, "client_a",
                       renewed / "ca.pem") == 200
        assert _status(federation, service.base, api_key, "client_a", ca) == "refused"
        # a file that does not load keeps the last good ones
        (files / "crl.pem").write_text("not a CRL\n")
        time.sleep(RELOADED)
        assert _status(federation, service.base, api_key, "client_a",
                       renewed / "ca.pem") == 200
        assert any("TLS files not reloaded" in line for line in service.lines())
        assert service.proc.poll() is None
    finally:
        service.stop()


def test_a_revocation_list_needs_client_certificates(federation: Federation,
                                                     capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    from fedboost.cli import main

    code = main(["serve-model", str(federation.runs), "--port", "1", "--api-keys",
                 str(federation.keys), "--tls-crl", str(federation.tls / "ca.pem")])
    assert code == 1
    assert capsys.readouterr().err.strip().endswith(
        "--tls-crl revokes client certificates: give --tls-client-ca")

"""An organisation's own TLS material for ``fedboost provision``: its CA, its broker's
certificate and the client certificate its shovels present, and the checks a received CA
certificate must pass. The same recipe as ``deploy/make-certs.sh`` (EC P-256, SHA-256, 825-day
leaves), with the ``cryptography`` package instead of the ``openssl`` command.
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from boosting.tree import open_private

CA_DAYS = 3650
LEAF_DAYS = 825  # the longest validity clients accept for a leaf certificate


class TlsMaterialError(ValueError):
    """A certificate or key is unusable (one line naming the file)."""


def make_ca(key_path: Path, cert_path: Path, subject: str) -> bool:
    """A self-signed CA (``key_path`` 0600, ``cert_path`` public) unless its key exists; True
    if made."""
    if key_path.exists():
        return False
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    cert = (_builder(name, name, key.public_key(), CA_DAYS)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_usage(cert_sign=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    _write_key(key_path, key)
    _write_public(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return True


def make_leaf(key_path: Path, cert_path: Path, ca_key_path: Path, ca_cert_path: Path, *,
              common_name: str, names: tuple[str, ...] = (), server: bool) -> bool:
    """A key (0600) and a certificate for it signed by the CA, unless the key exists; True if
    made. ``names``: the subject alternative names (DNS names or IP addresses) of a server."""
    if key_path.exists():
        return False
    ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TlsMaterialError(f"{ca_key_path}: not the EC key of a CA made by provision init")
    ca = x509.load_pem_x509_certificate(ca_cert_path.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (_builder(subject, ca.subject, key.public_key(), LEAF_DAYS)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(_usage(cert_sign=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                              critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                   ca_key.public_key()), critical=False))
    if names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([_general_name(n) for n in names]), critical=False)
    _write_key(key_path, key)
    _write_public(cert_path, builder.sign(ca_key, hashes.SHA256()).public_bytes(
        serialization.Encoding.PEM))
    return True


def check_ca(path: Path) -> bytes:
    """The PEM of ``path`` if it is one CA certificate (basic constraints CA, allowed to sign
    certificates); a ``TlsMaterialError`` saying what is wrong otherwise."""
    try:
        data = path.read_bytes()
        certs = x509.load_pem_x509_certificates(data)
    except (OSError, ValueError) as exc:
        raise TlsMaterialError(f"{path}: not a PEM certificate ({exc})") from None
    if len(certs) != 1:
        raise TlsMaterialError(f"{path}: expected one CA certificate, found {len(certs)}")
    try:
        constraints = certs[0].extensions.get_extension_for_class(x509.BasicConstraints).value
        usage = certs[0].extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        raise TlsMaterialError(f"{path}: not a CA certificate (no basic constraints or key "
                               f"usage)") from None
    if not constraints.ca or not usage.key_cert_sign:
        raise TlsMaterialError(f"{path}: not a CA certificate (a leaf: it cannot sign "
                               f"certificates)")
    return data


def _builder(subject: x509.Name, issuer: x509.Name, public: ec.EllipticCurvePublicKey,
             days: int) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
            .public_key(public).serial_number(int.from_bytes(secrets.token_bytes(16)) >> 1)
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days)))


def _usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(digital_signature=not cert_sign, key_encipherment=not cert_sign,
                         content_commitment=False, data_encipherment=False,
                         key_agreement=False, key_cert_sign=cert_sign, crl_sign=cert_sign,
                         encipher_only=False, decipher_only=False)


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    with open_private(path, "wb", replace=False) as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))


def _write_public(path: Path, data: bytes) -> None:
    with open_private(path, "wb", permissions=0o644) as f:
        f.write(data)

"""Throw-away TLS material for test brokers: a CA, a broker certificate for 127.0.0.1 and client
certificates, written as PEM files (Kafka reads PEM key stores and trust stores directly).

Test-only (uses the `cryptography` dev dependency); never imported by the service.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID = dt.timedelta(days=2)


@dataclass(frozen=True)
class Issued:
    """A certificate and its key as PEM files (`bundle`: key + certificate, Kafka's PEM key store)."""

    cert: Path
    key: Path
    bundle: Path


class TestCA:
    """A self-signed CA that issues server and client certificates into `folder`."""

    __test__ = False  # not a pytest test class

    def __init__(self, folder: Path, name: str = "clef-test-ca") -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = dt.datetime.now(dt.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert_file = folder / f"{name}.pem"
        self.cert_file.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, common_name: str, *, server: bool = False, key_password: str | None = None) -> Issued:
        """A certificate for `common_name` (server: SAN 127.0.0.1 and localhost; client: client auth)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALID)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        cert = builder.sign(self._key, hashes.SHA256())
        encryption: serialization.KeySerializationEncryption = (
            serialization.BestAvailableEncryption(key_password.encode())
            if key_password
            else serialization.NoEncryption()
        )
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
        cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        stem = self.folder / common_name
        paths = Issued(Path(f"{stem}.crt"), Path(f"{stem}.key"), Path(f"{stem}.bundle.pem"))
        paths.cert.write_bytes(cert_pem)
        paths.key.write_bytes(key_pem)
        paths.key.chmod(0o600)
        paths.bundle.write_bytes(key_pem + cert_pem)
        return paths

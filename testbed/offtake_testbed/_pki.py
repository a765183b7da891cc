"""Throw-away certificates for the test bed's TLS listeners: one CA, a server certificate for
loopback, a client certificate. PEM only, made with the ``cryptography`` package in memory.

EC P-256 keys: generating one takes about a millisecond (an RSA 2048 key takes tens to hundreds),
and both the broker's JVM and librdkafka's OpenSSL accept them.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CertificateAuthority", "KeyPair"]


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, both PEM text (the key PKCS#8, not encrypted)."""

    cert_pem: str
    key_pem: str


class CertificateAuthority:
    """A self-signed CA that issues server and client certificates, valid from 5 minutes ago
    (clocks of the processes under test may differ slightly) for ``days``."""

    def __init__(self, name: str = "offtake-testbed-ca", days: int = 30) -> None:
        self.days = days
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self._cert = (
            self._builder(self._name, self._key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_key_usage(cert_sign=True), critical=True)
            .sign(self._key, hashes.SHA256())
        )

    @property
    def cert_pem(self) -> str:
        return self._cert.public_bytes(serialization.Encoding.PEM).decode()

    @property
    def key_pem(self) -> str:
        """The CA's own key (the control plane's controller-manager signs with it)."""
        return _pem_key(self._key)

    def server(
        self, common_name: str, hosts: tuple[str, ...] = ("localhost", "127.0.0.1")
    ) -> KeyPair:
        """A serving certificate whose subjectAltName lists ``hosts`` (DNS names or IPs):
        clients verify the host they dialled against it, not against the common name."""
        sans: list[x509.GeneralName] = []
        for host in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                sans.append(x509.DNSName(host))
        return self._issue(
            common_name,
            ExtendedKeyUsageOID.SERVER_AUTH,
            x509.SubjectAlternativeName(sans),
        )

    def client(self, common_name: str) -> KeyPair:
        """A client certificate: the broker's principal becomes ``User:CN=<common_name>``."""
        return self._issue(common_name, ExtendedKeyUsageOID.CLIENT_AUTH, None)

    def _issue(
        self,
        common_name: str,
        usage: x509.ObjectIdentifier,
        sans: x509.SubjectAlternativeName | None,
    ) -> KeyPair:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        builder = (
            self._builder(subject, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(cert_sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), False
            )
        )
        if sans is not None:
            builder = builder.add_extension(sans, critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return KeyPair(cert.public_bytes(serialization.Encoding.PEM).decode(), _pem_key(key))

    def _builder(
        self, subject: x509.Name, public_key: ec.EllipticCurvePublicKey
    ) -> x509.CertificateBuilder:
        now = datetime.datetime.now(datetime.UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._name)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=self.days))
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        )


def _pem_key(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )

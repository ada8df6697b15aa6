"""AutoMTLS certificates (PROTOCOL.md §3), made with ``cryptography``.

Both sides make an ephemeral self-signed ECDSA certificate for "localhost" shaped like go-plugin's (CA, client
and server auth, DNS name "localhost"), so Go peers accept ours and we pin theirs. Go peers always use P-521;
grpcio's TLS stack cannot verify P-521 signatures, so whoever meets a P-521 peer certificate terminates that
TLS session with Python's ``ssl`` module instead (see ``_relay``). ``grpc_can_verify`` tells which path a
certificate needs.
"""

from __future__ import annotations

import base64
import datetime
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from vz_core.errors import PluginError

if TYPE_CHECKING:
    from cryptography import x509

__all__ = ["CertKey", "Curve", "cert_curve", "der_to_pem", "generate_cert", "grpc_can_verify", "load_cert"]

Curve = Literal["P-256", "P-384", "P-521"]
_GRPC_CURVES = {"P-256", "P-384"}
_NAMES = {"secp256r1": "P-256", "secp384r1": "P-384", "secp521r1": "P-521"}


@dataclass(frozen=True)
class CertKey:
    """An ephemeral certificate and its private key (PEM), plus the DER form of the certificate."""

    cert_pem: bytes
    key_pem: bytes
    cert_der: bytes
    curve: Curve

    @property
    def cert_b64(self) -> str:
        """DER, standard base64 without padding: the 6th handshake field."""
        return base64.b64encode(self.cert_der).decode().rstrip("=")

    def __repr__(self) -> str:
        return f"CertKey(curve={self.curve!r}, cert_der=<{len(self.cert_der)} bytes>, key_pem=<hidden>)"


def generate_cert(curve: Curve = "P-256", *, validity_days: int = 365) -> CertKey:
    """A fresh self-signed ECDSA certificate for "localhost" usable as client and server certificate."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    curves: dict[str, ec.EllipticCurve] = {
        "P-256": ec.SECP256R1(),
        "P-384": ec.SECP384R1(),
        "P-521": ec.SECP521R1(),
    }
    hash_for: dict[str, hashes.SHA256 | hashes.SHA384 | hashes.SHA512] = {
        "P-256": hashes.SHA256(),
        "P-384": hashes.SHA384(),
        "P-521": hashes.SHA512(),
    }
    if curve not in curves:
        raise ValueError(f"unsupported curve {curve!r}; use one of {sorted(curves)}")
    key = ec.generate_private_key(curves[curve])
    name = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, "localhost"), x509.NameAttribute(NameOID.ORGANIZATION_NAME, "vz")]
    )
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(int.from_bytes(secrets.token_bytes(16), "big") >> 1)
        .not_valid_before(now - datetime.timedelta(seconds=30))
        .not_valid_after(now + datetime.timedelta(days=validity_days))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=True,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(key, hash_for[curve])
    )
    return CertKey(
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
        cert_der=cert.public_bytes(serialization.Encoding.DER),
        curve=curve,
    )


def load_cert(data: bytes | str) -> x509.Certificate:
    """Parse a PEM or DER certificate; ``PluginError`` when it is neither."""
    from cryptography import x509

    raw = data.encode() if isinstance(data, str) else data
    try:
        if raw.lstrip().startswith(b"-----BEGIN"):
            return x509.load_pem_x509_certificate(raw)
        return x509.load_der_x509_certificate(raw)
    except ValueError as exc:
        raise PluginError(f"malformed AutoMTLS certificate: {exc}") from None


def cert_curve(cert: x509.Certificate) -> str:
    """ "P-256", "P-384", "P-521", another EC curve name, or the key algorithm ("RSA", "Ed25519")."""
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    key = cert.public_key()
    if isinstance(key, ec.EllipticCurvePublicKey):
        return _NAMES.get(key.curve.name, key.curve.name)
    if isinstance(key, rsa.RSAPublicKey):
        return "RSA"
    return type(key).__name__.removesuffix("PublicKey").lstrip("_")


def grpc_can_verify(cert: x509.Certificate) -> bool:
    """True when grpcio's own TLS can verify signatures made with this certificate's key."""
    return cert_curve(cert) in _GRPC_CURVES or cert_curve(cert) == "RSA"


def der_to_pem(der: bytes) -> bytes:
    """PEM text of a DER certificate."""
    body = base64.encodebytes(der).replace(b"\n", b"")
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    return b"-----BEGIN CERTIFICATE-----\n" + b"\n".join(lines) + b"\n-----END CERTIFICATE-----\n"

"""The webhook's serving certificate, made and rotated by the controller: no cert-manager.

A private CA signs a serving certificate for the webhook Service's DNS names. The leading
controller keeps both in one Secret (`tls.crt`, `tls.key`, `ca.crt`, as cert-manager
lays it out) and the CA in the webhook configuration's `caBundle`; every replica serves
what the Secret holds (a mounted volume: the kubelet refreshes it, the server reloads
it). The CA lives ten years and is replaced only when it is missing or unreadable; the
serving certificate lives a year and is renewed once a third of its life is left.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_LIFETIME = dt.timedelta(days=3650)
SERVING_LIFETIME = dt.timedelta(days=365)
CLOCK_SKEW = dt.timedelta(minutes=5)  # not-before is backdated: nodes' clocks differ


@dataclass(frozen=True)
class Bundle:
    """PEM texts: what the Secret and the caBundle hold."""

    ca_cert: bytes
    ca_key: bytes
    cert: bytes
    key: bytes


def dns_names(service: str, namespace: str) -> list[str]:
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def issue(names: list[str], now: dt.datetime, ca: Bundle | None = None) -> Bundle:
    """A serving certificate for `names`, signed by `ca`'s CA (a new CA when None)."""
    if ca is None:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "execwatch-placement-ca")])
        ca_cert = (
            _builder(ca_name, ca_name, ca_key.public_key(), now, CA_LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_usage(cert_sign=True), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
    else:
        ca_cert = x509.load_pem_x509_certificate(ca.ca_cert)
        loaded = serialization.load_pem_private_key(ca.ca_key, None)
        if not isinstance(loaded, ec.EllipticCurvePrivateKey):
            raise ValueError("the CA key is not an EC key")
        ca_key = loaded
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    cert = (
        _builder(subject, ca_cert.subject, key.public_key(), now, SERVING_LIFETIME)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .sign(ca_key, hashes.SHA256())
    )
    return Bundle(_pem(ca_cert), _key_pem(ca_key), _pem(cert), _key_pem(key))


def renewal(bundle: Bundle | None, names: list[str], now: dt.datetime) -> Bundle | None:
    """The bundle to store instead of `bundle`, or None when it is good as it is."""
    if bundle is None:
        return issue(names, now)
    try:
        ca_cert = x509.load_pem_x509_certificate(bundle.ca_cert)
        cert = x509.load_pem_x509_certificate(bundle.cert)
        serialization.load_pem_private_key(bundle.key, None)
        serialization.load_pem_private_key(bundle.ca_key, None)
    except ValueError:
        return issue(names, now)
    if _ca_expiring(ca_cert, now):
        return issue(names, now)
    if _serving_stale(cert, ca_cert, names, now):
        return issue(names, now, bundle)
    return None


def _ca_expiring(ca_cert: x509.Certificate, now: dt.datetime) -> bool:
    return ca_cert.not_valid_after_utc - now < SERVING_LIFETIME


def _serving_stale(
    cert: x509.Certificate, ca_cert: x509.Certificate, names: list[str], now: dt.datetime
) -> bool:
    if cert.issuer != ca_cert.subject:
        return True
    try:
        cert.verify_directly_issued_by(ca_cert)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except (ValueError, TypeError, InvalidSignature, x509.ExtensionNotFound):
        return True
    if sorted(san.value.get_values_for_type(x509.DNSName)) != sorted(names):
        return True
    left = cert.not_valid_after_utc - now
    return left < SERVING_LIFETIME / 3 or cert.not_valid_before_utc > now + CLOCK_SKEW


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    now: dt.datetime,
    lifetime: dt.timedelta,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + lifetime)
    )


def _usage(cert_sign: bool) -> x509.KeyUsage:
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


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )

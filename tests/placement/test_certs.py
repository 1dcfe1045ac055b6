"""The webhook's own certificate: a real TLS handshake against the real server is the
judge, with the CA that would go into the caBundle."""

from __future__ import annotations

import datetime as dt
import socket
import ssl
from pathlib import Path

import pytest

from execwatch.placement.serving import WebhookServer
from execwatch.serving.certs import SERVING_LIFETIME, Bundle, dns_names, issue, renewal

NOW = dt.datetime(2026, 12, 3, tzinfo=dt.UTC)
NAMES = dns_names("execwatch-placement", "execwatch")


def serve(tmp_path: Path, bundle: Bundle) -> WebhookServer:
    (tmp_path / "tls.crt").write_bytes(bundle.cert)
    (tmp_path / "tls.key").write_bytes(bundle.key)
    server = WebhookServer(
        ("127.0.0.1", 0),
        lambda path, body: (200, b"{}"),
        str(tmp_path / "tls.crt"),
        str(tmp_path / "tls.key"),
    )
    server.start()
    return server


def handshake(port: int, ca: bytes, name: str) -> None:
    context = ssl.create_default_context(cadata=ca.decode())
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=name),
    ):
        pass


def test_the_api_server_can_verify_the_webhook_by_its_service_name(tmp_path: Path) -> None:
    bundle = issue(NAMES, dt.datetime.now(dt.UTC))
    server = serve(tmp_path, bundle)
    try:
        for name in NAMES:
            handshake(server.port, bundle.ca_cert, name)
        with pytest.raises(ssl.SSLCertVerificationError):
            handshake(server.port, bundle.ca_cert, "other.execwatch.svc")
        with pytest.raises(ssl.SSLCertVerificationError):
            handshake(server.port, issue(NAMES, dt.datetime.now(dt.UTC)).ca_cert, NAMES[2])
    finally:
        server.stop()


def test_a_rotated_certificate_is_served_after_a_reload_under_the_same_ca(tmp_path: Path) -> None:
    now = dt.datetime.now(dt.UTC)
    first = issue(NAMES, now - SERVING_LIFETIME * 0.7)  # a third of its life is left
    server = serve(tmp_path, first)
    try:
        second = renewal(first, NAMES, now)
        assert second is not None and second.ca_cert == first.ca_cert
        assert second.cert != first.cert
        (tmp_path / "tls.crt").write_bytes(second.cert)
        (tmp_path / "tls.key").write_bytes(second.key)
        server.reload()
        handshake(server.port, first.ca_cert, NAMES[2])
    finally:
        server.stop()


def test_a_fresh_bundle_is_kept_and_a_broken_one_replaced() -> None:
    bundle = issue(NAMES, NOW)
    assert renewal(bundle, NAMES, NOW + dt.timedelta(days=30)) is None
    assert renewal(None, NAMES, NOW) is not None
    broken = Bundle(bundle.ca_cert, bundle.ca_key, b"not a certificate", bundle.key)
    replaced = renewal(broken, NAMES, NOW)
    assert replaced is not None and replaced.ca_cert != bundle.ca_cert


def test_new_service_names_get_a_new_serving_certificate_under_the_same_ca() -> None:
    bundle = issue(NAMES, NOW)
    moved = renewal(bundle, dns_names("renamed", "execwatch"), NOW)
    assert moved is not None and moved.ca_cert == bundle.ca_cert and moved.cert != bundle.cert


def test_a_ca_near_its_end_is_replaced_with_everything_it_signed() -> None:
    bundle = issue(NAMES, NOW)
    late = NOW + dt.timedelta(days=3650) - SERVING_LIFETIME / 2
    replaced = renewal(bundle, NAMES, late)
    assert replaced is not None and replaced.ca_cert != bundle.ca_cert

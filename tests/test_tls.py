"""QUEEN_TLS_CERT_FILE / QUEEN_TLS_KEY_FILE serve HTTPS directly; the official client talks to it with a
self-signed certificate it was told to trust."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from conftest import uniq


def self_signed(dirpath: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = dirpath / "cert.pem", dirpath / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return cert_path, key_path


async def test_https_with_the_official_client(start_broker, tmp_path, monkeypatch):
    cert, key = self_signed(tmp_path)
    b = start_broker(workers=1, env={"QUEEN_TLS_CERT_FILE": str(cert), "QUEEN_TLS_KEY_FILE": str(key)})
    assert b.url.startswith("https://")
    # Plain HTTP on the TLS port is not served; an unverified client is refused by its own check.
    with pytest.raises(httpx.HTTPError):
        httpx.get(b.url + "/health")
    with pytest.raises(httpx.ConnectError):
        httpx.get(b.url + "/health", verify=True)
    ctx = ssl.create_default_context(cafile=str(cert))
    assert httpx.get(b.url + "/health", verify=ctx).status_code == 200

    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # how a user points httpx (under the client) at a CA
    from queen import Queen

    q = uniq("tls")
    async with Queen(b.url) as client:
        await client.queue(q).create()
        await client.queue(q).push([{"data": {"over": "tls"}}])
        got = await client.queue(q).batch(1).wait(False).pop()
        assert [m["data"] for m in got] == [{"over": "tls"}]


def test_tls_settings_are_checked_at_start(tmp_path):
    cert, key = self_signed(tmp_path)
    from broker.config import ConfigError, Settings

    with pytest.raises(ConfigError, match="together"):
        Settings.from_env({"QUEEN_TLS_CERT_FILE": str(cert)})
    with pytest.raises(ConfigError, match="cannot be loaded"):
        Settings.from_env({"QUEEN_TLS_CERT_FILE": str(key), "QUEEN_TLS_KEY_FILE": str(key)})
    s = Settings.from_env({"QUEEN_TLS_CERT_FILE": str(cert), "QUEEN_TLS_KEY_FILE": str(key)})
    assert s.tls and s.ssl_context() is not None
    bad = subprocess.run([sys.executable, "-m", "broker", "serve"], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "QUEEN_TLS_CERT_FILE": str(tmp_path / "missing.pem"), "QUEEN_TLS_KEY_FILE": str(key)})
    assert bad.returncode == 2 and "QUEEN_TLS_CERT_FILE" in bad.stderr

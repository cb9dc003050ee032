"""Credentials to principals: ``broker.auth`` on its own, then through a real broker (auth off on the
shared broker; HS256 and EdDSA at once on a dedicated one) and with tokens minted by ``queen token
create``."""

from __future__ import annotations

import base64
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from helpers import dedicated_broker

from broker.auth import GRANTS, Principal, TokenVerifier, mint
from broker.config import Settings
from broker.errors import Forbidden, Unauthenticated
from broker.process.localserver import LocalBroker

SECRET = "s3cret-for-tests"


def _pem_pair(key) -> tuple[bytes, bytes]:  # type: ignore[no-untyped-def]
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, public


@pytest.fixture(scope="module")
def ed_keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, Path, Path]:
    private, public = _pem_pair(ed25519.Ed25519PrivateKey.generate())
    d = tmp_path_factory.mktemp("ed25519")
    (d / "key.pem").write_bytes(private)
    (d / "pub.pem").write_bytes(public)
    return private, d / "key.pem", d / "pub.pem"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _forge(header: dict, claims: dict, signature: bytes = b"") -> str:
    return f"{_b64(orjson.dumps(header))}.{_b64(orjson.dumps(claims))}.{_b64(signature)}"


def _reason(token: str, verifier: TokenVerifier) -> str:
    with pytest.raises(Unauthenticated) as exc:
        verifier.principal(f"Bearer {token}")
    assert exc.value.status == 401
    return exc.value.reason


# --- broker.auth on its own -------------------------------------------------------------------------


def test_auth_off_gives_the_default_principal_whatever_the_header():
    v = TokenVerifier(Settings(default_tenant="acme", default_sub="anon"))
    assert not v.enabled
    for header in (None, "", "Bearer garbage"):
        assert v.principal(header) == Principal("acme", "anon", GRANTS)


def test_hs256_round_trip_and_header_forms():
    v = TokenVerifier(Settings(jwt_secret=SECRET))
    token = mint(tenant="t1", sub="alice", grants=["produce", "consume"], secret=SECRET)
    want = Principal("t1", "alice", frozenset({"produce", "consume"}))
    assert v.principal(f"Bearer {token}") == want
    assert v.principal(f"bearer   {token}  ") == want  # case-insensitive prefix, whitespace tolerated
    assert v.principal(token) == want  # a bare token is accepted too


def test_refusals_carry_distinct_reasons():
    v = TokenVerifier(Settings(jwt_secret=SECRET))
    now = int(time.time())
    good = mint(tenant="t1", sub="alice", grants=["produce"], secret=SECRET)
    with pytest.raises(Unauthenticated) as exc:
        v.principal(None)
    assert exc.value.reason == "token_missing"
    assert _reason("not-a-jwt", v) == "token_malformed"
    assert _reason("a.b.c", v) == "token_malformed"
    assert _reason(mint(tenant="t1", sub="alice", grants=[], secret="other"), v) == "token_invalid"
    head, body, sig = good.split(".")
    tampered = orjson.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    tampered["tenant"] = "t2"
    assert _reason(f"{head}.{_b64(orjson.dumps(tampered))}.{sig}", v) == "token_invalid"
    assert _reason(_forge({"alg": "none"}, {"sub": "x", "tenant": "t1"}), v) == "token_invalid"
    assert _reason(_forge({"alg": "HS512"}, {"sub": "x", "tenant": "t1"}, b"sig"), v) == "token_invalid"
    assert _reason(mint(tenant="t1", sub="alice", grants=[], ttl_s=-3600, secret=SECRET), v) == "token_expired"
    # Inside the leeway an expired token still passes (clock skew between minting host and broker).
    assert v.principal(mint(tenant="t1", sub="alice", grants=[], ttl_s=-5, secret=SECRET)).sub == "alice"

    def signed(claims: dict) -> str:
        import hashlib
        import hmac

        head = _b64(orjson.dumps({"alg": "HS256"}))
        body = _b64(orjson.dumps(claims))
        return f"{head}.{body}.{_b64(hmac.new(SECRET.encode(), f'{head}.{body}'.encode(), hashlib.sha256).digest())}"

    assert _reason(signed({"sub": "a", "tenant": "t1", "nbf": now + 3600}), v) == "token_not_yet_valid"
    assert _reason(signed({"sub": "a", "tenant": "t1", "exp": "tomorrow"}), v) == "token_expired"
    assert _reason(signed({"tenant": "t1"}), v) == "token_no_sub"
    assert _reason(signed({"sub": "a"}), v) == "token_no_tenant"
    assert _reason(signed({"sub": "a", "tenant": "bad tenant/../x"}), v) == "token_no_tenant"
    assert _reason(signed({"sub": "a", "tenant": "t" * 129}), v) == "token_no_tenant"
    # The space separated ``scope`` claim is read when ``grants`` is absent; unknown grants are dropped.
    p = v.principal(signed({"sub": "a", "tenant": "t1", "scope": "consume root produce"}))
    assert p.grants == frozenset({"consume", "produce"})
    p = v.principal(signed({"sub": "a", "tenant": "t1", "grants": ["admin", "superuser", 7]}))
    assert p.grants == frozenset({"admin"})


def test_eddsa_and_rs256_with_a_public_key(tmp_path: Path):
    def ed():  # type: ignore[no-untyped-def]
        return ed25519.Ed25519PrivateKey.generate()

    def rs():  # type: ignore[no-untyped-def]
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)

    for new_key in (ed, rs):
        private, public = _pem_pair(new_key())
        (tmp_path / "pub.pem").write_bytes(public)
        v = TokenVerifier(Settings(jwt_public_key_file=str(tmp_path / "pub.pem")))
        assert v.enabled
        token = mint(tenant="t9", sub="svc", grants=["consume"], private_key_pem=private)
        assert v.principal(f"Bearer {token}") == Principal("t9", "svc", frozenset({"consume"}))
        # Algorithm confusion: an HS256 token "signed" with the public key as the secret is refused.
        assert _reason(mint(tenant="t9", sub="svc", grants=["admin"], secret=public.decode()), v) == "token_invalid"
        other, _ = _pem_pair(new_key())  # the same kind of key, but not the configured one
        assert _reason(mint(tenant="t9", sub="svc", grants=[], private_key_pem=other), v) == "token_invalid"


def test_unsupported_public_key_type_is_refused(tmp_path: Path):
    _, public = _pem_pair(ec.generate_private_key(ec.SECP256R1()))
    (tmp_path / "ec.pem").write_bytes(public)
    with pytest.raises(ValueError, match="Ed25519 or RSA"):
        TokenVerifier(Settings(jwt_public_key_file=str(tmp_path / "ec.pem")))
    with pytest.raises(ValueError):
        mint(tenant="t", sub="s", grants=[])


def test_grants_admin_implies_every_grant():
    admin = Principal("t", "s", frozenset({"admin"}))
    assert admin.has("produce") and admin.has("consume") and admin.has("admin")
    producer = Principal("t", "s", frozenset({"produce"}))
    producer.require("produce")
    with pytest.raises(Forbidden) as exc:
        producer.require("consume")
    assert exc.value.status == 403 and exc.value.reason == "missing_grant"
    assert exc.value.envelope()["grant"] == "consume"


# --- through a broker -------------------------------------------------------------------------------


def test_auth_off_is_the_default_tenant(http):
    r = http.get("/api/v1/whoami")
    assert r.status_code == 200
    assert r.json() == {"tenant": "default", "sub": "anonymous", "grants": ["admin", "consume", "produce"]}
    # With auth off a header, even a broken one, changes nothing.
    r = http.get("/api/v1/whoami", headers={"Authorization": "Bearer nonsense"})
    assert r.status_code == 200 and r.json()["tenant"] == "default"
    assert http.get("/api/v1/admin/ping").json()["ok"] is True


@pytest.fixture(scope="module")
def auth_broker(pg, ed_keys, tmp_path_factory):
    _, _, public = ed_keys
    env = {"QUEEN_JWT_SECRET": SECRET, "QUEEN_JWT_PUBLIC_KEY_FILE": str(public)}
    with dedicated_broker(pg, tmp_path_factory, "auth", env) as b:
        yield b


def _get(b: LocalBroker, path: str, token: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return httpx.get(b.url + path, headers=headers, timeout=10)


def test_hs256_statuses_through_the_broker(auth_broker):
    b = auth_broker
    r = _get(b, "/api/v1/whoami", None)
    assert r.status_code == 401 and r.json()["error"] == "unauthenticated" and r.json()["reason"] == "token_missing"
    r = _get(b, "/api/v1/whoami", "x.y.z")
    assert r.status_code == 401 and r.json()["reason"] == "token_malformed"
    r = _get(b, "/api/v1/whoami", mint(tenant="acme", sub="bob", grants=["admin"], secret="wrong"))
    assert r.status_code == 401 and r.json()["reason"] == "token_invalid"
    r = _get(b, "/api/v1/whoami", mint(tenant="acme", sub="bob", grants=["admin"], ttl_s=-3600, secret=SECRET))
    assert r.status_code == 401 and r.json()["reason"] == "token_expired"
    # Valid but lacking the grant: 403, retrying will not help.
    producer = mint(tenant="acme", sub="bob", grants=["produce", "teleport"], secret=SECRET)
    r = _get(b, "/api/v1/admin/ping", producer)
    assert r.status_code == 403
    assert r.json()["error"] == "forbidden" and r.json()["reason"] == "missing_grant" and r.json()["grant"] == "admin"
    # Authenticated: 200, the tenant and sub come from the token, the unknown grant is ignored.
    r = _get(b, "/api/v1/whoami", producer)
    assert r.status_code == 200 and r.json() == {"tenant": "acme", "sub": "bob", "grants": ["produce"]}
    admin = mint(tenant="acme", sub="root", grants=["admin"], secret=SECRET)
    r = _get(b, "/api/v1/admin/ping", admin)
    assert r.status_code == 200 and r.json() == {"ok": True, "tenant": "acme", "sub": "root"}
    # A doubled slash reaches the same handler, so it meets the same checks (no way around auth).
    r = _get(b, "//api/v1/whoami", None)
    assert r.status_code == 401 and r.json()["reason"] == "token_missing"
    r = _get(b, "/api//v1/admin/ping", producer)
    assert r.status_code == 403 and r.json()["reason"] == "missing_grant"
    assert _get(b, "//api/v1/whoami", producer).json()["sub"] == "bob"
    # Routes outside /api stay open (probes and scrapers carry no token).
    assert _get(b, "/health", None).status_code == 200
    assert _get(b, "/metrics/prometheus", None).status_code == 200


def test_eddsa_through_the_broker(auth_broker, ed_keys):
    private, _, _ = ed_keys
    token = mint(tenant="edge", sub="device-7", grants=["consume"], private_key_pem=private)
    r = _get(auth_broker, "/api/v1/whoami", token)
    assert r.status_code == 200 and r.json() == {"tenant": "edge", "sub": "device-7", "grants": ["consume"]}
    stranger, _ = _pem_pair(ed25519.Ed25519PrivateKey.generate())
    r = _get(auth_broker, "/api/v1/whoami", mint(tenant="edge", sub="x", grants=["admin"], private_key_pem=stranger))
    assert r.status_code == 401 and r.json()["reason"] == "token_invalid"


def _queen_token(*args: str) -> str:
    out = subprocess.run(
        [str(Path(sys.executable).with_name("queen")), "token", "create", *args],
        capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_queen_token_create_mints_tokens_the_broker_accepts(auth_broker, ed_keys):
    _, key_file, _ = ed_keys
    hs = _queen_token("--tenant", "acme", "--sub", "ci", "--grant", "admin", "--secret", SECRET)
    r = _get(auth_broker, "/api/v1/admin/ping", hs)
    assert r.status_code == 200 and r.json()["sub"] == "ci"
    ed = _queen_token("--tenant", "acme", "--sub", "ci-ed", "--grant", "produce", "--private-key", str(key_file), "--ttl", "60")
    r = _get(auth_broker, "/api/v1/whoami", ed)
    assert r.status_code == 200 and r.json() == {"tenant": "acme", "sub": "ci-ed", "grants": ["produce"]}
    assert _get(auth_broker, "/api/v1/admin/ping", ed).status_code == 403

"""JWT verification per request: ``broker.auth.TokenVerifier`` (PyJWT) vs the hand-written compact JWS
verifier it replaced (kept here, verbatim in behaviour, as the baseline).

Each round verifies one token carrying the usual claims (sub, tenant, grants, iat, exp): header
parsing, the algorithm allow-list, the signature and the claims rules. Per algorithm the broker accepts
(HS256 shared secret, EdDSA Ed25519, RS256 RSA 2048), two groups: "first sight" (PyJWT parses and verifies;
its strict canonical-base64 check is most of its cost) and "seen before" (the verifier's per-worker cache
of verified tokens, exp/nbf rechecked: what every request of a client after its first pays). The
hand-written baseline had no cache and paid the same on every request. ``ratio`` = ours / hand-written.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time

import orjson
import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, padding, rsa

from broker.auth import TokenVerifier, mint
from broker.config import Settings

SECRET = "bench-secret-0123456789abcdef0123456789"
LEEWAY_S = 30
_TENANT_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:")


def _b64d(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


class HandWritten:
    """The verifier broker/auth.py carried before it moved to PyJWT (same checks, same order)."""

    def __init__(self, secret: bytes | None, public: object | None) -> None:
        self._secret, self._public = secret, public

    def principal(self, authorization: str) -> tuple[str, str, frozenset[str]]:
        token = authorization.strip()
        if token[:7].lower() == "bearer ":
            token = token[7:].strip()
        parts = token.split(".")
        if len(parts) != 3:
            raise ValueError("token_malformed")
        try:
            header = orjson.loads(_b64d(parts[0]))
            claims = orjson.loads(_b64d(parts[1]))
            signature = _b64d(parts[2])
        except (binascii.Error, ValueError, orjson.JSONDecodeError):
            raise ValueError("token_malformed") from None
        if not isinstance(header, dict) or not isinstance(claims, dict):
            raise ValueError("token_malformed")
        if not self._signature_ok(header.get("alg"), f"{parts[0]}.{parts[1]}".encode(), signature):
            raise ValueError("token_invalid")
        now = time.time()
        exp, nbf = claims.get("exp"), claims.get("nbf")
        if exp is not None and (not isinstance(exp, int | float) or now > exp + LEEWAY_S):
            raise ValueError("token_expired")
        if nbf is not None and (not isinstance(nbf, int | float) or now + LEEWAY_S < nbf):
            raise ValueError("token_not_yet_valid")
        sub, tenant = claims.get("sub"), claims.get("tenant")
        if not isinstance(sub, str) or not sub:
            raise ValueError("token_no_sub")
        if not isinstance(tenant, str) or not tenant or len(tenant) > 128 or not set(tenant) <= _TENANT_CHARS:
            raise ValueError("token_no_tenant")
        raw = claims.get("grants")
        if raw is None and isinstance(claims.get("scope"), str):
            raw = claims["scope"].split()
        return tenant, sub, frozenset(g for g in (raw or []) if isinstance(g, str))

    def _signature_ok(self, alg: object, signing_input: bytes, signature: bytes) -> bool:
        if alg == "HS256" and self._secret is not None:
            return hmac.compare_digest(hmac.new(self._secret, signing_input, hashlib.sha256).digest(), signature)
        try:
            if alg == "EdDSA" and isinstance(self._public, ed25519.Ed25519PublicKey):
                self._public.verify(signature, signing_input)
                return True
            if alg == "RS256" and isinstance(self._public, rsa.RSAPublicKey):
                self._public.verify(signature, signing_input, padding.PKCS1v15(), hashes.SHA256())
                return True
        except InvalidSignature:
            return False
        return False


def _pem(key) -> tuple[bytes, bytes]:  # type: ignore[no-untyped-def]
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, public


def _case(alg: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, TokenVerifier, HandWritten]:
    grants = ["produce", "consume"]
    if alg == "HS256":
        token = mint(tenant="acme", sub="svc", grants=grants, secret=SECRET)
        return token, TokenVerifier(Settings(jwt_secret=SECRET)), HandWritten(SECRET.encode(), None)
    key = ed25519.Ed25519PrivateKey.generate() if alg == "EdDSA" else rsa.generate_private_key(65537, 2048)
    private, public = _pem(key)
    path = tmp_path_factory.mktemp("bench-auth") / "pub.pem"
    path.write_bytes(public)
    token = mint(tenant="acme", sub="svc", grants=grants, private_key_pem=private)
    return token, TokenVerifier(Settings(jwt_public_key_file=str(path))), HandWritten(None, key.public_key())


ALGS = ["HS256", "EdDSA", "RS256"]
WANT = ("acme", "svc", frozenset({"produce", "consume"}))


@pytest.mark.parametrize("group", ["first sight", "seen before"])
@pytest.mark.parametrize("alg", ALGS)
def test_verify_baseline_hand_written(benchmark, alg, group, tmp_path_factory):  # type: ignore[no-untyped-def]
    benchmark.group = f"JWT verify {alg}, token {group}"
    benchmark.extra_info["role"] = "baseline"
    token, _, hand = _case(alg, tmp_path_factory)
    assert benchmark(hand.principal, f"Bearer {token}") == WANT


@pytest.mark.parametrize("alg", ALGS)
def test_verify_pyjwt_first_sight(benchmark, alg, tmp_path_factory):  # type: ignore[no-untyped-def]
    """Every round parses and verifies (the per-worker cache bypassed): a token's first request."""
    benchmark.group = f"JWT verify {alg}, token first sight"
    benchmark.extra_info["role"] = "ours"
    token, verifier, _ = _case(alg, tmp_path_factory)
    _, _, p = benchmark(verifier.verify_uncached, token)
    assert (p.tenant, p.sub, p.grants) == WANT


@pytest.mark.parametrize("alg", ALGS)
def test_verify_pyjwt_seen_before(benchmark, alg, tmp_path_factory):  # type: ignore[no-untyped-def]
    """The same token again (every request of a client after its first): a cache hit, exp/nbf rechecked."""
    benchmark.group = f"JWT verify {alg}, token seen before"
    benchmark.extra_info["role"] = "ours"
    token, verifier, _ = _case(alg, tmp_path_factory)
    p = benchmark(verifier.principal, f"Bearer {token}")
    assert (p.tenant, p.sub, p.grants) == WANT

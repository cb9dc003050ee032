"""Credentials to principals.

A request's credential (``Authorization: Bearer <jwt>``) becomes a ``Principal(tenant, sub, grants)``.
With authentication off (no ``QUEEN_JWT_SECRET`` and no ``QUEEN_JWT_PUBLIC_KEY_FILE``) every request is
the default tenant's, with every grant and the fixed default sub. The sub is the only source of
``producerSub`` anywhere in the product.

Tokens are compact JWS: HS256 (shared secret), EdDSA (Ed25519) or RS256 (RSA) via ``cryptography``.
Claims read: ``sub`` (required), ``tenant`` (required), ``grants`` (list, or ``scope`` as a space
separated string), ``exp`` / ``nbf`` (checked with a small leeway). Unknown grants are ignored.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, padding, rsa

from broker.config import Settings
from broker.errors import Forbidden, Unauthenticated

GRANTS = frozenset({"produce", "consume", "admin"})
LEEWAY_S = 30
_TENANT_RE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:")


@dataclass(frozen=True)
class Principal:
    tenant: str
    sub: str
    grants: frozenset[str]

    def has(self, grant: str) -> bool:
        return grant in self.grants or "admin" in self.grants

    def require(self, grant: str) -> None:
        if not self.has(grant):
            raise Forbidden(
                "missing_grant",
                f"this credential lacks the {grant!r} grant",
                code="forbidden",
                extra={"grant": grant},
            )


def _b64url_decode(part: str) -> bytes:
    pad = "=" * (-len(part) % 4)
    return base64.urlsafe_b64decode(part + pad)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenVerifier:
    def __init__(self, settings: Settings) -> None:
        self.enabled = settings.auth_enabled
        self.default = Principal(settings.default_tenant, settings.default_sub, GRANTS)
        self._secret = settings.jwt_secret.encode() if settings.jwt_secret else None
        self._public = None
        if settings.jwt_public_key_file:
            self._public = serialization.load_pem_public_key(Path(settings.jwt_public_key_file).read_bytes())
            if not isinstance(self._public, ed25519.Ed25519PublicKey | rsa.RSAPublicKey):
                raise ValueError("QUEEN_JWT_PUBLIC_KEY_FILE must hold an Ed25519 or RSA public key")

    def principal(self, authorization: str | None) -> Principal:
        if not self.enabled:
            return self.default
        if not authorization:
            raise Unauthenticated("token_missing", "an Authorization: Bearer <token> header is required")
        token = authorization.strip()
        if token[:7].lower() == "bearer ":
            token = token[7:].strip()
        return self.verify(token)

    def verify(self, token: str) -> Principal:
        parts = token.split(".")
        if len(parts) != 3:
            raise Unauthenticated("token_malformed", "the bearer token is not a compact JWS (three dot-separated parts)")
        try:
            header = orjson.loads(_b64url_decode(parts[0]))
            claims = orjson.loads(_b64url_decode(parts[1]))
            signature = _b64url_decode(parts[2])
        except (binascii.Error, ValueError, orjson.JSONDecodeError):
            raise Unauthenticated("token_malformed", "the bearer token does not decode") from None
        if not isinstance(header, dict) or not isinstance(claims, dict):
            raise Unauthenticated("token_malformed", "the token header and claims must be JSON objects")
        alg = header.get("alg")
        signing_input = f"{parts[0]}.{parts[1]}".encode()
        if not self._signature_ok(alg, signing_input, signature):
            raise Unauthenticated("token_invalid", "the token signature does not verify")
        now = time.time()
        exp = claims.get("exp")
        if exp is not None and (not isinstance(exp, int | float) or now > exp + LEEWAY_S):
            raise Unauthenticated("token_expired", "the token has expired")
        nbf = claims.get("nbf")
        if nbf is not None and (not isinstance(nbf, int | float) or now + LEEWAY_S < nbf):
            raise Unauthenticated("token_not_yet_valid", "the token is not valid yet (nbf)")
        sub, tenant = claims.get("sub"), claims.get("tenant")
        if not isinstance(sub, str) or not sub:
            raise Unauthenticated("token_no_sub", "the token carries no sub claim")
        if not isinstance(tenant, str) or not tenant or len(tenant) > 128 or not set(tenant) <= _TENANT_RE_CHARS:
            raise Unauthenticated("token_no_tenant", "the token carries no valid tenant claim")
        raw = claims.get("grants")
        if raw is None and isinstance(claims.get("scope"), str):
            raw = claims["scope"].split()
        grants = frozenset(g for g in (raw or []) if isinstance(g, str) and g in GRANTS)
        return Principal(tenant=tenant, sub=sub, grants=grants)

    def _signature_ok(self, alg: object, signing_input: bytes, signature: bytes) -> bool:
        if alg == "HS256" and self._secret is not None:
            expected = hmac.new(self._secret, signing_input, hashlib.sha256).digest()
            return hmac.compare_digest(expected, signature)
        try:
            if alg == "EdDSA" and isinstance(self._public, ed25519.Ed25519PublicKey):
                self._public.verify(signature, signing_input)
                return True
            if alg == "RS256" and isinstance(self._public, rsa.RSAPublicKey):
                self._public.verify(signature, signing_input, padding.PKCS1v15(), hashes.SHA256())
                return True
        except InvalidSignature:
            return False
        return False  # "none", unknown algorithms, or an algorithm with no configured key


def mint(
    *,
    tenant: str,
    sub: str,
    grants: list[str],
    ttl_s: int | None = 3600,
    secret: str | None = None,
    private_key_pem: bytes | None = None,
) -> str:
    """Mint a token (``queen token create`` and the tests). HS256 with ``secret``; EdDSA or RS256 with
    a PEM private key (the algorithm follows the key type)."""
    claims: dict[str, object] = {"sub": sub, "tenant": tenant, "grants": sorted(set(grants)), "iat": int(time.time())}
    if ttl_s is not None:
        claims["exp"] = int(time.time()) + ttl_s
    if secret is not None:
        alg = "HS256"
    elif private_key_pem is not None:
        key = serialization.load_pem_private_key(private_key_pem, password=None)
        alg = "EdDSA" if isinstance(key, ed25519.Ed25519PrivateKey) else "RS256"
    else:
        raise ValueError("mint needs a secret or a private key")
    head = _b64url(orjson.dumps({"alg": alg, "typ": "JWT"}))
    body = _b64url(orjson.dumps(claims))
    signing_input = f"{head}.{body}".encode()
    if alg == "HS256":
        sig = hmac.new(secret.encode(), signing_input, hashlib.sha256).digest()  # type: ignore[union-attr]
    elif alg == "EdDSA":
        sig = key.sign(signing_input)  # type: ignore[union-attr,call-arg]
    else:
        sig = key.sign(signing_input, padding.PKCS1v15(), hashes.SHA256())  # type: ignore[union-attr,call-arg,arg-type]
    return f"{head}.{body}.{_b64url(sig)}"

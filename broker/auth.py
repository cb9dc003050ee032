"""Credentials to principals.

A request's credential (``Authorization: Bearer <jwt>``) becomes a ``Principal(tenant, sub, grants)``.
With authentication off (no ``QUEEN_JWT_SECRET`` and no ``QUEEN_JWT_PUBLIC_KEY_FILE``) every request is
the default tenant's, with every grant and the fixed default sub. The sub is the only source of
``producerSub`` anywhere in the product.

Tokens are compact JWS, parsed and verified by PyJWT (its JWS layer) against an explicit allow-list,
one algorithm per configured key: HS256 for ``QUEEN_JWT_SECRET``, EdDSA for an Ed25519 public key, RS256
for an RSA one. The PyJWS registry holds only those algorithms, and each is bound to its own key: a token
naming any other (``none``, HS512, RS256 when only a secret is configured, HS256 "signed" with the public
key...) is refused before any key is used.

Claims rules (ours, applied to the verified claims): ``sub`` (required, non-empty string), ``tenant``
(required, 1-128 of ``a-z A-Z 0-9 . _ - :``), ``grants`` (a list, or ``scope`` as a space separated
string; unknown grants are ignored), ``exp`` / ``nbf`` (numbers, checked with a 30 s leeway; any other
type is refused). ``iat`` is not checked. We do not use PyJWT's JWT-layer claim checks: they coerce
``exp``/``nbf`` strings with ``int()`` (``"99999999999"`` would pass) and report a non-numeric ``exp`` as a
decode error, which would change both the rules and the reasons.

Refusal reasons (401 ``unauthenticated``): ``token_missing``, ``token_malformed``, ``token_invalid``
(signature, algorithm or key), ``token_expired``, ``token_not_yet_valid``, ``token_no_sub``,
``token_no_tenant``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
import orjson
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from jwt.algorithms import HMACAlgorithm

from broker.config import Settings
from broker.errors import Forbidden, Unauthenticated

log = logging.getLogger("queen.auth")

GRANTS = frozenset({"produce", "consume", "admin"})
LEEWAY_S = 30
# Verified tokens remembered per worker (token string -> exp, nbf, principal). A client reuses one token
# for many requests; PyJWT's strict parse costs ~50 us a token, a dict hit ~1 us. Only tokens whose
# signature verified under this process's keys get in, so garbage cannot fill it; exp/nbf are checked
# again on every hit. Oldest entry out when full.
CACHE_MAX = 4096
_TENANT_RE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:")


class _HS256(HMACAlgorithm):
    """PyJWT's HMAC-SHA256, minus two per-call guards that do not apply here: the short-key warning
    (issued on every verify; we log it once at start instead) and the refusal of a secret that looks
    like a PEM key (an alg-confusion guard for callers that hand one key to every algorithm; ours binds
    each algorithm to its own key, and ``mint`` must be able to forge such a token for the tests)."""

    def __init__(self) -> None:
        super().__init__(HMACAlgorithm.SHA256)

    def prepare_key(self, key: str | bytes) -> bytes:
        return key.encode() if isinstance(key, str) else key

    def check_key_length(self, key: bytes) -> str | None:
        return None


def _jws(algorithms: list[str]) -> jwt.PyJWS:
    """A PyJWS whose registry holds exactly ``algorithms`` (none other can even be looked up)."""
    jws = jwt.PyJWS(algorithms=algorithms)
    if "HS256" in algorithms:
        jws.unregister_algorithm("HS256")
        jws.register_algorithm("HS256", _HS256())
    return jws


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


class TokenVerifier:
    def __init__(self, settings: Settings) -> None:
        self.enabled = settings.auth_enabled
        self.default = Principal(settings.default_tenant, settings.default_sub, GRANTS)
        # The allow-list: algorithm -> the one key that may verify it.
        self._keys: dict[str, Any] = {}
        if settings.jwt_secret:
            self._keys["HS256"] = settings.jwt_secret.encode()
        if settings.jwt_public_key_file:
            public = serialization.load_pem_public_key(Path(settings.jwt_public_key_file).read_bytes())
            if isinstance(public, ed25519.Ed25519PublicKey):
                self._keys["EdDSA"] = public
            elif isinstance(public, rsa.RSAPublicKey):
                self._keys["RS256"] = public
            else:
                raise ValueError("QUEEN_JWT_PUBLIC_KEY_FILE must hold an Ed25519 or RSA public key")
        if settings.jwt_secret and len(self._keys["HS256"]) < 32:
            log.warning("QUEEN_JWT_SECRET is %d bytes; RFC 7518 asks for at least 32 for HS256", len(self._keys["HS256"]))
        self._jws = _jws(list(self._keys))
        self._only = next(iter(self._keys.items())) if len(self._keys) == 1 else None
        self._cache: dict[str, tuple[object, object, Principal]] = {}

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
        hit = self._cache.get(token)
        if hit is not None:
            exp, nbf, p = hit
            _check_times(exp, nbf)
            return p
        exp, nbf, p = self.verify_uncached(token)
        if len(self._cache) >= CACHE_MAX:
            self._cache.pop(next(iter(self._cache)))
        self._cache[token] = (exp, nbf, p)
        return p

    def verify_uncached(self, token: str) -> tuple[object, object, Principal]:
        """Parse and verify with PyJWT, then apply the claims rules: ``(exp, nbf, principal)``."""
        if token.count(".") != 2:
            raise Unauthenticated("token_malformed", "the bearer token is not a compact JWS (three dot-separated parts)")
        if self._only is not None:
            alg, key = self._only
        else:  # several keys: the header names the algorithm, which picks the key (or nothing)
            try:
                named = self._jws.get_unverified_header(token).get("alg")
            except jwt.PyJWTError:
                raise Unauthenticated("token_malformed", "the bearer token does not decode") from None
            if not isinstance(named, str) or named not in self._keys:  # "none", unknown, or no key for it
                raise Unauthenticated("token_invalid", "the token signature does not verify")
            alg, key = named, self._keys[named]
        try:
            payload = self._jws.decode(token, key, algorithms=[alg])
        except jwt.InvalidSignatureError:  # a DecodeError subclass: test it first
            raise Unauthenticated("token_invalid", "the token signature does not verify") from None
        except jwt.DecodeError:
            raise Unauthenticated("token_malformed", "the bearer token does not decode") from None
        except jwt.PyJWTError:  # InvalidAlgorithmError (none, another algorithm), an unsupported crit header...
            raise Unauthenticated("token_invalid", "the token signature does not verify") from None
        try:
            claims = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise Unauthenticated("token_malformed", "the token claims are not JSON") from None
        if not isinstance(claims, dict):
            raise Unauthenticated("token_malformed", "the token claims must be a JSON object")
        exp, nbf = claims.get("exp"), claims.get("nbf")
        _check_times(exp, nbf)
        return exp, nbf, _principal(claims)


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _check_times(exp: object, nbf: object) -> None:
    now = time.time()
    if exp is not None and (not _number(exp) or now > exp + LEEWAY_S):  # type: ignore[operator]
        raise Unauthenticated("token_expired", "the token has expired")
    if nbf is not None and (not _number(nbf) or now + LEEWAY_S < nbf):  # type: ignore[operator]
        raise Unauthenticated("token_not_yet_valid", "the token is not valid yet (nbf)")


def _principal(claims: dict[str, Any]) -> Principal:
    sub, tenant = claims.get("sub"), claims.get("tenant")
    if not isinstance(sub, str) or not sub:
        raise Unauthenticated("token_no_sub", "the token carries no sub claim")
    if not isinstance(tenant, str) or not tenant or len(tenant) > 128 or not set(tenant) <= _TENANT_RE_CHARS:
        raise Unauthenticated("token_no_tenant", "the token carries no valid tenant claim")
    raw = claims.get("grants")
    if raw is None and isinstance(claims.get("scope"), str):
        raw = claims["scope"].split()
    grants = frozenset(g for g in (raw if isinstance(raw, list) else []) if isinstance(g, str) and g in GRANTS)
    return Principal(tenant=tenant, sub=sub, grants=grants)


def mint(
    *,
    tenant: str,
    sub: str,
    grants: list[str],
    ttl_s: int | None = 3600,
    secret: str | None = None,
    private_key_pem: bytes | None = None,
) -> str:
    """Mint a token (``queen token create`` and the tests) with PyJWT. HS256 with ``secret``; EdDSA or
    RS256 with a PEM private key (the algorithm follows the key type)."""
    now = int(time.time())
    claims: dict[str, object] = {"sub": sub, "tenant": tenant, "grants": sorted(set(grants)), "iat": now}
    if ttl_s is not None:
        claims["exp"] = now + ttl_s
    key: Any
    if secret is not None:
        key, alg = secret.encode(), "HS256"
    elif private_key_pem is not None:
        key = serialization.load_pem_private_key(private_key_pem, password=None)
        if isinstance(key, ed25519.Ed25519PrivateKey):
            alg = "EdDSA"
        elif isinstance(key, rsa.RSAPrivateKey):
            alg = "RS256"
        else:
            raise ValueError("the private key must be Ed25519 or RSA")
    else:
        raise ValueError("mint needs a secret or a private key")
    return _jws([alg]).encode(orjson.dumps(claims), key, algorithm=alg, headers={"typ": "JWT"})

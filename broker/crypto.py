"""Encryption at rest: AES-256-GCM with a key ring.

The ring comes from ``QUEEN_ENCRYPTION_KEYS`` (``id:base64,id:base64``). The first key encrypts; every
key decrypts, so rotation is: put the new key first, keep the old one until nothing encrypted under it
is left, then drop it. The key id is stored next to the ciphertext. A blob is ``nonce(12) || ct+tag``.
The associated data binds a ciphertext to its tenant and queue, so it cannot be replayed elsewhere.
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

NONCE_BYTES = 12


class KeyMissing(LookupError):
    """The key a ciphertext names is not in the ring (removed, or never configured here)."""


class DecryptFailed(ValueError):
    """The ciphertext or its associated data does not authenticate under the named key."""


class NoEncryptionKey(RuntimeError):
    """A queue asks for encryption but the broker has no key ring."""


def aad_for(tenant: str, queue: str) -> bytes:
    return f"queen:{tenant}:{queue}".encode()


class KeyRing:
    def __init__(self, keys: tuple[tuple[str, bytes], ...] | list[tuple[str, bytes]]) -> None:
        self._order = [k for k, _ in keys]
        self._keys = {k: AESGCM(v) for k, v in keys}

    @property
    def active_id(self) -> str | None:
        return self._order[0] if self._order else None

    def __bool__(self) -> bool:
        return bool(self._order)

    def encrypt(self, plaintext: bytes, aad: bytes) -> tuple[str, bytes]:
        key_id = self.active_id
        if key_id is None:
            raise NoEncryptionKey("encryption at rest is enabled on this queue but QUEEN_ENCRYPTION_KEYS is empty")
        nonce = os.urandom(NONCE_BYTES)
        return key_id, nonce + self._keys[key_id].encrypt(nonce, plaintext, aad)

    def decrypt(self, key_id: str, blob: bytes, aad: bytes) -> bytes:
        aes = self._keys.get(key_id)
        if aes is None:
            raise KeyMissing(key_id)
        try:
            return aes.decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], aad)
        except InvalidTag as exc:
            raise DecryptFailed(key_id) from exc

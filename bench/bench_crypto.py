"""AES-256-GCM: the broker's key ring (broker.crypto.KeyRing) vs a bare ``AESGCM`` call.

Encrypt and decrypt of a 1 KiB payload with the tenant/queue associated data. The key ring adds the
key-id lookup, nonce handling and the blob layout; the baseline is the same AEAD with none of that.
"""

from __future__ import annotations

import os

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from broker.crypto import KeyRing, aad_for

KEY = bytes(range(32))
PAYLOAD = os.urandom(1024)
AAD = aad_for("acme", "billing")


def test_aesgcm_roundtrip_baseline(benchmark):  # type: ignore[no-untyped-def]
    benchmark.group = "AES-GCM 1 KiB round trip"
    benchmark.extra_info["role"] = "baseline"
    aes = AESGCM(KEY)

    def go() -> bytes:
        nonce = os.urandom(12)
        ct = aes.encrypt(nonce, PAYLOAD, AAD)
        return aes.decrypt(nonce, ct, AAD)

    assert benchmark(go) == PAYLOAD


def test_aesgcm_roundtrip_keyring(benchmark):  # type: ignore[no-untyped-def]
    benchmark.group = "AES-GCM 1 KiB round trip"
    benchmark.extra_info["role"] = "ours"
    ring = KeyRing((("k2", KEY), ("k1", bytes(32))))

    def go() -> bytes:
        key_id, blob = ring.encrypt(PAYLOAD, AAD)
        return ring.decrypt(key_id, blob, AAD)

    assert benchmark(go) == PAYLOAD

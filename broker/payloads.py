"""Stored payloads: how a message's JSON bytes become the (payload, codec, key_id) the log stores, and back.

Order on the way in: compress (zstd, above the threshold) then encrypt (AES-GCM, when the destination
queue encrypts at rest). On the way out: decrypt with the stored key id, then decompress. Both the
push path and timer scheduling use ``seal``; the sweeper moves sealed bytes into the log untouched,
so a timer's payload is encrypted from the moment it is scheduled (timer-routes.md, "Encryption
happens at schedule"). ``open_`` never raises for a missing key: it returns ``Undecryptable`` so a
pop can deliver the frame marked as such instead of failing or wedging the partition.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from broker.codec import Codec, CodecError
from broker.crypto import DecryptFailed, KeyMissing, KeyRing, aad_for


class NotJson(ValueError):
    pass


def client_json(codec: Codec, body: bytes, *, zstd: bool) -> bytes:
    """A client's payload as the JSON bytes the log stores: decompressed first when the client sent a
    zstd frame, then checked to be one JSON document. Raises ``CodecError`` (not a zstd frame) or
    ``NotJson``. The timers judge a payload with this at schedule and again at the fire."""
    if zstd:
        body = codec.decompress(body)
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise NotJson(str(exc)) from None
    return body


@dataclass(frozen=True)
class Sealed:
    payload: bytes
    codec: int
    key_id: str | None


@dataclass(frozen=True)
class Undecryptable:
    key_id: str
    reason: str  # "key_missing" | "decrypt_failed" | "corrupt"


def seal(codec: Codec, keyring: KeyRing, tenant: str, queue: str, data: bytes, *, encrypt: bool) -> Sealed:
    c, body = codec.pack(data)
    if not encrypt:
        return Sealed(body, c, None)
    key_id, blob = keyring.encrypt(body, aad_for(tenant, queue))
    return Sealed(blob, c, key_id)


def open_(codec: Codec, keyring: KeyRing, tenant: str, queue: str, sealed: Sealed) -> bytes | Undecryptable:
    body = sealed.payload
    if sealed.key_id is not None:
        try:
            body = keyring.decrypt(sealed.key_id, body, aad_for(tenant, queue))
        except KeyMissing:
            return Undecryptable(sealed.key_id, "key_missing")
        except DecryptFailed:
            return Undecryptable(sealed.key_id, "decrypt_failed")
    try:
        return codec.unpack(sealed.codec, body)
    except CodecError:
        return Undecryptable(sealed.key_id or "", "corrupt")

"""Payload compression with zstd: large payloads are stored compressed, transparently to clients.

``CODEC_RAW`` and ``CODEC_ZSTD`` are the values of the ``codec`` column. Compression happens only at or
above the threshold and only when it saves bytes; otherwise the payload is stored raw.
"""

from __future__ import annotations

import zstandard

CODEC_RAW = 0
CODEC_ZSTD = 1
# A decompressed payload may not exceed this many bytes (a zstd bomb stops here, not in memory).
MAX_DECOMPRESSED = 64 * 1024 * 1024


class CodecError(ValueError):
    pass


class Codec:
    def __init__(self, threshold: int, level: int = 3) -> None:
        self.threshold = threshold
        self._c = zstandard.ZstdCompressor(level=level, write_content_size=True)
        self._d = zstandard.ZstdDecompressor()

    def pack(self, payload: bytes) -> tuple[int, bytes]:
        if self.threshold and len(payload) >= self.threshold:
            z = self._c.compress(payload)
            if len(z) < len(payload):
                return CODEC_ZSTD, z
        return CODEC_RAW, payload

    def unpack(self, codec: int, data: bytes) -> bytes:
        if codec == CODEC_RAW:
            return data
        if codec == CODEC_ZSTD:
            return self.decompress(data)
        raise CodecError(f"unknown codec {codec}")

    def decompress(self, data: bytes) -> bytes:
        try:
            return self._d.decompress(data, max_output_size=MAX_DECOMPRESSED)
        except zstandard.ZstdError as exc:
            raise CodecError(f"not a valid zstd frame: {exc}") from exc

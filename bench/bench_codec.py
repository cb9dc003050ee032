"""zstd: the broker's codec (broker.codec.Codec pack + unpack) vs raw ``zstandard`` calls.

A 16 KiB JSON-like payload (compressible, above the default 1 KiB threshold), compressed then
decompressed. The codec adds the threshold check, the "only when it saves bytes" rule and the bounded
decompression; the baseline is one compressor and one decompressor at the same level.
"""

from __future__ import annotations

import json

import zstandard

from broker.codec import CODEC_ZSTD, Codec

PAYLOAD = json.dumps([{"order": i, "sku": f"SKU-{i % 37:04d}", "qty": i % 5, "note": "gift wrap please"}
                      for i in range(200)]).encode()


def test_zstd_roundtrip_baseline(benchmark):  # type: ignore[no-untyped-def]
    benchmark.group = "zstd 16 KiB round trip"
    benchmark.extra_info["role"] = "baseline"
    c = zstandard.ZstdCompressor(level=3, write_content_size=True)
    d = zstandard.ZstdDecompressor()
    assert benchmark(lambda: d.decompress(c.compress(PAYLOAD))) == PAYLOAD


def test_zstd_roundtrip_codec(benchmark):  # type: ignore[no-untyped-def]
    benchmark.group = "zstd 16 KiB round trip"
    benchmark.extra_info["role"] = "ours"
    codec = Codec(threshold=1024, level=3)

    def go() -> bytes:
        kind, body = codec.pack(PAYLOAD)
        assert kind == CODEC_ZSTD
        return codec.unpack(kind, body)

    assert benchmark(go) == PAYLOAD

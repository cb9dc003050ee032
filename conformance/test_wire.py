"""The official client's opt-in wire formats and conflation, as HTTP (docs/protocol.md §1.9-1.11, §2.4).

The bodies are built and the framed answers read by the small codec below (the suite imports neither
the broker nor the client): a target that does not offer a format is caught by the answer it gives.
"""

from __future__ import annotations

import json
import os
import struct
import uuid
from typing import Any

import pytest
import zstandard

from conformance.client import OK, empty_pop, expect, expect_error, not_verified, pushed, uniq

contract = pytest.mark.contract
BINARY = {"Content-Type": "application/x-queen-push"}


# ------------------------------------------------------------------------------------------ the codec


def _s16(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<H", len(raw)) + raw


def qpb1(groups: list[tuple[str, str, list[tuple[str, Any]]]]) -> bytes:
    """A QPB1 body with flag 4: groups of (queue, partition, [(transactionId, payload)])."""
    out = [b"QPB1", bytes([4]), struct.pack("<I", len(groups))]
    for queue, partition, items in groups:
        out += [_s16(queue), _s16(partition), struct.pack("<I", len(items))]
        for txn, payload in items:
            doc = json.dumps(payload).encode()
            out += [_s16(txn), struct.pack("<I", len(doc)), doc]
    return b"".join(out)


def v7() -> uuid.UUID:
    raw = bytearray(os.urandom(16))
    raw[6], raw[8] = 0x70 | (raw[6] & 0x0F), 0x80 | (raw[8] & 0x3F)
    return uuid.UUID(bytes=bytes(raw))


def framed_groups(groups: list[tuple[str, str, list[tuple[uuid.UUID, str, Any]]]]) -> bytes:
    """``u32 groups`` then flag-8 groups: (queue, partition, [(message id, transactionId, payload)])."""
    out = [struct.pack("<I", len(groups))]
    for queue, partition, items in groups:
        frames = b""
        for mid, txn, payload in items:
            inner = b"\x00" + mid.bytes + _s16(txn) + json.dumps(payload).encode()
            frames += struct.pack("<I", len(inner)) + inner
        z = zstandard.ZstdCompressor(write_content_size=True).compress(frames)
        out += [_s16(queue), _s16(partition), struct.pack("<II", len(items), len(z)), z]
    return b"".join(out)


def read_qpf1(data: bytes) -> dict[str, Any]:
    """The framed pop answer as the dict the JSON answer is (the layout of docs/protocol.md §1.11)."""
    at = 0

    def take(fmt: str) -> Any:
        nonlocal at
        values = struct.unpack_from("<" + fmt, data, at)
        at += struct.calcsize("<" + fmt)
        return values if len(values) > 1 else values[0]

    def text() -> str:
        nonlocal at
        n = take("H")
        at += n
        return data[at - n:at].decode()

    assert data[:4] == b"QPF1", data[:16]
    at = 4
    own: dict[str, Any] = {}
    if take("B") == 1:
        n = take("I")
        own = json.loads(data[at:at + n] or b"{}")
        at += n
    queue, lease, group = text(), text(), text()
    msgs = []
    for _ in range(take("I")):
        pid, partition = str(take("Q")), text()
        start, end, attempt, records = take("QQII")
        for _ in range(records):
            base, _created, count, codec, size = take("QqIBI")
            raw = data[at:at + size]
            at += size
            if codec == 1:
                raw = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
            pos = 0
            for i in range(count):
                (flen,) = struct.unpack_from("<I", raw, pos)
                frame, pos = raw[pos + 4:pos + 4 + flen], pos + 4 + flen
                flags, mid, cur = frame[0], uuid.UUID(bytes=frame[1:17]), 17 + (16 if frame[0] & 1 else 0)
                (tl,) = struct.unpack_from("<H", frame, cur)
                txn, cur = frame[cur + 2:cur + 2 + tl].decode(), cur + 2 + tl
                if flags & 2:
                    (pl,) = struct.unpack_from("<H", frame, cur)
                    cur += 2 + pl
                if start <= base + i <= end:
                    msgs.append({"id": str(mid), "transactionId": txn, "data": json.loads(frame[cur:]),
                                 "partitionId": pid, "partition": partition, "deliveryAttempt": attempt,
                                 "offset": base + i})
    return {"queue": queue, "leaseId": lease, "consumerGroup": group, "messages": msgs, **own}


def _pop(api, q: str, **params: Any):
    return api.pop_raw(q, wait=False, **params)


def _ack_all(api, msgs: list[dict], lease: str, group: str) -> list[dict]:
    acks = [{"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": lease,
             "status": "completed"} for m in msgs]
    return expect(api.http.post("/api/v1/ack/batch", json={"acknowledgments": acks, "consumerGroup": group}), 200)


# ---------------------------------------------------------------------------------- binary push (§1.9)


@contract("LOG-PUSH-BINARY")
def test_binary_push_is_the_json_push(api):
    q = uniq("qpb")
    body = qpb1([(q, "p", [(f"t{i}", {"i": i}) for i in range(4)]), (q, "r", [("t0", "other")])])
    first = expect(api.http.post("/api/v1/push", content=body, headers=BINARY), OK)
    assert [x["status"] for x in first] == ["queued"] * 5, first
    again = expect(api.http.post("/api/v1/push", content=body, headers=BINARY), OK)
    assert [x["status"] for x in again] == ["duplicate"] * 5, again
    got = expect(_pop(api, q, partition="p", batch=10), 200)["messages"]
    assert [(m["transactionId"], m["data"]) for m in got] == [(f"t{i}", {"i": i}) for i in range(4)]


@contract("LOG-PUSH-BINARY-FRAMES")
def test_binary_push_frames_keep_the_clients_ids(api):
    q = uniq("qpb8")
    ids = [v7() for _ in range(3)]
    body = b"QPB1\x08" + framed_groups([(q, "p", [(mid, f"f{i}", [i]) for i, mid in enumerate(ids)])])
    out = expect(api.http.post("/api/v1/push", content=body, headers=BINARY), OK)
    assert [x["message_id"] for x in out] == [str(mid) for mid in ids], out
    got = expect(_pop(api, q, partition="p", batch=10), 200)["messages"]
    assert [(m["id"], m["data"]) for m in got] == [(str(mid), [i]) for i, mid in enumerate(ids)]


@contract("LOG-PUSH-BINARY-MALFORMED")
def test_malformed_binary_push_stores_nothing(api):
    q = uniq("qpbx")
    whole = qpb1([(q, "p", [("a", 1), ("b", 2)])])
    bad = [b"", b"QPB9" + whole[4:], b"QPB1\x40" + whole[5:], whole[:-1], whole + b"\x00",
           whole[:5] + struct.pack("<I", 99) + whole[9:], qpb1([(q, "p", [("a", 1)])])[:-1] + b"{"]
    for body in bad:
        expect_error(api.http.post("/api/v1/push", content=body, headers=BINARY), 400)
    assert empty_pop(_pop(api, q, partition="p", batch=10))


# ---------------------------------------------------------------------------- binary transaction (§1.10)


@contract("LOG-TX-BINARY")
def test_binary_transaction_head_first_then_pushes(api):
    src, dst = uniq("qtb-s"), uniq("qtb-d")
    pushed(api.push(src, ["in"]))
    popped = expect(_pop(api, src), 200)
    m = popped["messages"][0]
    head = json.dumps({"operations": [{"type": "ack", "transactionId": m["transactionId"],
                                       "partitionId": m["partitionId"], "leaseId": popped["leaseId"]}],
                       "requiredLeases": [popped["leaseId"]]}).encode()
    body = b"QTB1\x00" + struct.pack("<I", len(head)) + head + framed_groups(
        [(dst, "p", [(v7(), "o1", "out1"), (v7(), "o2", "out2")])])
    res = expect(api.http.post("/api/v1/transaction", content=body, headers=BINARY), 200)
    assert res.get("success") is True, res
    assert [r.get("type") for r in res["results"]][:3] == ["ack", "push", "push"], res
    got = expect(_pop(api, dst, partition="p", batch=5), 200)["messages"]
    assert [x["data"] for x in got] == ["out1", "out2"]
    assert empty_pop(_pop(api, src))


# ------------------------------------------------------------------------------------- framed pop (§1.11)


@contract("LOG-POP-FRAMED")
def test_framed_pop_is_the_json_answer(api):
    q = uniq("qpf")
    pushed(api.push(q, [{"n": i} for i in range(3)], partition="p"))
    resp = _pop(api, q, partition="p", batch=10, consumerGroup="f", frames=True)
    expect(resp, 200)
    if resp.content[:4] != b"QPF1":
        not_verified("the target answers frames=true with JSON, which docs/protocol.md §1.11 allows")
    framed = read_qpf1(resp.content)
    plain = expect(_pop(api, q, partition="p", batch=10, consumerGroup="j"), 200)
    assert [(m["id"], m["transactionId"], m["data"], m["offset"]) for m in framed["messages"]] == [
        (m["id"], m["transactionId"], m["data"], m["offset"]) for m in plain["messages"]]
    assert framed["messages"][0]["partitionId"].isdigit() and framed["queue"] == q
    assert all(x["success"] for x in _ack_all(api, framed["messages"], framed["leaseId"], "f"))
    assert empty_pop(_pop(api, q, partition="p", consumerGroup="f"))


# ------------------------------------------------------------------------------------ conflation (§2.4)


@contract("LOG-POP-CONFLATION", "LOG-POP-CONFLATION-ECHO-EMPTY")
def test_conflation_delivers_the_newest(api):
    q = uniq("conf")
    for p in ("a", "b"):
        pushed(api.push(q, [f"{p}{i}" for i in range(4)], partition=p))
    got = expect(_pop(api, q, consumerGroup="last", conflation=True, partitions=2, batch=10), 200)
    assert got.get("conflation") is True, got
    assert sorted(m["data"] for m in got["messages"]) == ["a3", "b3"], got
    assert all(x["success"] for x in _ack_all(api, got["messages"], got["leaseId"], "last"))
    empty = expect(_pop(api, q, consumerGroup="last", conflation=True), 200)
    assert empty.get("conflation") is True and not empty.get("messages"), empty
    everything = expect(_pop(api, q, consumerGroup="every", partitions=2, batch=20), 200)
    assert len(everything["messages"]) == 8


@contract("LOG-POP-CONFLATION-STORED")
def test_the_stored_policy_wins(api):
    q = uniq("conf-s")
    pushed(api.push(q, [1, 2, 3], partition="p"))
    expect(_pop(api, q, consumerGroup="c", conflation=True, batch=1), 200)  # registers c conflating
    pushed(api.push(q, [6, 7], partition="r"))
    undeclared = expect(_pop(api, q, partition="r", consumerGroup="c", batch=10), 200)
    assert undeclared.get("conflation") is True and [m["data"] for m in undeclared["messages"]] == [7], undeclared
    # registers plain without conflation, on partition p: a pop of any partition could lease r's messages
    expect(_pop(api, q, partition="p", consumerGroup="plain", batch=1), 200)
    clash = expect(_pop(api, q, partition="r", consumerGroup="plain", conflation=True, batch=10), 200)
    assert clash.get("conflationConflict") is True and "conflation" not in clash, clash
    assert [m["data"] for m in clash["messages"]] == [6, 7]


@contract("LOG-POP-CONFLATION-REFUSALS")
def test_conflation_refusals(api):
    q = uniq("conf-r")
    pushed(api.push(q, [1]))
    expect_error(_pop(api, q, conflation=True), 400)
    expect_error(_pop(api, q, conflation=True, consumerGroup="g", autoAck=True), 400)

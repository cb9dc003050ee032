"""The binary wire formats (broker/http/binary.py, docs/protocol.md §1.9-1.11) and conflation (§2.4).

Through the official client with ``binary_push``, ``push_compression`` and ``framed_pop`` on, the
messages must round-trip exactly (payloads, ids, order) with the JSON semantics (dedupe, leases, acks);
over raw HTTP every malformed binary body is a 400/413 in the envelope and stores nothing.
"""

from __future__ import annotations

import struct
import uuid

import pytest
import zstandard
from conftest import uniq
from helpers import db_fetch, refused
from queen import Queen
from queen.http.pop_frames import decode_pop_frames
from queen.http.push_binary import (
    PushBatch,
    binary_push_body,
    encode_push_binary,
    encode_transaction_frames,
)

from broker.http.binary import FRAME_TRACE
from broker.ids import partition_number, partition_uuid
from broker.log.parse import partition_id

BIN = {"Content-Type": "application/x-queen-push"}


def _items(q: str, n: int, partition: str = "p") -> list[dict]:
    return [{"queue": q, "partition": partition, "payload": {"i": i, "s": "é\u2603"}, "transactionId": f"t{i}"}
            for i in range(n)]


def _pop(api, q: str, **params):
    return api.pop_response(q, wait="false", **params)


# ------------------------------------------------------------------------------------ partition ids


def test_partition_numbers_round_trip_and_old_ids_carry_none():
    for n in (1, 42, 2**40 + 7, 2**62 - 1):
        pid = partition_uuid(n)
        assert partition_number(pid) == n and pid.version == 8
        assert partition_id(str(n), "p") == pid and partition_id(str(pid), "p") == pid
    assert partition_number(uuid.uuid4()) is None


# ------------------------------------------------------------------------------------ binary push


def test_binary_push_stores_what_json_push_stores(api):
    q = uniq("qpb")
    body = binary_push_body(_items(q, 5), compress=False)
    r = api.post("/api/v1/push", content=body, headers=BIN)
    assert r.status_code == 201, r.text
    assert [x["status"] for x in r.json()] == ["queued"] * 5
    assert [x["transaction_id"] for x in r.json()] == [f"t{i}" for i in range(5)]
    # dedupe like JSON: the same transaction ids again are duplicates of the first messages
    again = api.post("/api/v1/push", content=body, headers=BIN).json()
    assert [x["status"] for x in again] == ["duplicate"] * 5
    assert [x["message_id"] for x in again] == [x["message_id"] for x in r.json()]
    got = _pop(api, q, batch=10).json()
    assert [m["data"] for m in got["messages"]] == [{"i": i, "s": "é\u2603"} for i in range(5)]
    assert [m["transactionId"] for m in got["messages"]] == [f"t{i}" for i in range(5)]


def test_binary_push_with_frames_keeps_the_clients_message_ids(api):
    q = uniq("qpb8")
    body = binary_push_body(_items(q, 3) + _items(q, 2, "other"), compress=True)
    r = api.post("/api/v1/push", content=body, headers=BIN)
    assert r.status_code == 201, r.text
    out = r.json()
    assert [x["status"] for x in out] == ["queued"] * 5
    ids = [uuid.UUID(x["message_id"]) for x in out]
    assert all(i.version == 7 for i in ids)
    # the ids are the ones inside the client's frames
    z = body[4 + 1 + 4 + 2 + len(q) + 2 + 1 + 4 + 4:]
    assert uuid.UUID(bytes=zstandard.ZstdDecompressor().decompressobj().decompress(z)[5:21]) == ids[0]


def test_binary_push_without_transaction_ids_and_counts_only(api):
    q = uniq("qpbc")
    body = encode_push_binary([PushBatch(q, "p", [b'{"a":1}', b"null", b"[1,2]"])], counts=True)
    r = api.post("/api/v1/push", content=body, headers=BIN)
    assert r.status_code == 201, r.text
    assert r.json() == {"count": 3, "queued": 3, "duplicate": 0, "failed": 0, "error": None}
    zbody = encode_push_binary([PushBatch(q, "p", [b'"z"'], ["tz"])], compress=True)
    assert api.post("/api/v1/push", content=zbody, headers=BIN).json()[0]["status"] == "queued"
    got = _pop(api, q, batch=10).json()["messages"]
    assert [m["data"] for m in got] == [{"a": 1}, None, [1, 2], "z"]
    assert got[0]["transactionId"] == got[0]["id"]  # minted: the message id's text


def test_binary_push_to_a_full_queue_fails_its_items_as_json_does(api):
    q = uniq("qpb-full")
    api.configure(q, maxSize=1)
    api.push(q, [0])
    items = binary_push_body(_items(q, 2), compress=False)
    out = api.post("/api/v1/push", content=items, headers=BIN).json()
    assert [x["status"] for x in out] == ["failed", "failed"] and out[0].get("reason") == "queue_full", out
    counts = api.post("/api/v1/push", content=b"QPB1\x06" + items[5:], headers=BIN).json()
    assert (counts["count"], counts["queued"], counts["failed"]) == (2, 0, 2) and counts["error"], counts
    assert _stored(api, q) == 1


def _stored(api, q: str) -> int:
    r = _pop(api, q, batch=100)
    return 0 if r.status_code == 204 else len(r.json()["messages"])


def _group(q: str, tail: bytes) -> bytes:
    qb = q.encode()
    return struct.pack("<I", 1) + struct.pack("<H", len(qb)) + qb + struct.pack("<H", 1) + b"p" + tail


MALFORMED = {
    "empty": lambda q: b"",
    "wrong_magic": lambda q: b"QPB2\x04" + _group(q, struct.pack("<I", 0)),
    "unknown_flag": lambda q: b"QPB1\x44" + _group(q, struct.pack("<I", 0)),
    "truncated_header": lambda q: b"QPB1",
    "truncated_group": lambda q: b"QPB1\x04" + _group(q, b"")[:-3],
    "count_past_end": lambda q: b"QPB1\x00" + _group(q, struct.pack("<I", 5) + struct.pack("<I", 1) + b"1"),
    "length_past_end": lambda q: b"QPB1\x00" + _group(q, struct.pack("<I", 1) + struct.pack("<I", 99) + b"1"),
    "trailing_bytes": lambda q: b"QPB1\x00" + _group(q, struct.pack("<I", 1) + struct.pack("<I", 1) + b"1") + b"x",
    "not_json": lambda q: b"QPB1\x00" + _group(q, struct.pack("<I", 1) + struct.pack("<I", 3) + b"{x]"),
    "bad_utf8_name": lambda q: b"QPB1\x00" + struct.pack("<IH", 1, 2) + b"\xff\xfe" + struct.pack("<H", 1) + b"p"
    + struct.pack("<I", 0),
    "zstd_not_a_frame": lambda q: b"QPB1\x01" + struct.pack("<I", 10) + b"not zstd at all",
    "zstd_size_mismatch": lambda q: b"QPB1\x01" + struct.pack("<I", 3) + zstandard.ZstdCompressor().compress(
        _group(q, struct.pack("<I", 0))),
    "frames_not_v7": lambda q: b"QPB1\x08" + _group(q, struct.pack("<I", 1) + _z(_frame(uuid.uuid4().bytes))),
    "frames_short": lambda q: b"QPB1\x08" + _group(q, struct.pack("<I", 2) + _z(_frame(_v7()))),
    "frames_bad_flags": lambda q: b"QPB1\x08" + _group(q, struct.pack("<I", 1) + _z(_frame(_v7(), flags=4))),
}


def _v7() -> bytes:
    raw = bytearray(uuid.uuid4().bytes)
    raw[6] = 0x70 | (raw[6] & 0x0F)
    return bytes(raw)


def _frame(mid: bytes, flags: int = 0, payload: bytes = b"1") -> bytes:
    body = bytes([flags]) + mid + struct.pack("<H", 2) + b"tx" + payload
    return struct.pack("<I", len(body)) + body


def _z(raw: bytes) -> bytes:
    z = zstandard.ZstdCompressor(write_content_size=True).compress(raw)
    return struct.pack("<I", len(z)) + z


def test_binary_push_frame_with_a_trace_id(api):
    q = uniq("qpbt")
    mid, trace = _v7(), uuid.uuid4()
    body = bytes([FRAME_TRACE]) + mid + trace.bytes + struct.pack("<H", 2) + b"tr" + b'{"t":1}'
    framed = b"QPB1\x08" + _group(q, struct.pack("<I", 1) + _z(struct.pack("<I", len(body)) + body))
    assert api.post("/api/v1/push", content=framed, headers=BIN).json()[0]["message_id"] == str(uuid.UUID(bytes=mid))
    m = _pop(api, q).json()["messages"][0]
    assert (m["traceId"], m["transactionId"], m["data"]) == (str(trace), "tr", {"t": 1})
    short = b"QPB1\x08" + _group(q, struct.pack("<I", 1) + _z(struct.pack("<I", 20) + body[:20]))
    refused(api.post("/api/v1/push", content=short, headers=BIN), 400, "bad_request", "bad_binary_body")


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_binary_push_is_400_and_stores_nothing(api, case):
    q = uniq("qpbx")
    r = api.post("/api/v1/push", content=MALFORMED[case](q), headers=BIN)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "bad_request" and r.json()["reason"] and r.json()["detail"]
    assert _stored(api, q) == 0


def test_huge_declared_lengths_are_refused_before_anything_is_allocated(api):
    q = uniq("qpbh")
    huge_count = b"QPB1\x04" + _group(q, struct.pack("<I", 0xFFFFFFFF))
    refused(api.post("/api/v1/push", content=huge_count, headers=BIN), 400, "bad_request", "too_many_items")
    huge_groups = b"QPB1\x04" + struct.pack("<I", 0xFFFFFFFF)
    refused(api.post("/api/v1/push", content=huge_groups, headers=BIN), 400, "bad_request", "bad_binary_body")
    # a zstd frame that says it holds more than a body may decompress to: 413 before inflating it
    bomb = zstandard.ZstdCompressor(write_content_size=True).compress(bytes(65 * 1024 * 1024))
    refused(api.post("/api/v1/push", content=b"QPB1\x01" + struct.pack("<I", 65 * 1024 * 1024) + bomb, headers=BIN),
            413, "payload_too_large", "body_too_large")
    # a body over QUEEN_MAX_BODY_BYTES (8 MiB) is refused before it is read, as a JSON one is
    big = encode_push_binary([PushBatch(q, "p", [b'"' + b"x" * (9 * 1024 * 1024) + b'"'], ["big"])])
    refused(api.post("/api/v1/push", content=big, headers=BIN), 413, "payload_too_large")
    assert _stored(api, q) == 0


def test_one_bad_item_refuses_the_whole_binary_push(api):
    q = uniq("qpb1")
    body = encode_push_binary([PushBatch(q, "p", [b"1", b"2", b"{"], ["a", "b", "c"])])
    refused(api.post("/api/v1/push", content=body, headers=BIN), 400, "bad_request", "bad_binary_body")
    deep = encode_push_binary([PushBatch(q, "p", [b"[" * 200 + b"]" * 200], ["d"])])
    refused(api.post("/api/v1/push", content=deep, headers=BIN), 400, "bad_request", "json_too_deep")
    bad_name = encode_push_binary([PushBatch("x\x01", "p", [b"1"], ["e"])])
    refused(api.post("/api/v1/push", content=bad_name, headers=BIN), 400, "bad_request", "bad_name")
    assert _stored(api, q) == 0


def test_binary_body_on_another_route_is_refused(api):
    r = api.post("/api/v1/ack", content=b"QPB1\x04", headers=BIN)
    refused(r, 400, "bad_request", "binary_body_unsupported")


# ----------------------------------------------------------------------------- binary transaction


def test_binary_transaction_acks_head_first_then_pushes(api):
    src, dst = uniq("qtb-src"), uniq("qtb-dst")
    api.push(src, [{"n": 1}])
    m = _pop(api, src).json()["messages"][0]
    head = (b'{"operations":[{"type":"ack","transactionId":"%s","partitionId":"%s","leaseId":"%s",'
            b'"status":"completed"}],"requiredLeases":["%s"]}'
            % (m["transactionId"].encode(), m["partitionId"].encode(), m["leaseId"].encode(), m["leaseId"].encode()))
    body = encode_transaction_frames(head, [PushBatch(dst, "p", [b'{"out":1}', b'{"out":2}'], ["o1", "o2"])])
    r = api.post("/api/v1/transaction", content=body, headers=BIN)
    assert r.status_code == 200, r.text
    res = r.json()
    assert res["success"] is True
    assert [x["type"] for x in res["results"]] == ["ack", "push", "push"]
    assert [x["index"] for x in res["results"]] == [0, 1, 2]
    assert [m["data"] for m in _pop(api, dst, batch=5).json()["messages"]] == [{"out": 1}, {"out": 2}]
    assert _pop(api, src).status_code == 204


def test_binary_transaction_counts_and_refusals_change_nothing(api):
    dst = uniq("qtb-c")
    body = encode_transaction_frames(None, [PushBatch(dst, "p", [b"1", b"2"], ["a", "b"])], counts=True)
    res = api.post("/api/v1/transaction", content=body, headers=BIN).json()
    assert res["success"] is True and res["results"] == [] and (res["pushed"], res["duplicate"], res["acked"]) == (2, 0, 0)
    bad_head = encode_transaction_frames(b"[1]", [PushBatch(dst, "p", [b"3"], ["c"])])
    refused(api.post("/api/v1/transaction", content=bad_head, headers=BIN), 400, "bad_request", "bad_body")
    bad_ack = encode_transaction_frames(b'{"operations":[{"type":"ack","transactionId":"x","partitionId":"1"}]}',
                                        [PushBatch(dst, "p", [b"4"], ["d"])])
    assert api.post("/api/v1/transaction", content=bad_ack, headers=BIN).json()["success"] is False
    truncated = encode_transaction_frames(None, [PushBatch(dst, "p", [b"5"], ["e"])])[:-4]
    refused(api.post("/api/v1/transaction", content=truncated, headers=BIN), 400, "bad_request", "bad_binary_body")
    refused(api.post("/api/v1/transaction", content=b"QPB1" + truncated[4:], headers=BIN), 400, "bad_request",
            "bad_binary_body")
    assert _stored(api, dst) == 2


# ------------------------------------------------------------------------------------- framed pop


def test_framed_pop_decodes_to_the_json_answer(api):
    q = uniq("qpf")
    api.push(q, [{"k": i, "u": "ü"} for i in range(4)] + [None])
    framed = _pop(api, q, batch=10, frames="true", consumerGroup="g")
    assert framed.status_code == 200 and framed.headers["Content-Type"].startswith("application/x-queen-pop")
    got = decode_pop_frames(framed.content)
    plain = _pop(api, q, batch=10, consumerGroup="h").json()
    number = str(partition_number(uuid.UUID(plain["partitionId"])))
    assert got["partitionId"] == number
    for a, b in zip(got["messages"], plain["messages"], strict=True):
        # the per-message queue is the answer's; a null deadlineAt reads the same absent (msg.get)
        assert b.pop("queue") == got["queue"] and b.pop("deadlineAt") is None
        b.update(partitionId=number, leaseId=got["leaseId"], consumerGroup="g")
        assert a == b
    assert got["leaseExpiresAt"] and got["partitionsClaimed"] == 1
    # the decimal partition id acknowledges like the UUID
    acked = api.post("/api/v1/ack/batch", json={"acknowledgments": [
        {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"],
         "status": "completed"} for m in got["messages"]], "consumerGroup": "g"}).json()
    assert all(x["success"] for x in acked)
    assert _pop(api, q, consumerGroup="g").status_code == 204


def test_framed_pop_falls_back_to_json_when_a_frame_cannot_carry_the_answer(api, broker):
    q = uniq("qpf-old")
    api.push(q, [1])
    assert _pop(api, q, frames="true", consumerGroup="g").content[:4] == b"QPF1"
    # a client that does not accept the framed type gets JSON
    json_only = api.get(f"/api/v1/pop/queue/{q}", params={"wait": "false", "frames": "true", "consumerGroup": "h"},
                        headers={"Accept": "application/json"})
    assert json_only.json()["messages"][0]["data"] == 1
    # a partition made before partitions were numbered (a random id) cannot travel as a u64: JSON
    db_fetch(broker.dsn, "INSERT INTO queen_partitions (tenant, id, queue, name) VALUES ('default', $1, $2, 'old')",
             uuid.uuid4(), q)
    db_fetch(broker.dsn, "UPDATE queen_queues SET partition_count = partition_count + 1 WHERE name = $1", q)
    api.push(q, [2], partition="old")
    old = api.get(f"/api/v1/pop/queue/{q}/partition/old", params={"wait": "false", "frames": "true", "consumerGroup": "i"})
    assert old.headers["Content-Type"].startswith("application/json") and old.json()["messages"][0]["data"] == 2
    refused(_pop(api, q, frames="maybe"), 400, "bad_request", "bad_query")
    # a message with a deadline: frames have no place for deadlineAt, so the answer stays JSON and carries it
    dq = uniq("qpf-deadline")
    api.push_items([{"queue": dq, "payload": 3, "deadlineMs": 60_000}])
    timed = _pop(api, dq, frames="true", consumerGroup="g")
    assert timed.headers["Content-Type"].startswith("application/json")
    assert timed.json()["messages"][0]["deadlineAt"]


def test_encode_pop_keeps_json_for_what_frames_cannot_carry():
    from broker.http.binary import encode_pop

    pid = str(partition_uuid(9))
    msg = {"id": str(uuid.uuid4()), "transactionId": "t", "traceId": None, "data": 1, "producerSub": None,
           "createdAt": "2026-01-02T03:04:05.678Z", "queue": "q", "partitionId": pid, "partition": "p",
           "leaseId": "L", "consumerGroup": "g", "deliveryAttempt": 1, "offset": 3}
    answer = {"success": True, "queue": "q", "leaseId": "L", "consumerGroup": "g", "messages": [msg]}
    got = decode_pop_frames(encode_pop(answer) or b"")
    assert got["messages"][0]["createdAt"] == msg["createdAt"] and got["messages"][0]["partitionId"] == "9"
    assert encode_pop({**answer, "messages": [{**msg, "deadlineNull": None}]}) is not None  # an absent value
    for extra in ({"undecryptable": True, "data": None}, {"deadlineAt": "2026-01-02T03:04:06.000Z"},
                  {"partitionId": str(uuid.uuid4())}, {"leaseId": "other"}, {"transactionId": "x" * 70_000}):
        assert encode_pop({**answer, "messages": [{**msg, **extra}]}) is None, extra
    assert encode_pop({**answer, "messages": []}) is None


# ----------------------------------------------------------------------------------- the client


@pytest.fixture
def wire_seen(monkeypatch):
    """Counts what the client really sent and read in the binary formats (it falls back to JSON silently)."""
    from queen.http import http_client

    seen = {"push": 0, "tx": 0, "pop": 0}

    def counting(name, key):
        real = getattr(http_client, name)

        def wrapped(*args, **kwargs):
            out = real(*args, **kwargs)
            if out is not None:
                seen[key] += 1
            return out
        monkeypatch.setattr(http_client, name, wrapped)

    counting("binary_push_body", "push")
    counting("transaction_frames", "tx")
    counting("decode_pop_frames", "pop")
    return seen


async def test_client_with_binary_push_compression_and_framed_pop_round_trips_exactly(broker, wire_seen):
    q = uniq("qwire")
    payloads = [{"i": i, "text": "ünïcode ☃", "n": None, "f": 1.5, "l": [i, {"x": True}]} for i in range(30)]
    async with Queen(broker.url, binary_push=True, push_compression=True, framed_pop=True) as queen:
        pushed = await queen.queue(q).partition("p1").push([{"data": p, "transactionId": f"w{i}"}
                                                            for i, p in enumerate(payloads)])
        assert [r["status"] for r in pushed] == ["queued"] * 30
        again = await queen.queue(q).partition("p1").push([{"data": payloads[0], "transactionId": "w0"}])
        assert again[0]["status"] == "duplicate" and again[0]["message_id"] == pushed[0]["message_id"]
        msgs = await queen.queue(q).partition("p1").group("g").batch(50).wait(False).pop()
        assert [m["data"] for m in msgs] == payloads
        assert [m["transactionId"] for m in msgs] == [f"w{i}" for i in range(30)]
        assert [m["id"] for m in msgs] == [r["message_id"] for r in pushed]
        assert [m["offset"] for m in msgs] == list(range(1, 31))
        assert (await queen.renew(msgs[0]))["success"] is True
        assert (await queen.ack(msgs, True, {"group": "g"}))["success"] is True
        assert await queen.queue(q).partition("p1").group("g").wait(False).pop() == []
        # a transaction through the binary body: ack one message, push two, in the client's order
        await queen.queue(q).partition("p2").push([{"data": {"src": 1}}])
        src = (await queen.queue(q).partition("p2").group("g").wait(False).pop())[0]
        out = uniq("qwire-out")
        res = await queen.transaction().queue(out).push([{"data": {"o": 1}}, {"data": {"o": 2}}]).ack(src).commit()
        assert res["success"] is True
        assert [r["type"] for r in res["results"]] == ["push", "push", "ack"]
        assert [r["index"] for r in res["results"]] == [0, 1, 2]
        got = await queen.queue(out).group("g").batch(5).wait(False).pop()
        assert [m["data"] for m in got] == [{"o": 1}, {"o": 2}]
        assert await queen.queue(q).partition("p2").group("g").wait(False).pop() == []
    assert wire_seen["push"] >= 3 and wire_seen["tx"] == 1 and wire_seen["pop"] >= 3, wire_seen


async def test_client_binary_push_without_compression(broker, wire_seen):
    q = uniq("qwire-plain")
    async with Queen(broker.url, binary_push=True) as queen:
        pushed = await queen.queue(q).push([{"data": i} for i in range(10)])
        assert [r["status"] for r in pushed] == ["queued"] * 10
    async with Queen(broker.url) as queen:
        msgs = await queen.queue(q).batch(20).wait(False).pop()
        assert [m["data"] for m in msgs] == list(range(10))
    assert wire_seen["push"] == 1


# ------------------------------------------------------------------------------------- conflation


def test_conflation_delivers_the_newest_and_retires_the_rest(api):
    q = uniq("conf")
    for p in ("a", "b"):
        api.push(q, [{"v": i} for i in range(5)], partition=p)
    r = _pop(api, q, consumerGroup="latest", conflation="true", partitions=2, batch=10)
    body = r.json()
    assert body["conflation"] is True
    assert sorted((m["partition"], m["data"]["v"]) for m in body["messages"]) == [("a", 4), ("b", 4)]
    acks = [{"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"]}
            for m in body["messages"]]
    assert all(x["success"] for x in api.post("/api/v1/ack/batch", json={"acknowledgments": acks,
                                                                          "consumerGroup": "latest"}).json())
    # empty: still the echo, never a bodiless 204
    empty = _pop(api, q, consumerGroup="latest", conflation="true")
    assert empty.status_code == 200 and empty.json() == {"success": True, "messages": [], "conflation": True}
    # the stored policy wins for a consumer that does not declare it
    api.push(q, [{"v": 10}, {"v": 11}], partition="a")
    undeclared = _pop(api, q, consumerGroup="latest", batch=10).json()
    assert [m["data"] for m in undeclared["messages"]] == [{"v": 11}] and undeclared["conflation"] is True
    # another group of the same queue reads everything
    assert len(_pop(api, q, consumerGroup="all", batch=100, partitions=2).json()["messages"]) == 12
    # the depth route reports the group's policy and its work depth (one handler run per partition owing)
    depth = api.get(f"/api/v1/resources/queues/{q}/depth", params={"group": "latest"}).json()
    assert depth["conflation"] is True and depth["effectivePending"] == depth["partitionsPending"] == 1
    assert api.get(f"/api/v1/resources/queues/{q}/depth", params={"group": "all"}).json()["conflation"] is False


def test_conflation_conflict_and_refusals(api):
    q = uniq("conf-x")
    api.push(q, [1, 2])
    plain = _pop(api, q, consumerGroup="g", batch=1).json()  # registers g without conflation
    assert "conflation" not in plain and "conflationConflict" not in plain
    api.post("/api/v1/ack", json={"transactionId": plain["messages"][0]["transactionId"],
                                  "partitionId": plain["partitionId"], "leaseId": plain["leaseId"]})
    clash = _pop(api, q, consumerGroup="g", conflation="true").json()
    assert clash["conflationConflict"] is True and "conflation" not in clash
    assert [m["data"] for m in clash["messages"]] == [2]  # the stored policy (no conflation) applied
    refused(_pop(api, q, conflation="true"), 400, "bad_request", "conflation_needs_group")
    refused(_pop(api, q, conflation="true", consumerGroup="h", autoAck="true"), 400, "bad_request",
            "conflation_with_auto_ack")
    refused(_pop(api, q, conflation="maybe", consumerGroup="h"), 400, "bad_request", "bad_query")


async def test_client_conflation_consumer_gets_the_newest_per_partition(broker, wire_seen):
    q = uniq("conf-cl")
    async with Queen(broker.url, framed_pop=True) as queen:
        await queen.queue(q).partition("k1").push([{"data": {"v": i}} for i in range(20)])
        await queen.queue(q).partition("k2").push([{"data": {"v": i}} for i in range(3)])
        got = await queen.queue(q).group("dash").conflation().partitions(2).batch(10).wait(False).pop()
        assert sorted((m["partition"], m["data"]["v"]) for m in got) == [("k1", 19), ("k2", 2)]
        assert (await queen.ack(got, True, {"group": "dash"}))["success"] is True
        assert await queen.queue(q).group("dash").conflation().wait(False).pop() == []
    assert wire_seen["pop"] == 1  # the delivery came framed, with the echo in its own keys


async def test_client_consume_with_conflation_runs_the_handler_on_the_newest(broker):
    import asyncio

    q = uniq("conf-consume")
    seen: list[int] = []

    async def handler(msg):
        for m in msg if isinstance(msg, list) else [msg]:
            seen.append(m["data"]["v"])

    async with Queen(broker.url, framed_pop=True) as queen:
        await queen.queue(q).partition("k").push([{"data": {"v": i}} for i in range(10)])
        # long polls included: every answer, the empty ones too, carries the echo the consumer checks
        await asyncio.wait_for(queen.queue(q).group("c").conflation().limit(1).idle_millis(1500).consume(handler), 20)
        assert seen == [9]
        assert await queen.queue(q).group("c").conflation().wait(False).pop() == []

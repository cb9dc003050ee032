"""The connection layer (broker/process/server.py), over raw sockets: aiohttp's own protocol errors answer in
the JSON envelope, and slow, idle and surplus connections are refused or closed in bounded time."""

from __future__ import annotations

import json
import socket
import time

import pytest


def raw(url: str, data: bytes, *, timeout: float = 5.0) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            out += chunk
        return out


def parse(resp: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = resp.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
    return status, headers, json.loads(body)


PROTOCOL_ERRORS = {
    "bad_chunk_size": b"POST /api/v1/push HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "negative_content_length": b"POST /api/v1/push HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    "cl_with_te": b"POST /api/v1/push HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "nul_in_path": b"GET /api/v1/\x00whoami HTTP/1.1\r\nHost: x\r\n\r\n",
    "non_ascii_in_path": b"GET /api/v1/\xc3\xa9\xff HTTP/1.1\r\nHost: x\r\n\r\n",
    "huge_header": b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n",
    "bad_version": b"GET /health HTTP/9.Z\r\nHost: x\r\n\r\n",
    "garbage": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n",
}


@pytest.mark.parametrize("name", sorted(PROTOCOL_ERRORS))
def test_protocol_errors_are_enveloped(broker, name):
    status, headers, body = parse(raw(broker.url, PROTOCOL_ERRORS[name]))
    assert 400 <= status < 500, (name, status, body)
    assert headers["content-type"].startswith("application/json")
    assert body["error"] == "bad_request" and body["reason"] == "bad_http" and body["detail"], body


@pytest.fixture
def edge_broker(start_broker):
    return start_broker(workers=1, env={
        "QUEEN_HEADER_TIMEOUT_S": "1", "QUEEN_BODY_TIMEOUT_S": "1", "QUEEN_KEEPALIVE_TIMEOUT_S": "2",
        "QUEEN_MAX_CONNECTIONS": "30",
    })


def _open(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    return s


def _closed_within(s: socket.socket, seconds: float) -> tuple[bool, bytes]:
    s.settimeout(seconds)
    got = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return True, got
            got += chunk
    except TimeoutError:
        return False, got
    except ConnectionResetError:
        return True, got


def test_trickled_headers_time_out(edge_broker):
    """Today's attack: header lines every so often; each connection is answered 408 and closed."""
    socks = [_open(edge_broker.url) for _ in range(20)]
    t0 = time.monotonic()
    for s in socks:
        s.sendall(b"GET /health HTTP/1.1\r\n")
    for _ in range(3):  # keep trickling: the clock runs from the first byte, not the last
        time.sleep(0.4)
        for s in socks:
            try:
                s.sendall(b"X-Slow: 1\r\n")
            except OSError:
                pass
    for s in socks:
        closed, got = _closed_within(s, 5)
        assert closed, "a trickling connection stayed open"
        status, _, body = parse(got)
        assert status == 408 and body["reason"] == "header_timeout", body
        s.close()
    assert time.monotonic() - t0 < 6


def test_slow_body_times_out_and_applies_nothing(edge_broker):
    import httpx
    from conftest import uniq

    q = uniq("slowbody")
    body = json.dumps({"items": [{"queue": q, "payload": {"a": 1}}]}).encode()
    s = _open(edge_broker.url)
    s.sendall(b"POST /api/v1/push HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body[:10])
    closed, got = _closed_within(s, 5)
    assert closed
    status, _, env = parse(got)
    assert status == 408 and env["reason"] == "body_timeout", env
    s.close()
    with httpx.Client(base_url=edge_broker.url) as c:
        assert c.get(f"/api/v1/pop/queue/{q}").status_code == 204


def test_idle_keepalive_and_silent_connections_close(edge_broker):
    s = _open(edge_broker.url)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    s.settimeout(5)
    first = s.recv(65536)
    assert b" 200 " in first.split(b"\r\n")[0]
    closed, _ = _closed_within(s, 5)  # keep-alive idle: 2 s
    assert closed
    silent = _open(edge_broker.url)
    closed, got = _closed_within(silent, 5)
    assert closed and got == b""


def test_connections_over_the_cap_are_refused_clearly(edge_broker):
    held = [_open(edge_broker.url) for _ in range(30)]
    time.sleep(0.3)
    try:
        status, headers, body = parse(raw(edge_broker.url, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"))
        assert status == 503 and body["reason"] == "too_many_connections" and headers["retry-after"] == "1"
    finally:
        for s in held:
            s.close()
    time.sleep(0.3)
    status, _, body = parse(raw(edge_broker.url, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
    assert status == 200, body

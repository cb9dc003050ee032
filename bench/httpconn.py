"""A minimal keep-alive HTTP/1.1 client on asyncio streams, for the benches' load generators.

On a 2-core machine the generator competes with the broker and PostgreSQL for the same cores: a general
client (httpx, aiohttp) spends about a millisecond of CPU per request, which shows up in every latency
it measures. This one writes the request line and headers by hand and reads the answer by
Content-Length (or chunks); it is what ``wrk`` is to the C++ Queen's figures.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit


def host_port(url: str) -> tuple[str, int]:
    """(host, port) of a broker's base URL, e.g. ``http://127.0.0.1:6632``."""
    u = urlsplit(url)
    return u.hostname or "127.0.0.1", u.port or 80


class HttpError(Exception):
    pass


class Conn:
    """One keep-alive HTTP/1.1 connection: request -> (status, body). Bodies by Content-Length."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.r: asyncio.StreamReader | None = None
        self.w: asyncio.StreamWriter | None = None

    async def _open(self) -> None:
        self.r, self.w = await asyncio.open_connection(self.host, self.port)

    async def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        if self.w is None:
            await self._open()
        assert self.r is not None and self.w is not None
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.w.write(head.encode() + b"\r\n" + (body or b""))
        try:
            raw = await self.r.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            self.close()
            raise HttpError(f"connection lost: {exc}") from None
        lines = raw.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length = 0
        chunked = False
        for ln in lines[1:]:
            k, _, v = ln.partition(b":")
            k = k.strip().lower()
            if k == b"content-length":
                length = int(v)
            elif k == b"transfer-encoding" and b"chunked" in v.lower():
                chunked = True
        if chunked:
            data = b""
            while True:
                size = int((await self.r.readuntil(b"\r\n")).strip().split(b";")[0], 16)
                if size == 0:
                    await self.r.readuntil(b"\r\n")
                    break
                data += await self.r.readexactly(size + 2)
                data = data[:-2]
            return status, data
        return status, (await self.r.readexactly(length) if length else b"")

    def close(self) -> None:
        if self.w is not None:
            self.w.close()
        self.r = self.w = None


class Pool:
    """Keep-alive connections to one broker, opened as needed and reused: ``request`` takes a free one
    (or opens one), sends, and gives it back (a connection that failed is dropped, not reused)."""

    def __init__(self, url: str) -> None:
        self.host, self.port = host_port(url)
        self._free: list[Conn] = []

    async def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        c = self._free.pop() if self._free else Conn(self.host, self.port)
        out = await c.request(method, path, body)  # HttpError: the connection closed itself
        self._free.append(c)
        return out

    def close(self) -> None:
        for c in self._free:
            c.close()
        self._free.clear()

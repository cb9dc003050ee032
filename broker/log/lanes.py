"""Push lanes: a tenant's small pushes are written by one worker of the broker, its owner.

Why. A push call locks its partitions' rows until its commit (``queen_push``: gapless offsets). Each
worker runs one push call per tenant at a time and gathers whatever arrived meanwhile into the next one
(``broker.log.coalesce``), so with the tenant's producers all on one worker every commit carries all of
their waiting requests. When the listening socket hands some of the connections to a second worker,
that worker's calls take the same rows: the two workers' calls run one after the other, each carrying
only its own producers' requests, and every commit carries half as much or less. Measured at 20
one-message producers over 2 partitions: 2,963 and 2,673 msg/s with the producers on one worker,
1,815 and 1,566 split 14/6 and 12/8, and 1,677 with ONE producer of 20 on the other worker.

What. The tenant's owner is ``crc32(tenant) % workers``. A worker that is not the owner sends a push it
would coalesce (at most ``COALESCE_REQUEST_ITEMS`` items; bigger ones are written where they arrive) over
a Unix socket to the owner, which submits it to its own push coalescer, as if it had arrived there,
and sends the rows (or the error) back. Admission (quotas, rates) stays with the worker that took the
request. The sockets live in a directory the supervisor creates (mode 0700) for the broker's lifetime.

Contract. A push that was never handed to the owner (no socket yet, the owner restarting or draining:
it answers "refused" without doing anything) is written by the receiving worker itself: nothing is
lost and no request waits on a worker that is down. A push handed over whose answer never came (the
owner died between taking it and answering) answers 503 ``push_lane_lost``: it may or may not have
been committed, as when the database connection breaks during a commit; a retry with the same
``transactionId`` is answered as a duplicate of what was stored.

Off by default (``QUEEN_PUSH_LANES=1`` turns lanes on). With the connections split evenly over two
workers (``queen bench shapes --spread``, alternated with lanes off): 2 partitions 1.18x and 1.49x the
msg/s without lanes; 11 partitions 1.04x and 0.88x; 101 partitions at one message a push 0.81x and
0.73x; ten-message pushes over 101 partitions 0.70-0.76x. Where a tenant's calls seldom meet on a row,
two workers writing in parallel beat one writer plus the hand-over (docs/performance.md, "Push").
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import struct
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from broker import errors
from broker.auth import Principal
from broker.log.parse import PushItem
from broker.metrics import PUSH_LANE_JOBS
from broker.store.failures import api_error

log = logging.getLogger("queen.log.lanes")

_HEAD = struct.Struct("!I")
MAX_FRAME = 64 << 20  # a frame carries at most COALESCE_REQUEST_ITEMS payloads, each under the body limit

Submit = Callable[[Principal, list[PushItem]], Awaitable[list[dict[str, Any]]]]


class NotSent(Exception):
    """The owner did not take the push (unreachable, booting, draining): the caller writes it itself."""


def owner_of(tenant: str, workers: int) -> int:
    return zlib.crc32(tenant.encode()) % workers


def socket_path(directory: str, index: int) -> str:
    return os.path.join(directory, f"w{index}.sock")


def _frame(obj: object) -> bytes:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEAD.pack(len(body)) + body


async def _read_frame(reader: asyncio.StreamReader) -> Any:
    (n,) = _HEAD.unpack(await reader.readexactly(_HEAD.size))
    if n > MAX_FRAME:
        raise ConnectionError(f"push lane frame of {n} bytes")
    return pickle.loads(await reader.readexactly(n))


def _describe(exc: BaseException) -> tuple[str, Any]:
    """An owner-side failure as the receiving worker will render it (what the error middleware would
    have answered had the push been written there)."""
    err = api_error(exc)
    if err is None:
        return "internal", f"{type(exc).__name__}: {exc}"
    return "error", (type(err).__name__, err.reason, err.detail, err.code, err.status, err.headers, err.extra)


def _rebuild(fields: tuple[str, str, str, str, int, dict[str, str], dict[str, object]]) -> errors.ApiError:
    name, reason, detail, code, status, headers, extra = fields
    cls = getattr(errors, name, errors.ApiError)
    if not (isinstance(cls, type) and issubclass(cls, errors.ApiError)):
        cls = errors.ApiError
    return cls(reason, detail, code=code, status=status, headers=headers, extra=extra)


class LaneServer:
    """The owner's side: takes pushes from the other workers and submits them to this worker's push
    coalescer. ``ready`` says whether this worker can write now (booted, not draining)."""

    def __init__(self, path: str, submit: Submit, ready: Callable[[], bool]) -> None:
        self.path = path
        self._submit = submit
        self._ready = ready
        self._server: asyncio.AbstractServer | None = None
        self._jobs: set[asyncio.Task[None]] = set()
        self._conns: set[asyncio.StreamWriter] = set()
        self._closing = False

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path=self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        try:
            while True:
                rid, principal, items = await _read_frame(reader)
                if self._closing or not self._ready():
                    writer.write(_frame((rid, "refused", None)))
                    continue
                task = asyncio.get_running_loop().create_task(self._job(writer, rid, principal, items))
                self._jobs.add(task)
                task.add_done_callback(self._jobs.discard)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except Exception:  # a frame this code did not write: drop the connection, never the worker
            log.exception("push lane: a bad frame; closing the connection")
        finally:
            self._conns.discard(writer)
            writer.close()

    async def _job(self, writer: asyncio.StreamWriter, rid: int, principal: Principal, items: list[PushItem]) -> None:
        try:
            answer: tuple[str, Any] = ("ok", await self._submit(principal, items))
            PUSH_LANE_JOBS.labels("served").inc()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            answer = _describe(exc)
            if answer[0] == "internal":
                log.exception("a push handed over by another worker failed")
        if not writer.is_closing():
            writer.write(_frame((rid, *answer)))

    async def close(self, timeout_s: float) -> None:
        """At drain: say goodbye on every connection (a sender stops using it and writes its pushes
        itself; a frame that crossed the goodbye is refused, not lost), answer the pushes taken, then
        wait for the senders to hang up (bounded)."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        for w in list(self._conns):
            if not w.is_closing():
                w.write(_frame((0, "bye", None)))
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        if self._jobs:
            await asyncio.wait(set(self._jobs), timeout=timeout_s)
        hang_up = min(end, loop.time() + 2.0)
        while self._conns and loop.time() < hang_up:
            await asyncio.sleep(0.01)
        for w in list(self._conns):
            w.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


class _Conn:
    """One connection to an owner and the answers it still owes."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.pending: dict[int, asyncio.Future[tuple[str, Any]]] = {}
        self.live = True  # False once the owner said goodbye: no new frame goes on it


class LaneClient:
    """One worker's connection to one owner: requests go out tagged, answers come back in any order."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._conn: _Conn | None = None
        self._next = 0
        self._lock = asyncio.Lock()
        self._readers: set[asyncio.Task[None]] = set()

    async def _connected(self) -> _Conn:
        async with self._lock:
            conn = self._conn
            if conn is None or not conn.live or conn.writer.is_closing():
                try:
                    reader, writer = await asyncio.open_unix_connection(self.path)
                except OSError as exc:
                    raise NotSent(f"owner unreachable: {exc}") from None
                conn = self._conn = _Conn(writer)
                task = asyncio.get_running_loop().create_task(self._read(reader, conn))
                self._readers.add(task)
                task.add_done_callback(self._readers.discard)
            return conn

    async def _read(self, reader: asyncio.StreamReader, conn: _Conn) -> None:
        try:
            while conn.live or conn.pending:
                rid, kind, payload = await _read_frame(reader)
                if kind == "bye":
                    conn.live = False
                    if self._conn is conn:
                        self._conn = None
                    continue
                fut = conn.pending.pop(rid, None)
                if fut is not None and not fut.done():
                    fut.set_result((kind, payload))
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            conn.live = False
            conn.writer.close()
            if self._conn is conn:
                self._conn = None
            lost = errors.Unavailable(
                "push_lane_lost", "the worker writing this tenant's pushes stopped before answering: the push may "
                "or may not have been stored; retry it with the same transactionId", code="unavailable")
            for fut in conn.pending.values():
                if not fut.done():
                    fut.set_exception(lost)
            conn.pending.clear()

    async def push(self, principal: Principal, items: list[PushItem]) -> list[dict[str, Any]]:
        self._next += 1
        rid = self._next
        frame = _frame((rid, principal, items))
        if len(frame) > MAX_FRAME:  # the owner would drop the connection: write it here instead
            raise NotSent(f"a push of {len(frame)} bytes is larger than a lane frame")
        conn = await self._connected()
        fut: asyncio.Future[tuple[str, Any]] = asyncio.get_running_loop().create_future()
        conn.pending[rid] = fut
        try:
            conn.writer.write(frame)
        except (ConnectionError, RuntimeError) as exc:
            conn.pending.pop(rid, None)
            raise NotSent(f"owner connection closed: {exc}") from None
        try:
            kind, payload = await fut
        finally:
            conn.pending.pop(rid, None)
        if kind == "ok":
            PUSH_LANE_JOBS.labels("forwarded").inc()
            rows: list[dict[str, Any]] = payload
            return rows
        if kind == "refused":
            raise NotSent("owner refused (booting or draining)")
        if kind == "error":
            raise _rebuild(payload)
        raise RuntimeError(f"the owner of the tenant's pushes failed: {payload}")

    async def close(self) -> None:
        if self._conn is not None:
            self._conn.writer.close()
        for task in list(self._readers):
            task.cancel()


class Lanes:
    """A worker's view of the lanes: its own server and a client per other worker."""

    def __init__(self, directory: str, index: int, workers: int, submit: Submit, ready: Callable[[], bool]) -> None:
        self.workers = workers
        self.server = LaneServer(socket_path(directory, index), submit, ready)
        self._clients = {i: LaneClient(socket_path(directory, i)) for i in range(workers) if i != index}

    def owner(self, tenant: str) -> LaneClient | None:
        """The client of the tenant's owner, or None when this worker owns the tenant."""
        return self._clients.get(owner_of(tenant, self.workers))

    async def start(self) -> None:
        await self.server.start()

    async def close(self, timeout_s: float) -> None:
        await self.server.close(timeout_s)
        for c in self._clients.values():
            await c.close()

"""The master process of ``queen serve``.

It binds the listening socket once, points Prometheus at a fresh multiprocess directory, starts
``QUEEN_WORKERS`` worker processes that all accept on that socket (with a private directory for the
sockets of their push lanes, ``broker.log.lanes``), and restarts a worker that dies
(logged, with its exit status). SIGTERM or SIGINT drains: every worker stops accepting, finishes its
in-flight requests (bounded by ``QUEEN_DRAIN_TIMEOUT_S``), releases what it holds and exits; then the
master exits 0.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.process import BaseProcess

from broker.config import Settings

log = logging.getLogger("queen.supervisor")

# A worker that dies this many times within RESTART_WINDOW_S is restarted with a pause in between.
RESTART_BURST = 5
RESTART_WINDOW_S = 10.0
# A restarted worker accepts connections only once it has booted (or after this long), so the workers
# still running serve the traffic meanwhile instead of the newcomer answering 503 booting.
RESTART_READY_WAIT_S = 10.0


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    sock.set_inheritable(True)
    return sock


def die_with_parent(parent: int) -> None:
    """A worker must not outlive its master holding the port: on Linux the kernel sends it SIGTERM when
    the master dies (PR_SET_PDEATHSIG, even by kill -9), which drains it like a normal stop; the
    parent check in the worker's loop covers other platforms and a master that died before this ran."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def worker_main(settings: Settings, sock: socket.socket, dsn: str, index: int, restarted: bool = False,
                parent: int | None = None, lanes_dir: str | None = None) -> None:
    """Entry point of a worker process (forked)."""
    import asyncio

    from aiohttp import web

    from broker.app import create_app
    from broker.context import BROKER
    from broker.process.logsetup import configure_logging
    from broker.process.server import QueenRunner

    configure_logging(settings.log_level, prefix=f"w{index}")
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the master turns Ctrl-C into SIGTERM for us

    async def run() -> None:
        app = create_app(settings, dsn, worker_index=index, lanes_dir=lanes_dir)
        # max_line_size: a legal timer key (1024 characters) percent-encoded is up to 12 KiB on the request
        # line, more than aiohttp's 8190-byte default (which refused it with a text/plain 400).
        runner = QueenRunner(app, settings, handle_signals=False, access_log=None, max_line_size=32_768)
        await runner.setup()
        if restarted:
            deadline = time.monotonic() + RESTART_READY_WAIT_S
            while not app[BROKER].ready and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        site = web.SockSite(
            runner, sock, shutdown_timeout=float(settings.drain_timeout_s), ssl_context=settings.ssl_context()
        )
        await site.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        if parent is not None:
            die_with_parent(parent)

            async def watch_parent() -> None:
                while os.getppid() == parent:
                    await asyncio.sleep(1.0)
                log.error("worker %d: the master (pid %d) is gone; draining", index, parent)
                stop.set()

            watcher = loop.create_task(watch_parent(), name="parent-watch")
        await stop.wait()
        if parent is not None:
            watcher.cancel()
        log.info("worker %d draining", index)
        app[BROKER].draining = True
        await runner.cleanup()
        log.info("worker %d stopped", index)

    asyncio.run(run())


@dataclass
class _Slot:
    index: int
    proc: BaseProcess
    started: float
    deaths: list[float]


class Supervisor:
    def __init__(self, settings: Settings, dsn: str) -> None:
        self.settings = settings
        self.dsn = dsn
        self._ctx = mp.get_context("fork")
        self._slots: dict[int, _Slot] = {}
        self._stopping = False
        self.sock: socket.socket | None = None
        # The push lanes' Unix sockets (broker/log/lanes.py), private to this broker's processes
        self.lanes_dir: str | None = None

    def _spawn(self, index: int, deaths: list[float] | None = None) -> None:
        assert self.sock is not None
        proc = self._ctx.Process(
            target=worker_main,
            args=(self.settings, self.sock, self.dsn, index, deaths is not None, os.getpid(), self.lanes_dir),
            name=f"queen-worker-{index}",
            daemon=False,
        )
        proc.start()
        self._slots[index] = _Slot(index, proc, time.monotonic(), deaths or [])
        log.info("worker %d started (pid %d)", index, proc.pid)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if not self._stopping:
            log.info("received %s: draining", signal.Signals(signum).name)
        self._stopping = True

    def run(self) -> int:
        from broker import metrics

        self.sock = bind_socket(self.settings.host, self.settings.port)
        host, port = self.sock.getsockname()[:2]
        scheme = "https" if self.settings.tls else "http"
        log.info("listening on %s://%s:%d with %d workers", scheme, host, port, self.settings.workers)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        if self.settings.workers > 1 and self.settings.push_lanes:
            self.lanes_dir = tempfile.mkdtemp(prefix="queen-lanes-")  # mode 0700
        for i in range(self.settings.workers):
            self._spawn(i)
        try:
            while not self._stopping:
                time.sleep(0.1)
                for slot in list(self._slots.values()):
                    if slot.proc.is_alive() or self._stopping:
                        continue
                    code = slot.proc.exitcode
                    metrics.mark_process_dead(slot.proc.pid or 0)
                    now = time.monotonic()
                    deaths = [t for t in slot.deaths if now - t < RESTART_WINDOW_S] + [now]
                    log.error("worker %d (pid %s) died with exit code %s; restarting", slot.index, slot.proc.pid, code)
                    if len(deaths) >= RESTART_BURST:
                        log.error("worker %d is crash-looping; pausing 1s before the restart", slot.index)
                        time.sleep(1.0)
                    self._spawn(slot.index, deaths)
        finally:
            self._drain()
            if self.lanes_dir is not None:
                shutil.rmtree(self.lanes_dir, ignore_errors=True)
        return 0

    def _drain(self) -> None:
        # The master's copy of the listening socket goes first: once each worker has closed its own
        # (aiohttp stops the site before waiting for in-flight requests) new connections are refused
        # instead of queueing in a backlog nobody will serve.
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        for slot in self._slots.values():
            if slot.proc.is_alive() and slot.proc.pid:
                try:
                    os.kill(slot.proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + self.settings.drain_timeout_s + 5
        for slot in self._slots.values():
            slot.proc.join(max(0.0, deadline - time.monotonic()))
            if slot.proc.is_alive():
                log.error("worker %d did not drain in time; killing it", slot.index)
                slot.proc.kill()
                slot.proc.join(2)
        log.info("all workers stopped")


def prepare_metrics_dir(settings: Settings) -> str:
    """Point prometheus-client at a fresh multiprocess directory (before it is imported anywhere)."""
    path = settings.metrics_dir or tempfile.mkdtemp(prefix="queen-metrics-")
    if settings.metrics_dir and os.path.isdir(path):
        for name in os.listdir(path):
            if name.endswith(".db"):
                os.unlink(os.path.join(path, name))
    os.makedirs(path, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    return path


def cleanup_metrics_dir(path: str, owned: bool) -> None:
    if owned:
        shutil.rmtree(path, ignore_errors=True)

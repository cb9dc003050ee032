"""Two cells and HAProxy on loopback ports, for a laptop, the tests and the load scenario.

``LocalCells(base_dir).start()`` starts, per cell, an embedded PostgreSQL under ``base_dir/<cell>`` and
a ``queen serve`` on it (authentication on: one JWT secret shared by every cell), then HAProxy with the
generated configuration (``base_dir/haproxy.cfg``), the map (``base_dir/tenants.map``) and its stats
socket (``base_dir/haproxy.sock``). ``state()`` says where everything is; ``stop()`` stops it all.

``queen cells up`` runs ``python -m broker.cells.local`` detached, which holds a ``LocalCells`` until
SIGTERM and writes ``base_dir/state.json`` once ready; ``queen cells down`` sends that SIGTERM;
``queen cells status`` reads the state and asks every part how it is.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from broker.cells import haproxy
from broker.process.localserver import LocalBroker, free_port, http_get

STATE_FILE = "state.json"


class LocalCells:
    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        *,
        cells: tuple[str, ...] = ("a", "b"),
        default: str | None = None,
        workers: int = 1,
        secret: str | None = None,
        proxy_port: int | None = None,
        mapping: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        dsns: dict[str, str] | None = None,
    ) -> None:
        self.base = Path(base_dir).resolve()
        self.names = cells
        self.default = default or cells[0]
        self.workers = workers
        self.secret = secret or secrets.token_urlsafe(32)
        self.proxy_port = proxy_port or free_port()
        self.mapping = dict(mapping or {})
        self.extra_env = dict(env or {})
        # cell -> DSN of a database you run (any PostgreSQL); a cell without one gets an embedded server
        self.dsns = dict(dsns or {})
        self.pgs: dict[str, Any] = {}
        self.brokers: dict[str, LocalBroker] = {}
        self.proxy: subprocess.Popen[bytes] | None = None
        self.map_path = self.base / "tenants.map"
        self.socket_path = self.base / "haproxy.sock"
        self.config_path = self.base / "haproxy.cfg"

    @property
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    def url(self, cell: str) -> str:
        return self.brokers[cell].url

    def dsn(self, cell: str) -> str:
        return self.dsns[cell] if cell in self.dsns else str(self.pgs[cell].dsn())

    def start(self, timeout: float = 120.0) -> LocalCells:
        from broker.store import embedded

        binary = haproxy.ensure_installed()
        self.base.mkdir(parents=True, exist_ok=True)
        os.chmod(self.base, 0o755)  # the embedded server's unprivileged user walks into it
        try:
            for name in self.names:
                (self.base / name).mkdir(exist_ok=True)
                if name not in self.dsns:
                    self.pgs[name] = embedded.start(self.base / name)
                env = {"QUEEN_JWT_SECRET": self.secret, **self.extra_env}
                self.brokers[name] = LocalBroker(dsn=self.dsn(name), workers=self.workers, env=env,
                                                 log_path=self.base / name / "broker.log").start(wait=False)
            for b in self.brokers.values():
                b.wait_ready(timeout)
            cfg = haproxy.ProxyConfig(
                cells=tuple(haproxy.Cell(n, (f"127.0.0.1:{self.brokers[n].port}",)) for n in self.names),
                default=self.default, bind=f"127.0.0.1:{self.proxy_port}",
                map_path=self.map_path, socket_path=self.socket_path)
            haproxy.write_map(self.map_path, {**haproxy.read_map(self.map_path), **self.mapping})
            self.config_path.write_text(haproxy.render(cfg))
            haproxy.check_config(binary, self.config_path)
            self.socket_path.unlink(missing_ok=True)
            log = open(self.base / "haproxy.log", "ab")  # noqa: SIM115 - the child's for its lifetime
            self.proxy = subprocess.Popen([binary, "-db", "-f", str(self.config_path)], stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True)
            log.close()
            self._wait_proxy(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_proxy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proxy is not None and self.proxy.poll() is not None:
                raise RuntimeError(f"haproxy exited with {self.proxy.returncode}: {(self.base / 'haproxy.log').read_text()[-2000:]}")
            try:
                if all(http_get(f"{self.proxy_url}/cells/{n}/health", timeout=1.0)[0] == 200 for n in self.names) \
                        and self.socket_path.exists():
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"haproxy at {self.proxy_url} did not route to every cell within {timeout}s")

    def switch(self, tenant: str, cell: str) -> None:
        haproxy.switch(self.socket_path, self.map_path, tenant, cell)

    def state(self) -> dict[str, Any]:
        return {
            "proxy": self.proxy_url,
            "proxy_pid": self.proxy.pid if self.proxy else None,
            "socket": str(self.socket_path),
            "map": str(self.map_path),
            "config": str(self.config_path),
            "default": self.default,
            "secret": self.secret,
            "cells": {n: {"url": self.url(n), "dsn": self.dsn(n), "pid": self._pid(n)} for n in self.names},
        }

    def _pid(self, cell: str) -> int | None:
        proc = self.brokers[cell].proc
        return proc.pid if proc is not None else None

    def stop(self) -> None:
        if self.proxy is not None and self.proxy.poll() is None:
            self.proxy.terminate()
            try:
                self.proxy.wait(10)
            except subprocess.TimeoutExpired:
                self.proxy.kill()
        for b in self.brokers.values():
            b.stop()
        for pg in self.pgs.values():
            pg.stop()
        self.pgs.clear()

    def __enter__(self) -> LocalCells:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def read_state(base_dir: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads((base_dir / STATE_FILE).read_text()))
    except (OSError, ValueError):
        return None


def _hold(args: argparse.Namespace) -> int:
    """The detached process of ``queen cells up``: start, write the state, wait for SIGTERM, stop."""
    base = Path(args.dir).resolve()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    cells = LocalCells(base, workers=args.workers, secret=args.secret or os.environ.get("QUEEN_JWT_SECRET"),
                       proxy_port=args.port or None)
    try:
        cells.start()
    except BaseException as exc:
        (base / STATE_FILE).write_text(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        raise
    state = {**cells.state(), "pid": os.getpid()}
    tmp = base / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.chmod(tmp, 0o600)  # it holds the JWT secret
    os.replace(tmp, base / STATE_FILE)
    while not stop.wait(1.0):
        pass
    cells.stop()
    (base / STATE_FILE).unlink(missing_ok=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m broker.cells.local")
    p.add_argument("--dir", required=True)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--secret")
    return _hold(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

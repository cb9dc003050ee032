"""Run a real ``queen serve`` in a child process: used by the tests, the conformance runner (no URL
given), the load runner and the benches.

``LocalBroker(dsn=..., env={...}).start()`` picks a free port, starts ``python -m broker serve`` with
the given environment, waits until ``/health`` answers 200 on every worker, and ``stop()`` sends
SIGTERM and waits for a clean exit. The output goes to a log file (``log_path``) for post-mortems.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 2.0) -> tuple[int, dict]:
    """GET a JSON answer; an https URL is not verified (the readiness probe of a broker we started)."""
    ctx = None
    if url.startswith("https:"):
        import ssl

        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=ctx) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read() or b"{}")
        except ValueError:
            return exc.code, {}


def exit_on_sigterm() -> None:
    """SIGTERM (``timeout``, a CI runner's cancel, ``kill``) raises SystemExit in the main thread, so the
    caller's ``finally`` blocks and context managers stop what it started. A broker started here runs in
    its own session and outlives a parent that SIGTERM ends outright: a bench ended that way left two
    workers and an embedded PostgreSQL running beside the next runs. Call it once, from the main thread,
    at the start of a command that starts brokers or servers (the benches, the load and conformance
    runners)."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


class LocalBroker:
    def __init__(
        self,
        *,
        dsn: str | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        workers: int = 2,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        log_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.dsn = dsn
        self.data_dir = data_dir
        self.workers = workers
        self.extra_env = dict(env or {})
        self.port = port or free_port()
        scheme = "https" if self.extra_env.get("QUEEN_TLS_CERT_FILE") else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="queen-broker-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_") and k != "PROMETHEUS_MULTIPROC_DIR"}
        env.update({"QUEEN_HOST": "127.0.0.1", "QUEEN_PORT": str(self.port), "QUEEN_WORKERS": str(self.workers)})
        if self.dsn:
            env["QUEEN_DATABASE_URL"] = self.dsn
        if self.data_dir:
            env["QUEEN_DATA_DIR"] = str(self.data_dir)
        env.update(self.extra_env)
        return env

    def start(self, timeout: float = 60.0, wait: bool = True) -> LocalBroker:
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker", "serve"], env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until /health is 200 on every worker (each answer names its worker)."""
        deadline = time.monotonic() + timeout
        seen: set[int] = set()
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"queen serve exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                status, body = http_get(self.url + "/health", timeout=1.0)
                if status == 200:
                    seen.add(int(body.get("worker_id", 0)))
                    if len(seen) >= self.workers:
                        return
                    continue
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"broker at {self.url} not ready after {timeout}s (workers seen: {sorted(seen)}):\n{self.tail()}")

    def tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def worker_pids(self) -> list[int]:
        """PIDs of the worker processes (children of the master)."""
        assert self.proc is not None
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        return [int(x) for x in out.split()]

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(5)

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

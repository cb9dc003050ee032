"""Start a locally built C++ Queen (``server/bin/queen-server``, built outside this repository) on its own
fresh database of a PostgreSQL server, for the side-by-side bench; how to build it is in the docstring of
bench/bench_log_shape.py.

The binary is configured through its environment only (names from its documented variables): listen
address and port, 2 workers, pool sizes 10 (as our broker's bench setup), the PostgreSQL host/port/user/
password/database split out of a DSN (a ``?host=/dir`` Unix socket directory, as the embedded
PostgreSQL's DSN has, works as host). It creates its own schema on start from ``lib/schema`` found
relative to the working directory, so it runs from the ``server/`` directory next to its ``bin/``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from broker.process.localserver import free_port, http_get


def libpq_env(dsn: str) -> dict[str, str]:
    """The C++ broker's PG_* variables for a postgresql:// DSN. It writes ``password=<value>`` unquoted
    into its connection string, so an empty password (trust or peer auth) becomes a placeholder."""
    u = urlsplit(dsn)
    q = parse_qs(u.query)
    return {
        "PG_HOST": q.get("host", [u.hostname or "localhost"])[0],
        "PG_PORT": str(u.port or q.get("port", ["5432"])[0]),
        "PG_USER": unquote(u.username or "postgres"),
        "PG_PASSWORD": unquote(u.password or "") or "unused",
        "PG_DB": u.path.lstrip("/") or "postgres",
    }


class CppQueen:
    """``start()`` launches the binary and waits until it answers a push; ``stop()`` ends it (SIGTERM,
    then SIGKILL after 10 s). Its output goes to ``log_path``."""

    def __init__(self, binary: str | os.PathLike[str], dsn: str, *, workers: int = 2, pool: int = 10,
                 log_path: Path | None = None) -> None:
        self.binary = Path(binary).resolve()
        if not self.binary.is_file():
            raise SystemExit(f"--cpp-bin: no such file {self.binary}")
        self.server_dir = self.binary.parent.parent
        if not (self.server_dir.parent / "lib" / "schema" / "schema.sql").is_file():
            raise SystemExit(f"--cpp-bin: expected {self.server_dir.parent}/lib/schema/schema.sql next to server/bin/")
        self.dsn = dsn
        self.db = urlsplit(dsn).path.lstrip("/")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.buffers = tempfile.mkdtemp(prefix="cpp-queen-buffers-")
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("PG_", "QUEEN_", "DB_", "SIDECAR_"))},
            **libpq_env(dsn),
            "HOST": "127.0.0.1", "PORT": str(self.port), "NUM_WORKERS": str(workers),
            "DB_POOL_SIZE": str(pool), "SIDECAR_POOL_SIZE": str(pool),
            "FILE_BUFFER_DIR": self.buffers, "QUEEN_UDP_NOTIFY_PORT": str(free_port()), "LOG_LEVEL": "warn",
        }
        self.log_path = log_path or Path(tempfile.gettempdir()) / "bench_cpp_queen.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> None:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([str(self.binary)], cwd=self.server_dir, env=self.env,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"C++ Queen exited with {self.proc.returncode}; see {self.log_path}")
            if self._answers_push():
                return
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"C++ Queen not ready after {timeout:g} s; see {self.log_path}")

    def _answers_push(self) -> bool:
        """Healthy and its schema installed: /health says the database is connected before worker 0 has
        run the schema, so readiness is a push that is accepted."""
        try:
            if http_get(self.url + "/health")[0] != 200:
                return False
            req = urllib.request.Request(
                self.url + "/api/v1/push", method="POST", headers={"Content-Type": "application/json"},
                data=b'{"items":[{"queue":"bench-ready","partition":"0","payload":{"ready":true}}]}')
            with urllib.request.urlopen(req, timeout=2.0) as resp:
                return resp.status in (200, 201)
        except (OSError, urllib.error.URLError, ValueError):
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        shutil.rmtree(self.buffers, ignore_errors=True)

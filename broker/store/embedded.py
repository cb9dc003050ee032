"""Embedded PostgreSQL (pgserver) for the zero-config default and the tests.

``start(data_dir)`` initialises (first run) or reuses the cluster under ``data_dir/pg`` and returns a
DSN. Data stays on disk between runs. pgserver runs the server as an unprivileged user when we are
root, which plain ``initdb`` refuses to do. Several processes may share one data dir; the server stops
when the last one that started it exits.
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

log = logging.getLogger("queen.embedded")

# Settings the embedded server gets on first init (a restart applies them). Durability stays full:
# fsync and synchronous_commit are left at PostgreSQL's defaults (on).
_TUNING = {
    "max_connections": "400",
    "shared_buffers": "256MB",
    "wal_buffers": "16MB",
    "max_wal_size": "2GB",
    "checkpoint_timeout": "15min",
}


class EmbeddedPostgres:
    def __init__(self, data_dir: Path) -> None:
        import pgserver  # imported lazily: only the embedded path needs it

        self.pgdata = (Path(data_dir) / "pg").resolve()
        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        fresh = not (self.pgdata / "PG_VERSION").exists()
        self._server = pgserver.get_server(self.pgdata, cleanup_mode="stop")
        if fresh or self._needs_tuning():
            self._tune()

    def _needs_tuning(self) -> bool:
        out = self._server.psql("SHOW max_connections;")
        return _TUNING["max_connections"] not in out

    def _tune(self) -> None:
        for key, value in _TUNING.items():
            self._server.psql(f"ALTER SYSTEM SET {key} = '{value}';")
        self.restart()

    def restart(self) -> None:
        self.pg_ctl("restart")
        self.refresh()

    def refresh(self) -> None:
        """Re-read postmaster.pid after a (re)start so pgserver's stop-at-exit targets the live server."""
        from pgserver.utils import PostmasterInfo

        info = PostmasterInfo.read_from_pgdata(self.pgdata)
        if info is not None:
            self._server._postmaster_info = info

    def _reopen_traversal(self) -> None:
        """As root, pgserver runs pg_ctl as an unprivileged user, who must be able to walk down to the
        data directory. It opens the parent directories once at start, but something may tighten one
        later (pytest resets ``/tmp/pytest-of-<user>`` to 0700 at every session start, nested sessions
        included), so open them again before each pg_ctl."""
        if os.name == "posix" and os.geteuid() == 0:
            from pgserver.utils import ensure_prefix_permissions

            ensure_prefix_permissions(self.pgdata)

    def pg_ctl(self, action: str, *extra: str) -> None:
        """Run ``pg_ctl <action>`` against the embedded cluster (tests stop/start it with this)."""
        from pgserver._commands import pg_ctl  # type: ignore[attr-defined]

        self._reopen_traversal()
        info = self._server.get_postmaster_info()
        socket_dir = info.socket_dir
        args = ["-w", "-m", "fast", "-l", str(self.pgdata / "log")]
        if action in ("start", "restart"):
            args += ["-o", '-h ""', "-o", f"-k {socket_dir}"]
        args += list(extra) + [action]
        try:
            pg_ctl(args, pgdata=self.pgdata, user=self._server.system_user, timeout=60)
        except subprocess.CalledProcessError as exc:  # pragma: no cover - surfaced with the log
            log.error("pg_ctl %s failed: %s", action, (self.pgdata / "log").read_text()[-4000:])
            raise exc

    def dsn(self, database: str = "postgres") -> str:
        return self._server.get_uri(database)

    def stop(self) -> None:
        self._reopen_traversal()
        self._server.cleanup()


def start(data_dir: Path) -> EmbeddedPostgres:
    pg = EmbeddedPostgres(data_dir)
    log.info("embedded PostgreSQL data in %s (dsn %s)", pg.pgdata, pg.dsn())
    return pg

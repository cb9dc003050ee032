"""Embedded PostgreSQL (pgserver) for the zero-config default and the tests.

``start(data_dir)`` initialises (first run) or reuses the cluster under ``data_dir/pg`` and returns a
DSN. Data stays on disk between runs. ``start_scratch(prefix)`` is the throwaway kind the benches and
load tests use: a fresh temporary directory, removed by ``stop()`` (a 100,000-timer bench leaves
gigabytes of WAL and heap behind otherwise). pgserver runs the server as an unprivileged user when we are
root, which plain ``initdb`` refuses to do. Several processes may share one data dir; the server stops
when the last one that started it exits.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger("queen.embedded")

MB = 1024 * 1024
GB = 1024 * MB


def machine_memory() -> int:
    """Bytes of memory this machine (or its cgroup, when that is smaller) gives us."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            raw = Path(limit).read_text().strip()
        except OSError:
            continue
        if raw.isdigit() and 0 < int(raw) < total:
            total = int(raw)
    return total


def _clamp(v: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, v))


def tuning(memory: int, disk_free: int) -> dict[str, str]:
    """Server settings sized for the machine the embedded PostgreSQL starts on (values in MB).

    Stock PostgreSQL (shared_buffers 128MB, max_wal_size 1GB) checkpoints every few seconds under a
    batch push and cost about a third of the throughput of a tuned server (docs/performance.md). So: shared_buffers an eighth of memory (1/4 is the usual advice for a dedicated
    server; the broker, its workers and the OS cache share this one), the planner told half of memory
    is cache, WAL allowed to grow to 1/20 of the free disk up to 8GB so checkpoints are spread by time,
    not forced by volume. Autovacuum looks at each database every 5 s instead of every minute: fired
    timers are deleted rows in front of every claim until a vacuum removes them (queen_timers is vacuumed
    from 5,000 dead rows, broker/sql/migrations/0022_timers_vacuum.sql), and at 1,000 fired/s a minute's wait
    is 60,000 of them. Durability stays full: fsync and synchronous_commit keep their defaults (on).
    """
    shared = _clamp(memory // 8, 128 * MB, 4 * GB)
    wal = _clamp(disk_free // 20, 1 * GB, 8 * GB)
    return {
        "max_connections": "400",
        "shared_buffers": f"{shared // MB}MB",
        "effective_cache_size": f"{_clamp(memory // 2, 512 * MB, 64 * GB) // MB}MB",
        "maintenance_work_mem": f"{_clamp(memory // 32, 64 * MB, 1 * GB) // MB}MB",
        "wal_buffers": "16MB",
        "max_wal_size": f"{wal // MB}MB",
        "min_wal_size": f"{_clamp(wal // 8, 80 * MB, 1 * GB) // MB}MB",
        "checkpoint_timeout": "15min",
        "checkpoint_completion_target": "0.9",
        "autovacuum_naptime": "5s",
    }


def _in_kb(value: str) -> int | None:
    """'256MB' / '16MB' / '15min' -> comparable number (kB for sizes, the number for the rest)."""
    for suffix, factor in (("GB", 1024 * 1024), ("MB", 1024), ("kB", 1)):
        if value.endswith(suffix):
            return int(value[: -len(suffix)]) * factor
    return None


class EmbeddedPostgres:
    def __init__(self, data_dir: Path) -> None:
        import pgserver  # imported lazily: only the embedded path needs it

        self.pgdata = (Path(data_dir) / "pg").resolve()
        self.scratch: Path | None = None  # a directory stop() removes (start_scratch)
        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        fresh = not (self.pgdata / "PG_VERSION").exists()
        self._server = pgserver.get_server(self.pgdata, cleanup_mode="stop")
        self.tuning = tuning(machine_memory(), shutil.disk_usage(self.pgdata).free)
        stale = self.untuned()
        if fresh or stale:
            if stale:
                log.info("embedded PostgreSQL: applying %s", ", ".join(f"{k}={self.tuning[k]}" for k in stale))
            self._tune()

    def settings(self) -> dict[str, str]:
        """The running server's values of the tuned settings, as PostgreSQL shows them."""
        names = ", ".join(f"'{k}'" for k in self.tuning)
        out = self._server.psql(
            "SELECT name || '=' || CASE WHEN unit = '8kB' THEN (setting::bigint * 8)::text || 'kB' "
            "WHEN unit IN ('kB', 'MB') THEN setting || unit WHEN unit = 's' THEN setting || 's' ELSE setting END "
            f"FROM pg_settings WHERE name IN ({names});")
        got: dict[str, str] = {}
        for line in out.splitlines():
            k, sep, v = line.strip().partition("=")
            if sep and k in self.tuning:
                got[k] = v
        return got

    def untuned(self) -> list[str]:
        """Tuned settings whose running value differs from this machine's sizing (a data dir made on
        another machine, or by an older broker): they are applied again (one restart)."""
        got = self.settings()
        stale = []
        for k, want in self.tuning.items():
            have = got.get(k)
            if want.endswith("min"):
                same = have == f"{int(want[:-3]) * 60}s"
            elif _in_kb(want) is not None and have is not None and have.endswith(("kB", "MB")):
                same = _in_kb(want) == _in_kb(have)
            else:
                same = have == want
            if not same:
                stale.append(k)
        return stale

    def _tune(self) -> None:
        for key, value in self.tuning.items():
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
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


def start(data_dir: Path) -> EmbeddedPostgres:
    pg = EmbeddedPostgres(data_dir)
    log.info("embedded PostgreSQL data in %s (dsn %s)", pg.pgdata, pg.dsn())
    return pg


def start_scratch(prefix: str) -> EmbeddedPostgres:
    """An embedded PostgreSQL in a new temporary directory that ``stop()`` deletes."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(d, 0o755)  # the unprivileged server user must be able to walk into it
    try:
        pg = start(d)
    except BaseException:
        shutil.rmtree(d, ignore_errors=True)
        raise
    pg.scratch = d
    return pg

"""``queen cluster``: a local PostgreSQL cluster that fails over, to try the broker (and
``queen loadtest failover``) against: one etcd and two Patroni nodes running PostgreSQL 15, all on
loopback, optionally with HAProxy in front routing to whichever node Patroni's REST ``/primary`` says
is the primary (the layout Patroni documents).

    queen cluster install                  # as root: etcd-server, postgresql-15, haproxy (apt), the [cluster] extra (pip)
    queen cluster up [--dir D] [--async] [--haproxy]
    queen cluster status | kill-primary [--lag S] | switchover | down   [--dir D]

``up`` prints the DSNs: ``multi`` (both nodes, ``target_session_attrs=read-write``), ``node1`` and
``node2`` (one node each: a name that may land on a standby), ``haproxy``. Everything runs under
``--dir`` (default ``/tmp/queen-cluster``), whose ``cluster.json`` records the processes this helper
started, so ``down`` stops those and nothing else. As root, etcd, Patroni and PostgreSQL run as the
unprivileged ``postgres`` user (PostgreSQL refuses root).

Patroni's settings are the ones docs/guides/failover.md explains: ``synchronous_mode: true`` (``--async``
turns it off, to see what asynchronous replication loses), ``primary_start_timeout: 0`` (a crashed
primary fails over at once instead of being restarted in place), ``ttl: 20`` (Patroni's floor),
``loop_wait: 1``, ``retry_timeout: 5``, ``use_pg_rewind`` (the old primary rejoins as a standby).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from broker.process import apt as aptget
from broker.process.pids import alive

DEFAULT_DIR = "/tmp/queen-cluster"
PG_BIN = Path("/usr/lib/postgresql/15/bin")
PIP_PACKAGES = ("patroni[etcd]==4.1.5", "psycopg[binary]>=3.1")
INSTALL_TIMEOUT_S = 900
# As root, Patroni runs as the unprivileged user from a virtualenv of Debian's python3 under /opt: the
# caller's interpreter may live where that user cannot read (a pyenv build under /root).
ROOT_VENV = Path("/opt/queen-cluster/venv")
NODES = ("node1", "node2")
RUN_AS = "postgres"


class ClusterError(RuntimeError):
    pass


# ---------------------------------------------------------------- installation
def missing() -> list[str]:
    """What ``install`` would add: Debian packages whose binaries are absent, and the pip extra."""
    out = []
    if shutil.which("etcd") is None:
        out.append("etcd-server")
    if not (PG_BIN / "postgres").exists():
        out.append("postgresql-15")
    if shutil.which("haproxy") is None:
        out.append("haproxy")
    if not patroni_bin().exists():
        if os.geteuid() == 0 and (not Path("/usr/bin/python3").exists() or subprocess.run(
                ["/usr/bin/python3", "-c", "import ensurepip, venv"], capture_output=True).returncode != 0):
            out.append("python3-venv")  # Debian's python3, for Patroni's virtualenv (ROOT_VENV)
        out.append("pip:cluster")
    return out


def patroni_bin() -> Path:
    """The ``patroni`` executable: ROOT_VENV's as root, else the one beside this interpreter."""
    if os.geteuid() == 0:
        return ROOT_VENV / "bin" / "patroni"
    return Path(sys.executable).with_name("patroni")


def install(*, quiet: bool = False) -> list[str]:
    """Install what is missing: apt-get as root for the Debian parts, pip (this interpreter) for Patroni.
    Answers what was installed; raises ClusterError with the command's output when a step fails."""
    need = missing()
    apt = [p for p in need if not p.startswith("pip:")]
    if apt:
        if not aptget.may_install():
            raise ClusterError(f"missing {', '.join(apt)}: install them as root (apt-get install -y {' '.join(apt)})")
        try:
            aptget.install(apt, timeout_s=INSTALL_TIMEOUT_S,
                           present=lambda: not [p for p in missing() if not p.startswith("pip:")])
        except aptget.AptError as exc:
            raise ClusterError(str(exc)) from None
    if "pip:cluster" in need and os.geteuid() != 0:
        cmd_list = [sys.executable, "-m", "pip", "install", "-q", *PIP_PACKAGES]
        _run_install(cmd_list, " ".join(cmd_list))
    elif "pip:cluster" in need:
        venv = ["/usr/bin/python3", "-m", "venv", str(ROOT_VENV)]
        _run_install(venv, " ".join(venv))
        pip = [str(ROOT_VENV / "bin" / "pip"), "install", "-q", *PIP_PACKAGES]
        _run_install(pip, " ".join(pip))
    if not quiet and need:
        print(f"installed: {', '.join(need)}")
    return need


def _run_install(cmd: list[str], shown: str) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise ClusterError(f"`{shown}` took more than {INSTALL_TIMEOUT_S} s") from exc
    if proc.returncode != 0:
        raise ClusterError(f"`{shown}` failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


# ---------------------------------------------------------------- layout
def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports free right now (bound to port 0 and released together)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Node:
    name: str
    pg_port: int
    api_port: int
    pid: int | None = None

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"


@dataclass
class State:
    dir: str
    synchronous: bool
    etcd_port: int
    etcd_peer_port: int
    nodes: list[Node]
    haproxy_port: int | None = None
    etcd_pid: int | None = None
    haproxy_pid: int | None = None
    database: str = "queen"
    extra: dict[str, Any] = field(default_factory=dict)

    def save(self) -> None:
        Path(self.dir, "cluster.json").write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, directory: str) -> State:
        path = Path(directory, "cluster.json")
        if not path.exists():
            raise ClusterError(f"no cluster in {directory} (no cluster.json): `queen cluster up --dir {directory}` first")
        raw = json.loads(path.read_text())
        raw["nodes"] = [Node(**n) for n in raw["nodes"]]
        return cls(**raw)

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise ClusterError(f"no node {name!r}")

    def dsns(self) -> dict[str, str]:
        db = self.database
        hosts = ",".join(f"127.0.0.1:{n.pg_port}" for n in self.nodes)
        out = {"multi": f"postgresql://postgres@{hosts}/{db}?target_session_attrs=read-write"}
        for n in self.nodes:
            out[n.name] = f"postgresql://postgres@127.0.0.1:{n.pg_port}/{db}"
        if self.haproxy_port:
            out["haproxy"] = f"postgresql://postgres@127.0.0.1:{self.haproxy_port}/{db}"
        return out


# ---------------------------------------------------------------- processes
def _as_user() -> dict[str, Any]:
    """Popen arguments that drop root to the ``postgres`` user (PostgreSQL refuses to run as root)."""
    if os.geteuid() != 0:
        return {}
    try:
        pw = pwd.getpwnam(RUN_AS)
    except KeyError as exc:
        raise ClusterError(f"running as root needs the {RUN_AS!r} user (Debian's postgresql-15 creates it)") from exc
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}


def _chown(path: Path) -> None:
    if os.geteuid() == 0:
        pw = pwd.getpwnam(RUN_AS)
        os.chown(path, pw.pw_uid, pw.pw_gid)


def _spawn(cmd: list[str], log: Path, *, drop_root: bool = True, cwd: Path | None = None) -> int:
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            cwd=cwd, env={**os.environ, "HOME": str(cwd or log.parent)}, **(_as_user() if drop_root else {}),
        )
    return proc.pid


def _stop_pid(pid: int | None, timeout_s: float = 15.0) -> None:
    if not alive(pid):
        return
    assert pid is not None
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.1)
    if alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and alive(pid):
            time.sleep(0.05)


def _postmaster_pid(data_dir: Path) -> int | None:
    try:
        return int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------- configuration files
def _patroni_yaml(st: State, node: Node) -> str:
    d = Path(st.dir)
    etcd = f"127.0.0.1:{st.etcd_port}"
    return f"""scope: queen
name: {node.name}
log:
  level: INFO
restapi:
  listen: 127.0.0.1:{node.api_port}
  connect_address: 127.0.0.1:{node.api_port}
etcd3:
  hosts: [{etcd}]
bootstrap:
  dcs:
    ttl: 20
    loop_wait: 1
    retry_timeout: 5
    maximum_lag_on_failover: 1048576
    primary_start_timeout: 0
    synchronous_mode: {"true" if st.synchronous else "false"}
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_log_hints: "on"
        max_connections: 200
        max_wal_senders: 10
        max_replication_slots: 10
        hot_standby: "on"
        wal_keep_size: 128MB
        shared_buffers: 64MB
        fsync: "on"
  initdb:
    - encoding: UTF8
    - locale: C
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:{node.pg_port}
  connect_address: 127.0.0.1:{node.pg_port}
  data_dir: {d / node.name}
  bin_dir: {PG_BIN}
  pgpass: {d / (node.name + '.pgpass')}
  authentication:
    superuser:
      username: postgres
    replication:
      username: postgres
    rewind:
      username: postgres
  parameters:
    unix_socket_directories: {d}
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
tags:
  nofailover: false
  noloadbalance: false
  clonefrom: false
  nosync: false
"""


def _haproxy_cfg(st: State) -> str:
    servers = "\n".join(
        f"  server {n.name} 127.0.0.1:{n.pg_port} maxconn 200 check port {n.api_port}" for n in st.nodes
    )
    return f"""global
  maxconn 1000
defaults
  mode tcp
  retries 2
  timeout connect 2s
  timeout client 30m
  timeout server 30m
  timeout check 1s
listen primary
  bind 127.0.0.1:{st.haproxy_port}
  option httpchk GET /primary
  http-check expect status 200
  default-server inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions
{servers}
"""


# ---------------------------------------------------------------- the cluster
class Cluster:
    def __init__(self, state: State) -> None:
        self.st = state
        self.http = httpx.Client(timeout=2.0)

    # -- start
    @classmethod
    def up(cls, directory: str = DEFAULT_DIR, *, synchronous: bool = True, haproxy: bool = False,
           timeout_s: float = 120.0) -> Cluster:
        d = Path(directory)
        if (d / "cluster.json").exists():
            with contextlib.suppress(ClusterError):
                old = cls(State.load(directory))
                if old.running():
                    raise ClusterError(f"a cluster is already running in {directory}: `queen cluster down --dir {directory}`")
                old.down()
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        os.chmod(d, 0o755)
        _chown(d)
        ports = free_ports(2 + 2 * len(NODES) + (1 if haproxy else 0))
        st = State(dir=str(d), synchronous=synchronous, etcd_port=ports[0], etcd_peer_port=ports[1],
                   nodes=[Node(name, ports[2 + 2 * i], ports[3 + 2 * i]) for i, name in enumerate(NODES)],
                   haproxy_port=ports[-1] if haproxy else None)
        c = cls(st)
        try:
            c._start_etcd()
            st.save()
            for node in st.nodes:
                cfg = d / f"{node.name}.yml"
                cfg.write_text(_patroni_yaml(st, node))
                _chown(cfg)
                node.pid = _spawn([str(patroni_bin()), str(cfg)], d / f"{node.name}.log", cwd=d)
                st.save()
                if node is st.nodes[0]:
                    c.wait_primary(timeout_s)  # the first node bootstraps; the second clones from it
            c.wait_healthy(timeout_s)
            c._create_database()
            if haproxy:
                cfg = d / "haproxy.cfg"
                cfg.write_text(_haproxy_cfg(st))
                st.haproxy_pid = _spawn(["haproxy", "-db", "-f", str(cfg)], d / "haproxy.log", drop_root=False, cwd=d)
                st.save()
                c.wait_port(st.haproxy_port or 0, timeout_s=10)
        except BaseException:
            c.down()
            raise
        return c

    def _start_etcd(self) -> None:
        st, d = self.st, Path(self.st.dir)
        data = d / "etcd"
        peer = f"http://127.0.0.1:{st.etcd_peer_port}"
        client = f"http://127.0.0.1:{st.etcd_port}"
        st.etcd_pid = _spawn(["etcd", "--name", "queen-etcd", "--data-dir", str(data),
                              "--listen-client-urls", client, "--advertise-client-urls", client,
                              "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                              "--initial-cluster", f"queen-etcd={peer}", "--initial-cluster-state", "new",
                              "--enable-v2=true"], d / "etcd.log", cwd=d)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if self.http.get(f"{client}/health").status_code == 200:
                    return
            if not alive(st.etcd_pid):
                break
            time.sleep(0.2)
        raise ClusterError(f"etcd did not start: {self._tail(d / 'etcd.log')}")

    def _create_database(self) -> None:
        import asyncio

        import asyncpg

        primary = self.primary()
        assert primary is not None

        async def create() -> None:
            conn = await asyncpg.connect(host="127.0.0.1", port=primary.pg_port, user="postgres", database="postgres")
            try:
                if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", self.st.database):
                    await conn.execute(f'CREATE DATABASE "{self.st.database}"')
            finally:
                await conn.close()

        asyncio.run(create())

    @staticmethod
    def _tail(path: Path, n: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return path.read_text(errors="replace")[-n:]
        return "(no log)"

    # -- look
    def member(self, node: Node) -> dict[str, Any] | None:
        """Patroni's view of one node (GET /patroni), or None when its REST API does not answer."""
        try:
            r = self.http.get(f"{node.api}/patroni")
        except httpx.HTTPError:
            return None
        with contextlib.suppress(ValueError):
            body: dict[str, Any] = r.json()
            return body
        return None

    def primary(self) -> Node | None:
        """The node whose REST ``/primary`` answers 200 (what HAProxy checks)."""
        for node in self.st.nodes:
            with contextlib.suppress(httpx.HTTPError):
                if self.http.get(f"{node.api}/primary").status_code == 200:
                    return node
        return None

    def status(self) -> list[dict[str, Any]]:
        rows = []
        for node in self.st.nodes:
            m = self.member(node) or {}
            rows.append({"name": node.name, "pg": f"127.0.0.1:{node.pg_port}", "api": node.api,
                         "role": m.get("role", "down"), "state": m.get("state", "unreachable"),
                         "timeline": m.get("timeline"), "patroni_pid": node.pid,
                         "patroni": "running" if alive(node.pid) else "stopped",
                         "sync_standby": bool((m.get("replication_state") == "streaming") and m.get("sync_standby"))})
        return rows

    def running(self) -> bool:
        return any(alive(p) for p in [self.st.etcd_pid, self.st.haproxy_pid, *(n.pid for n in self.st.nodes)])

    def wait_port(self, port: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
            time.sleep(0.1)
        raise ClusterError(f"nothing listens on 127.0.0.1:{port} after {timeout_s:g} s")

    def wait_primary(self, timeout_s: float = 60.0, *, not_node: str | None = None) -> Node:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            p = self.primary()
            if p is not None and p.name != not_node:
                return p
            time.sleep(0.2)
        raise ClusterError(f"no primary after {timeout_s:g} s: {self.status()}\n"
                           + "\n".join(self._tail(Path(self.st.dir) / f"{n.name}.log", 600) for n in self.st.nodes))

    def wait_healthy(self, timeout_s: float = 90.0) -> None:
        """A primary and every other node a streaming replica (the synchronous one, in synchronous mode)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            p = self.primary()
            if p is not None:
                cluster = None
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    cluster = self.http.get(f"{p.api}/cluster").json()
                members = (cluster or {}).get("members", [])
                replicas = [m for m in members if m.get("name") != p.name]
                want = "sync_standby" if self.st.synchronous else "replica"
                if len(replicas) == len(self.st.nodes) - 1 and all(
                    m.get("role") == want and m.get("state") == "streaming" for m in replicas
                ):
                    return
            time.sleep(0.3)
        raise ClusterError(f"the cluster did not settle in {timeout_s:g} s: {self.status()}")

    # -- faults
    def kill_primary(self, settle_s: float = 90.0) -> Node:
        """kill -9 the primary's postmaster (the server dies; Patroni on that node lives on), once the
        cluster has settled (``wait_healthy``): killed while its standby is still catching up (just after
        a failover), a synchronous-mode primary is restarted in place rather than failed over."""
        self.wait_healthy(settle_s)
        p = self.primary()
        if p is None:
            raise ClusterError("no primary to kill")
        pid = _postmaster_pid(Path(self.st.dir) / p.name)
        if pid is None:
            raise ClusterError(f"{p.name} has no postmaster.pid")
        os.kill(pid, signal.SIGKILL)
        return p

    def _children(self, node: Node, what: str) -> list[int]:
        """PIDs of ``node``'s server processes whose title contains ``what`` (children of its postmaster)."""
        pm = _postmaster_pid(Path(self.st.dir) / node.name)
        if pm is None:
            return []
        out = subprocess.run(["pgrep", "-P", str(pm), "-f", what], capture_output=True, text=True).stdout
        return [int(x) for x in out.split()]

    def kill_primary_lagging(self, lag_s: float, settle_s: float = 90.0) -> Node:
        """A standby that lags, then the primary dies: the primary's WAL senders are stopped (SIGSTOP)
        for ``lag_s`` seconds under load, then the primary's postmaster and those senders are killed -9.
        What a slow or cut-off replication link before a crash does: asynchronous replication loses the
        commits of those seconds; synchronous mode acknowledged none of them (they wait for the standby)."""
        self.wait_healthy(settle_s)
        p = self.primary()
        if p is None:
            raise ClusterError("no primary to kill")
        senders = self._children(p, "walsender")
        if not senders:
            raise ClusterError(f"no WAL sender on {p.name}")
        pm = _postmaster_pid(Path(self.st.dir) / p.name)
        if pm is None:
            raise ClusterError(f"{p.name} has no postmaster.pid")
        for pid in senders:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(lag_s)
        for pid in [pm, *senders]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return p

    def switchover(self, settle_s: float = 90.0) -> tuple[Node, Node]:
        """Patroni's planned switchover (POST /switchover on the primary) to the other node, once the
        cluster has settled (``wait_healthy``)."""
        self.wait_healthy(settle_s)
        p = self.primary()
        if p is None:
            raise ClusterError("no primary to switch over from")
        candidate = next(n for n in self.st.nodes if n.name != p.name)
        r = self.http.post(f"{p.api}/switchover", json={"leader": p.name, "candidate": candidate.name}, timeout=60)
        if r.status_code != 200:
            raise ClusterError(f"switchover refused ({r.status_code}): {r.text}")
        return p, candidate

    # -- stop
    def down(self) -> None:
        st = self.st
        _stop_pid(st.haproxy_pid, 5)
        for node in st.nodes:
            _stop_pid(node.pid, 20)  # Patroni stops its PostgreSQL
        for node in st.nodes:  # a Patroni killed -9 leaves its server behind: stop that one too
            pm = _postmaster_pid(Path(st.dir) / node.name)
            if pm is not None and alive(pm):
                _stop_pid(pm, 10)
        _stop_pid(st.etcd_pid, 10)
        self.http.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()


# ---------------------------------------------------------------- command line
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="queen cluster", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("command", choices=("install", "up", "down", "status", "kill-primary", "switchover", "dsn"))
    ap.add_argument("--dir", default=DEFAULT_DIR, help=f"where the cluster lives (default {DEFAULT_DIR})")
    ap.add_argument("--async", dest="asynchronous", action="store_true",
                    help="up: asynchronous replication (synchronous_mode: false), to see what it loses")
    ap.add_argument("--haproxy", action="store_true", help="up: HAProxy in front, checking Patroni's REST /primary")
    ap.add_argument("--install", action="store_true", help="up: install what is missing first (as `install` does)")
    ap.add_argument("--wait", action="store_true", help="kill-primary, switchover: return once a new primary serves")
    ap.add_argument("--lag", type=float, default=0.0, metavar="S",
                    help="kill-primary: first stop the primary's WAL senders for S seconds (a lagging replica)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "install":
            done = install()
            if not done:
                print("nothing to install")
            return 0
        if args.command == "up":
            if args.install:
                install()
            elif missing():
                print(f"queen cluster: missing {', '.join(missing())}; run `queen cluster install` (as root)", file=sys.stderr)
                return 2
            c = Cluster.up(args.dir, synchronous=not args.asynchronous, haproxy=args.haproxy)
            print(f"cluster up in {args.dir} ({'synchronous' if c.st.synchronous else 'asynchronous'} replication)")
            for kind, dsn in c.st.dsns().items():
                print(f"  {kind:8} {dsn}")
            c.http.close()
            return 0
        c = Cluster(State.load(args.dir))
        if args.command == "down":
            c.down()
            print(f"cluster in {args.dir} stopped")
        elif args.command == "status":
            print(json.dumps(c.status(), indent=2))
        elif args.command == "dsn":
            print(json.dumps(c.st.dsns(), indent=2))
        elif args.command == "kill-primary":
            old = c.kill_primary_lagging(args.lag) if args.lag > 0 else c.kill_primary()
            print(f"killed -9 the postmaster of {old.name}" + (f" after {args.lag:g} s of standby lag" if args.lag > 0 else ""))
            if args.wait:
                print(f"new primary: {c.wait_primary(60, not_node=old.name).name}")
        elif args.command == "switchover":
            old, new = c.switchover()
            print(f"switchover {old.name} -> {new.name}")
            if args.wait:
                print(f"new primary: {c.wait_primary(60, not_node=old.name).name}")
        return 0
    except ClusterError as exc:
        print(f"queen cluster: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

"""``queen cells up|down|status`` and ``queen tenant move|unfreeze`` (wired into broker/process/cli.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from broker.config import Settings
from broker.process.pids import alive

DEFAULT_DIR = ".queen-cells"
UP_TIMEOUT_S = 180.0


def add_parsers(sub: Any) -> None:
    c = sub.add_parser("cells", help="two local cells (embedded PostgreSQL + broker each) behind HAProxy, on loopback ports")
    csub = c.add_subparsers(dest="cells_command", required=True)
    up = csub.add_parser("up", help="start two cells and the proxy in the background; print where they are")
    up.add_argument("--dir", default=DEFAULT_DIR, help=f"state, data and proxy files (default {DEFAULT_DIR})")
    up.add_argument("--port", type=int, default=0, help="the proxy's port (default: a free one)")
    up.add_argument("--workers", type=int, default=1, help="broker workers per cell (default 1)")
    up.set_defaults(func=cmd_cells_up)
    down = csub.add_parser("down", help="stop what `queen cells up` started (the data stays in --dir)")
    down.add_argument("--dir", default=DEFAULT_DIR)
    down.set_defaults(func=cmd_cells_down)
    st = csub.add_parser("status", help="each cell's health (direct and through the proxy) and the proxy's map")
    st.add_argument("--dir", default=DEFAULT_DIR)
    st.add_argument("--json", action="store_true", help="print the state as JSON (it includes the JWT secret)")
    st.set_defaults(func=cmd_cells_status)

    rt = csub.add_parser("route", help="send a tenant to a cell (the proxy's map, at run time and in its file; "
                                       "moves no data: see `queen tenant move`)")
    rt.add_argument("tenant")
    rt.add_argument("cell")
    rt.add_argument("--dir", default=DEFAULT_DIR)
    rt.set_defaults(func=cmd_cells_route)

    t = sub.add_parser("tenant", help="operate on one tenant across cells")
    tsub = t.add_subparsers(dest="tenant_command", required=True)
    mv = tsub.add_parser("move", help="freeze a tenant in its cell, copy it to another, switch the proxy, resume it there",
                         description="--from/--to are the PostgreSQL DSNs of the cells' databases (docs/guides/cells.md).")
    mv.add_argument("tenant")
    mv.add_argument("--from", dest="source", required=True, help="DSN of the source cell's database")
    mv.add_argument("--to", dest="target", required=True, help="DSN of the target cell's database")
    mv.add_argument("--proxy-socket", help="HAProxy stats socket (level admin) whose map to switch")
    mv.add_argument("--proxy-map", help="the map file the proxy reads (tenant -> cell)")
    mv.add_argument("--to-cell", help="the target cell's name in the map")
    mv.add_argument("--cells-dir", help="a `queen cells up` directory: takes the socket and map from it (--to-cell still needed)")
    mv.add_argument("--retry-after", type=int, default=1, help="seconds the frozen tenant's 503s ask clients to wait (default 1)")
    mv.set_defaults(func=cmd_tenant_move)
    uf = tsub.add_parser("unfreeze", help="drop a tenant's freeze row in one cell (after an interrupted move)")
    uf.add_argument("tenant")
    uf.add_argument("--db", required=True, help="DSN of the cell's database")
    uf.set_defaults(func=cmd_tenant_unfreeze)


def _state(base: Path) -> dict[str, Any] | None:
    from broker.cells.local import read_state

    return read_state(base)


def cmd_cells_up(args: argparse.Namespace, settings: Settings) -> int:
    from broker.cells.local import STATE_FILE

    base = Path(args.dir).resolve()
    st = _state(base)
    if st and st.get("pid") and alive(int(st["pid"])):
        print(f"queen cells: already up (pid {st['pid']}); `queen cells down --dir {args.dir}` first", file=sys.stderr)
        return 1
    base.mkdir(parents=True, exist_ok=True)
    (base / STATE_FILE).unlink(missing_ok=True)
    env = dict(os.environ)
    if settings.jwt_secret:
        env["QUEEN_JWT_SECRET"] = settings.jwt_secret  # shared by both cells; else one is generated
    log = open(base / "cells.log", "ab")  # noqa: SIM115 - the child's for its lifetime
    proc = subprocess.Popen([sys.executable, "-m", "broker.cells.local", "--dir", str(base), "--workers", str(args.workers),
                             "--port", str(args.port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    deadline = time.monotonic() + UP_TIMEOUT_S
    while time.monotonic() < deadline:
        st = _state(base)
        if st is not None:
            if "error" in st:
                print(f"queen cells: failed to start: {st['error']} (log: {base / 'cells.log'})", file=sys.stderr)
                return 1
            _print_up(st, args.dir)
            return 0
        if proc.poll() is not None:
            print(f"queen cells: exited with {proc.returncode}; log: {base / 'cells.log'}", file=sys.stderr)
            return 1
        time.sleep(0.2)
    print(f"queen cells: not up after {UP_TIMEOUT_S:.0f}s; log: {base / 'cells.log'}", file=sys.stderr)
    return 1


def _print_up(st: dict[str, Any], dir_arg: str) -> None:
    print(f"proxy      {st['proxy']}   (map {st['map']}, stats socket {st['socket']})")
    for name, c in st["cells"].items():
        print(f"cell {name:<5} {c['url']}   database {c['dsn']}")
    print(f"default cell: {st['default']}; tokens: queen token create --secret \"$(queen cells status --dir {dir_arg} --json "
          "| python3 -c 'import json,sys; print(json.load(sys.stdin)[\"secret\"])')\" --tenant T --sub S --grant produce --grant consume")


def cmd_cells_down(args: argparse.Namespace, _settings: Settings) -> int:
    base = Path(args.dir).resolve()
    st = _state(base)
    if not st or not st.get("pid"):
        print(f"queen cells: nothing up in {base}", file=sys.stderr)
        return 1
    pid = int(st["pid"])
    if alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if alive(pid):
            print(f"queen cells: pid {pid} still running after 60 s", file=sys.stderr)
            return 1
    (base / "state.json").unlink(missing_ok=True)
    print("queen cells: down")
    return 0


def cmd_cells_status(args: argparse.Namespace, _settings: Settings) -> int:
    from broker.cells.haproxy import HaproxyError, RuntimeApi
    from broker.process.localserver import http_get

    base = Path(args.dir).resolve()
    st = _state(base)
    if not st or "cells" not in st:
        print(f"queen cells: nothing up in {base}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    ok = True
    for name, c in st["cells"].items():
        row = []
        for label, url in (("direct", c["url"] + "/health"), ("via proxy", f"{st['proxy']}/cells/{name}/health")):
            try:
                status, _ = http_get(url, timeout=2.0)
            except OSError as exc:
                status, ok = 0, False
                row.append(f"{label} {type(exc).__name__}")
                continue
            ok = ok and status == 200
            row.append(f"{label} {status}")
        print(f"cell {name:<5} {c['url']:<24} " + ", ".join(row))
    try:
        mapping = RuntimeApi(st["socket"]).show_map(Path(st["map"]))
        print(f"proxy {st['proxy']} (pid {st.get('proxy_pid')}): map {mapping or '{}'}, default cell {st['default']}")
    except (OSError, HaproxyError) as exc:
        ok = False
        print(f"proxy {st['proxy']}: stats socket unreachable ({exc})")
    return 0 if ok else 1


def cmd_cells_route(args: argparse.Namespace, _settings: Settings) -> int:
    from broker.cells import haproxy

    st = _state(Path(args.dir).resolve())
    if not st or "cells" not in st:
        print(f"queen cells: nothing up in {args.dir}", file=sys.stderr)
        return 1
    if args.cell not in st["cells"]:
        print(f"queen cells route: no cell {args.cell!r} (cells: {sorted(st['cells'])})", file=sys.stderr)
        return 2
    try:
        haproxy.switch(Path(st["socket"]), Path(st["map"]), args.tenant, args.cell)
    except (ValueError, OSError, haproxy.HaproxyError) as exc:
        print(f"queen cells route: {exc}", file=sys.stderr)
        return 1
    print(f"{args.tenant} -> cell {args.cell}")
    return 0


def cmd_tenant_move(args: argparse.Namespace, _settings: Settings) -> int:
    from broker.cells import move

    proxy = None
    socket_path, map_path = args.proxy_socket, args.proxy_map
    if args.cells_dir:
        st = _state(Path(args.cells_dir).resolve())
        if not st or "socket" not in st:
            print(f"queen tenant move: nothing up in {args.cells_dir}", file=sys.stderr)
            return 2
        socket_path, map_path = socket_path or st["socket"], map_path or st["map"]
    given = [x is not None for x in (socket_path, map_path, args.to_cell)]
    if any(given) and not all(given):
        print("queen tenant move: the proxy switch needs --proxy-socket, --proxy-map (or --cells-dir) and --to-cell",
              file=sys.stderr)
        return 2
    if all(given):
        proxy = move.Proxy(Path(socket_path), Path(map_path), args.to_cell)
    if not 1 <= args.retry_after <= 3600:
        print("queen tenant move: --retry-after is 1-3600 seconds", file=sys.stderr)
        return 2
    try:
        report = asyncio.run(move.move(args.tenant, args.source, args.target, proxy=proxy, retry_after_s=args.retry_after,
                                       target_name=args.to_cell or "target"))
    except (move.MoveError, ValueError) as exc:
        print(f"queen tenant move: {exc} (nothing moved: the tenant stays in the source)", file=sys.stderr)
        return 1
    print(json.dumps(report.as_dict(), indent=2))
    if proxy is None:
        print("queen tenant move: no proxy given: route the tenant to the target cell yourself", file=sys.stderr)
    return 0


def cmd_tenant_unfreeze(args: argparse.Namespace, _settings: Settings) -> int:
    from broker.cells import move

    row = asyncio.run(move.unfreeze(args.tenant, args.db))
    print(f"unfroze {args.tenant}" + (f" (was {row['state']})" if row else " (it was not frozen)"))
    return 0

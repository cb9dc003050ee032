"""``queen``: serve | migrate | token | cells | tenant | conformance | loadtest | bench | docs.

Settings come from ``QUEEN_*`` environment variables (``broker.config``); the few flags here override
them for one run. With no ``QUEEN_DATABASE_URL``, ``serve`` and ``migrate`` start an embedded
PostgreSQL under ``QUEEN_DATA_DIR`` (default ``./.queen``) and keep its data between runs.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from broker.config import ConfigError, Settings

log = logging.getLogger("queen.cli")

ENV_HELP = """environment (the main ones; all of them: docs/reference/configuration.md, or `queen docs`):
  QUEEN_HOST, QUEEN_PORT           listen address (default 127.0.0.1:6632)
  QUEEN_WORKERS                    worker processes (default: CPU count)
  QUEEN_DATABASE_URL               PostgreSQL DSN; unset = embedded PostgreSQL in QUEEN_DATA_DIR
  QUEEN_DATA_DIR                   embedded data directory (default ./.queen)
  QUEEN_JWT_SECRET                 turn authentication on with HS256 tokens
  QUEEN_JWT_PUBLIC_KEY_FILE        turn authentication on with EdDSA/RS256 tokens (PEM public key)
  QUEEN_ENCRYPTION_KEYS            id:base64key[,id:base64key...] AES-256-GCM key ring, first encrypts
  QUEEN_SWEEPER_MIN_SLEEP_MS / QUEEN_SWEEPER_MAX_SLEEP_MS / QUEEN_SWEEPER_LEASE_MS / QUEEN_SWEEPER_MAX_ATTEMPTS
  QUEEN_TIMERS_HORIZON_MS          longest delayMs accepted (default 90 days)
  QUEEN_TEST_HOOKS=1               enable fault-injection routes (tests only)
"""


def _resolve_dsn(settings: Settings) -> tuple[str, object | None]:
    if settings.database_url:
        return settings.database_url, None
    from broker.store import embedded

    pg = embedded.start(settings.data_dir)
    print(f"queen: embedded PostgreSQL, data kept in {pg.pgdata}", file=sys.stderr, flush=True)
    return pg.dsn(), pg


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from broker.process import supervisor

    overrides: dict[str, object] = {}
    if args.host:
        overrides["host"] = args.host
    if args.port is not None:
        overrides["port"] = args.port
    if args.workers is not None:
        overrides["workers"] = args.workers
    settings = settings.with_(**overrides) if overrides else settings
    owned_metrics = settings.metrics_dir is None
    metrics_dir = supervisor.prepare_metrics_dir(settings)
    try:
        dsn, _pg = _resolve_dsn(settings)
        sup = supervisor.Supervisor(settings, dsn)
        return sup.run()
    finally:
        supervisor.cleanup_metrics_dir(metrics_dir, owned_metrics)


def cmd_migrate(_args: argparse.Namespace, settings: Settings) -> int:
    from broker.store import migrate

    dsn, _pg = _resolve_dsn(settings)
    try:
        out = asyncio.run(migrate.run(dsn))
    except migrate.MigrationError as exc:
        print(f"queen migrate: {exc}", file=sys.stderr)
        return 1
    if out.applied:
        print(f"applied {len(out.applied)} migration(s): {out.applied}")
    if out.functions:
        dropped = f"; dropped {', '.join(out.dropped)}" if out.dropped else ""
        print(f"applied broker/sql/functions (checksum {out.functions[:12]}){dropped}")
    if not out.applied and not out.functions:
        print("schema is up to date")
    return 0


def cmd_token(args: argparse.Namespace, settings: Settings) -> int:
    from broker.auth import GRANTS, mint

    unknown = [g for g in args.grant if g not in GRANTS]
    if unknown:
        print(f"queen token: unknown grant(s) {unknown}; known: {sorted(GRANTS)}", file=sys.stderr)
        return 2
    key_pem = Path(args.private_key).read_bytes() if args.private_key else None
    secret = None if key_pem else (args.secret or settings.jwt_secret)
    if not secret and not key_pem:
        print("queen token: give --secret, --private-key or set QUEEN_JWT_SECRET", file=sys.stderr)
        return 2
    print(mint(tenant=args.tenant, sub=args.sub, grants=args.grant, ttl_s=args.ttl or None, secret=secret, private_key_pem=key_pem))
    return 0


def _docs_config() -> Path | None:
    """The site's mkdocs.yml: in the working directory or above it, else in the checkout the package
    was installed from (an editable install). A wheel carries no documentation sources."""
    here = Path.cwd().resolve()
    for d in (here, *here.parents, Path(__file__).resolve().parents[2]):
        if (d / "mkdocs.yml").is_file() and (d / "docs").is_dir():
            return d / "mkdocs.yml"
    return None


def cmd_docs(args: argparse.Namespace, _settings: Settings) -> int:
    import subprocess

    message = missing_extra("docs")
    if message:
        print(message, file=sys.stderr)
        return 2
    config = _docs_config()
    if config is None:
        print("queen docs: no mkdocs.yml with a docs/ folder here or above, nor in the installed checkout; "
              "run it from a clone of queen-broker", file=sys.stderr)
        return 2
    if args.serve:
        # mkdocs takes this process over, so Ctrl-C and SIGTERM reach the server itself
        cmd = [sys.executable, "-m", "mkdocs", "serve", "--strict", "-f", str(config), "-a", args.addr]
        print("queen docs:", " ".join(cmd), file=sys.stderr, flush=True)
        os.chdir(config.parent)
        os.execv(sys.executable, cmd)
    out = Path(args.out).resolve()
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(out)]
    print("queen docs:", " ".join(cmd), file=sys.stderr, flush=True)
    rc = subprocess.call(cmd, cwd=config.parent)
    if rc == 0:
        print(f"queen docs: the site is in {out} (open {out / 'index.html'})")
    return rc


# Commands whose arguments belong to another module's parser (listed in `queen --help`). Each needs
# the packages of one pyproject extra, which a plain `pip install queen-broker` does not bring.
DELEGATES = (
    ("conformance", "conformance.runner", "run the conformance suite against a broker URL (or a local one)"),
    ("loadtest", "loadtest.runner", "run a Locust load scenario and write a report"),
    ("bench", "bench.runner", "run the pytest-benchmark benches"),
    ("cluster", "loadtest.cluster", "a local etcd + two-node Patroni cluster to try failover on (install|up|down|status|kill-primary|switchover)"),
)

# command -> (extra, modules it imports that only that extra installs). The bench and the Locust
# workers run in child processes, so a missing module would surface there as a child's traceback:
# look before starting anything.
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "conformance": ("conformance", ("pytest", "httpx")),
    "loadtest": ("load", ("locust", "gevent", "matplotlib", "httpx")),
    "bench": ("bench", ("pytest", "pytest_benchmark", "pytest_asyncio", "httpx", "psutil", "xdist")),
    "docs": ("docs", ("mkdocs", "material")),
    # `queen cluster install` adds Patroni and psycopg itself (and Debian's etcd, PostgreSQL 15, HAProxy)
    "cluster": ("cluster", ("httpx",)),
}


def missing_extra(command: str) -> str | None:
    """The one line to print when ``command`` lacks a package of its extra, else None."""
    import importlib.util

    extra, modules = EXTRAS[command]
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    return (f"queen {command}: needs the [{extra}] extra (missing: {', '.join(missing)}); "
            f"install it with: pip install 'queen-broker[{extra}]'")


def _delegate(name: str, module: str, argv: list[str]) -> int:
    import importlib

    message = missing_extra(name)
    if message:
        print(message, file=sys.stderr)
        return 2
    from broker.process.localserver import exit_on_sigterm

    exit_on_sigterm()  # these commands start brokers and servers: SIGTERM must still stop them
    mod = importlib.import_module(module)
    return int(mod.main(argv) or 0)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="queen",
        description="queen-broker: a message broker on PostgreSQL with durable one-shot timers.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=ENV_HELP,
    )
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the broker (embedded PostgreSQL unless QUEEN_DATABASE_URL is set)", epilog=ENV_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--host", help="listen address (overrides QUEEN_HOST)")
    s.add_argument("--port", type=int, help="listen port (overrides QUEEN_PORT; 0 picks a free port)")
    s.add_argument("--workers", type=int, help="worker processes (overrides QUEEN_WORKERS)")
    s.set_defaults(func=cmd_serve)

    m = sub.add_parser("migrate", help="apply pending schema migrations and changed broker/sql/functions, and exit")
    m.set_defaults(func=cmd_migrate)

    t = sub.add_parser("token", help="mint credentials")
    tsub = t.add_subparsers(dest="token_command", required=True)
    tc = tsub.add_parser("create", help="print a signed JWT for a tenant and sub")
    tc.add_argument("--tenant", required=True)
    tc.add_argument("--sub", required=True)
    tc.add_argument("--grant", action="append", default=[], help="produce, consume or admin (repeat)")
    tc.add_argument("--ttl", type=int, default=3600, help="lifetime in seconds (0 = no expiry)")
    tc.add_argument("--secret", help="HS256 secret (default: QUEEN_JWT_SECRET)")
    tc.add_argument("--private-key", help="PEM Ed25519 or RSA private key (EdDSA / RS256)")
    tc.set_defaults(func=cmd_token)

    d = sub.add_parser("docs", help=f"build the documentation site to a directory, or serve it locally (needs the [{EXTRAS['docs'][0]}] extra)")
    d.add_argument("--out", default="site", help="where to build the site (default: ./site)")
    d.add_argument("--serve", action="store_true", help="serve the site and rebuild it on every change (mkdocs serve)")
    d.add_argument("--addr", default="127.0.0.1:8000", help="address for --serve (default 127.0.0.1:8000)")
    d.set_defaults(func=cmd_docs)

    from broker.cells.cli import add_parsers as add_cells_parsers

    add_cells_parsers(sub)  # `queen cells up|down|status`, `queen tenant move|unfreeze` (docs/guides/cells.md)

    for name, _module, text in DELEGATES:
        sub.add_parser(name, help=f"{text} (needs the [{EXTRAS[name][0]}] extra)", add_help=False)  # listed here; main() hands their arguments over
    return p


def main(argv: list[str] | None = None) -> int:
    from broker.process.logsetup import configure_logging

    argv = list(sys.argv[1:] if argv is None else argv)
    # Handed over before our parser sees them: argparse's REMAINDER drops a leading option, so
    # `queen conformance --url ...` or `queen bench -k x` would be refused as unrecognized arguments.
    for name, module, _help in DELEGATES:
        if argv[:1] == [name]:
            return _delegate(name, module, argv[1:])
    args = build_parser().parse_args(argv)
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        print(f"queen: configuration error: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, prefix="master" if args.command == "serve" else args.command)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return int(args.func(args, settings) or 0)


if __name__ == "__main__":
    raise SystemExit(main())

"""Every setting of the broker, read from ``QUEEN_*`` environment variables in this one place.

``Settings.from_env()`` is called once at start (by the CLI); the frozen object is handed down to the
supervisor, the workers and the app. Nothing else in the code base reads the environment for settings.
A bad value stops the start with a message naming the variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ssl

DAY_MS = 86_400_000


class ConfigError(ValueError):
    """A QUEEN_* variable holds a value the broker cannot run with."""


def _int(env: Mapping[str, str], name: str, default: int, lo: int | None = None, hi: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError as exc:
        raise ConfigError(f"{name}={raw!r} is not an integer") from exc
    if lo is not None and value < lo:
        raise ConfigError(f"{name}={value} is below the minimum {lo}")
    if hi is not None and value > hi:
        raise ConfigError(f"{name}={value} is above the maximum {hi}")
    return value


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean (use 1/0, true/false)")


def _str(env: Mapping[str, str], name: str, default: str | None) -> str | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    return raw.strip()


def _key_ring(raw: str | None) -> tuple[tuple[str, bytes], ...]:
    """``QUEEN_ENCRYPTION_KEYS="k2:<base64 32 bytes>,k1:<base64 32 bytes>"``: the first key encrypts,
    every key decrypts. A single bare base64 key (no id) is accepted and gets the id ``default``."""
    import base64
    import binascii

    if not raw:
        return ()
    ring: list[tuple[str, bytes]] = []
    for part in raw.split(","):
        part = part.strip()
        if not part:
            continue
        key_id, sep, b64 = part.partition(":")
        if not sep:
            key_id, b64 = "default", part
        try:
            key = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ConfigError(f"QUEEN_ENCRYPTION_KEYS: key {key_id!r} is not valid base64") from exc
        if len(key) != 32:
            raise ConfigError(f"QUEEN_ENCRYPTION_KEYS: key {key_id!r} must be 32 bytes (AES-256), got {len(key)}")
        if any(k == key_id for k, _ in ring):
            raise ConfigError(f"QUEEN_ENCRYPTION_KEYS: key id {key_id!r} appears twice")
        ring.append((key_id, key))
    return tuple(ring)


@dataclass(frozen=True)
class Settings:
    # --- listening and processes
    host: str = "127.0.0.1"
    port: int = 6632
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    drain_timeout_s: int = 10
    # --- database
    database_url: str | None = None
    data_dir: Path = Path(".queen")
    pool_min: int = 10
    pool_max: int = 10
    # --- HTTP
    max_body_bytes: int = 8 * 1024 * 1024
    header_timeout_s: int = 10
    body_timeout_s: int = 60
    keepalive_timeout_s: int = 75
    max_connections: int = 4096  # per worker; 0 = no cap
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    # --- auth: off unless a secret or a public key is given
    jwt_secret: str | None = None
    jwt_public_key_file: str | None = None
    default_tenant: str = "default"
    default_sub: str = "anonymous"
    # --- encryption at rest (key ring, first encrypts)
    encryption_keys: tuple[tuple[str, bytes], ...] = ()
    # --- payload compression: payloads at least this large are stored zstd-compressed
    zstd_threshold_bytes: int = 1024
    zstd_level: int = 3
    # --- timers and the sweeper
    timers_horizon_ms: int = 90 * DAY_MS
    timers_max_ops: int = 256
    sweeper_enabled: bool = True
    sweeper_lease_ms: int = 30_000
    sweeper_min_sleep_ms: int = 1
    sweeper_max_sleep_ms: int = 1_000
    sweeper_batch: int = 1_000
    sweeper_tenant_slice: int = 250
    sweeper_max_attempts: int = 5
    sweeper_backoff_base_ms: int = 500
    sweeper_backoff_cap_ms: int = 300_000
    timers_vacuum_dead_rows: int = 5_000
    timers_vacuum_interval_ms: int = 2_000
    timers_vacuum_cost_delay_ms: int = 2
    # --- cell-wide limits (a tenant's plan can only narrow these)
    max_payload_bytes: int = 1024 * 1024
    timers_row_quota: int = 1_000_000
    rate_limit_per_s: int = 0  # 0 = unlimited
    period_quota_messages: int = 0  # 0 = unlimited
    period_seconds: int = 30 * 86_400
    storage_quota_bytes: int = 0  # 0 = unlimited
    limits_refresh_ms: int = 1_000
    # --- KV
    kv_max_ops: int = 256
    kv_prune_interval_ms: int = 5_000
    kv_prune_batch: int = 1_000
    # --- ephemeral queues
    ephemeral_expiry_interval_ms: int = 5_000
    ephemeral_idle_s: int = 3_600
    # --- message log
    pop_default_batch: int = 200
    push_lanes: bool = False  # a tenant's small pushes written by one worker (broker/log/lanes.py)
    lease_extend_s: int = 60
    log_retention_interval_ms: int = 5_000
    log_retention_batch: int = 5_000
    # --- operations
    test_hooks: bool = False
    console: bool = True
    log_level: str = "INFO"
    metrics_dir: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        cpu = os.cpu_count() or 1  # the default of ``workers`` (its field's default_factory)
        pool_max = _int(env, "QUEEN_POOL_MAX", DEFAULTS.pool_max, 1, 1000)
        s = cls(
            host=_str(env, "QUEEN_HOST", DEFAULTS.host) or DEFAULTS.host,
            port=_int(env, "QUEEN_PORT", DEFAULTS.port, 0, 65535),
            workers=_int(env, "QUEEN_WORKERS", cpu, 1, 256),
            drain_timeout_s=_int(env, "QUEEN_DRAIN_TIMEOUT_S", DEFAULTS.drain_timeout_s, 0, 3600),
            database_url=_str(env, "QUEEN_DATABASE_URL", DEFAULTS.database_url),
            data_dir=Path(_str(env, "QUEEN_DATA_DIR", str(DEFAULTS.data_dir)) or DEFAULTS.data_dir),
            # Unset, the pool is opened whole at boot: a connection opened under load costs that
            # request its connect and asyncpg's type introspection, see broker/store/pool.py.
            pool_min=_int(env, "QUEEN_POOL_MIN", pool_max, 1, 1000),
            pool_max=pool_max,
            max_body_bytes=_int(env, "QUEEN_MAX_BODY_BYTES", DEFAULTS.max_body_bytes, 1024),
            header_timeout_s=_int(env, "QUEEN_HEADER_TIMEOUT_S", DEFAULTS.header_timeout_s, 0, 3600),
            body_timeout_s=_int(env, "QUEEN_BODY_TIMEOUT_S", DEFAULTS.body_timeout_s, 0, 3600),
            keepalive_timeout_s=_int(env, "QUEEN_KEEPALIVE_TIMEOUT_S", DEFAULTS.keepalive_timeout_s, 1, 86_400),
            max_connections=_int(env, "QUEEN_MAX_CONNECTIONS", DEFAULTS.max_connections, 0, 1_000_000),
            tls_cert_file=_str(env, "QUEEN_TLS_CERT_FILE", DEFAULTS.tls_cert_file),
            tls_key_file=_str(env, "QUEEN_TLS_KEY_FILE", DEFAULTS.tls_key_file),
            jwt_secret=_str(env, "QUEEN_JWT_SECRET", DEFAULTS.jwt_secret),
            jwt_public_key_file=_str(env, "QUEEN_JWT_PUBLIC_KEY_FILE", DEFAULTS.jwt_public_key_file),
            default_tenant=_str(env, "QUEEN_DEFAULT_TENANT", DEFAULTS.default_tenant) or DEFAULTS.default_tenant,
            default_sub=_str(env, "QUEEN_DEFAULT_SUB", DEFAULTS.default_sub) or DEFAULTS.default_sub,
            encryption_keys=_key_ring(_str(env, "QUEEN_ENCRYPTION_KEYS", None)),
            zstd_threshold_bytes=_int(env, "QUEEN_ZSTD_THRESHOLD_BYTES", DEFAULTS.zstd_threshold_bytes, 0),
            zstd_level=_int(env, "QUEEN_ZSTD_LEVEL", DEFAULTS.zstd_level, 1, 22),
            timers_horizon_ms=_int(env, "QUEEN_TIMERS_HORIZON_MS", DEFAULTS.timers_horizon_ms, 1),
            timers_max_ops=_int(env, "QUEEN_TIMERS_MAX_OPS", DEFAULTS.timers_max_ops, 1, 10_000),
            sweeper_enabled=_bool(env, "QUEEN_SWEEPER_ENABLED", DEFAULTS.sweeper_enabled),
            sweeper_lease_ms=_int(env, "QUEEN_SWEEPER_LEASE_MS", DEFAULTS.sweeper_lease_ms, 100),
            sweeper_min_sleep_ms=_int(env, "QUEEN_SWEEPER_MIN_SLEEP_MS", DEFAULTS.sweeper_min_sleep_ms, 0),
            sweeper_max_sleep_ms=_int(env, "QUEEN_SWEEPER_MAX_SLEEP_MS", DEFAULTS.sweeper_max_sleep_ms, 1),
            sweeper_batch=_int(env, "QUEEN_SWEEPER_BATCH", DEFAULTS.sweeper_batch, 1, 100_000),
            sweeper_tenant_slice=_int(env, "QUEEN_SWEEPER_TENANT_SLICE", DEFAULTS.sweeper_tenant_slice, 1, 100_000),
            sweeper_max_attempts=_int(env, "QUEEN_SWEEPER_MAX_ATTEMPTS", DEFAULTS.sweeper_max_attempts, 1, 1000),
            sweeper_backoff_base_ms=_int(env, "QUEEN_SWEEPER_BACKOFF_BASE_MS", DEFAULTS.sweeper_backoff_base_ms, 1),
            sweeper_backoff_cap_ms=_int(env, "QUEEN_SWEEPER_BACKOFF_CAP_MS", DEFAULTS.sweeper_backoff_cap_ms, 1),
            timers_vacuum_dead_rows=_int(env, "QUEEN_TIMERS_VACUUM_DEAD_ROWS", DEFAULTS.timers_vacuum_dead_rows, 0, 100_000_000),
            timers_vacuum_interval_ms=_int(env, "QUEEN_TIMERS_VACUUM_INTERVAL_MS", DEFAULTS.timers_vacuum_interval_ms, 100),
            timers_vacuum_cost_delay_ms=_int(env, "QUEEN_TIMERS_VACUUM_COST_DELAY_MS", DEFAULTS.timers_vacuum_cost_delay_ms, 0, 100),
            max_payload_bytes=_int(env, "QUEEN_MAX_PAYLOAD_BYTES", DEFAULTS.max_payload_bytes, 1),
            timers_row_quota=_int(env, "QUEEN_TIMERS_ROW_QUOTA", DEFAULTS.timers_row_quota, 0),
            rate_limit_per_s=_int(env, "QUEEN_RATE_LIMIT_PER_S", DEFAULTS.rate_limit_per_s, 0),
            period_quota_messages=_int(env, "QUEEN_PERIOD_QUOTA_MESSAGES", DEFAULTS.period_quota_messages, 0),
            period_seconds=_int(env, "QUEEN_PERIOD_SECONDS", DEFAULTS.period_seconds, 1),
            storage_quota_bytes=_int(env, "QUEEN_STORAGE_QUOTA_BYTES", DEFAULTS.storage_quota_bytes, 0),
            limits_refresh_ms=_int(env, "QUEEN_LIMITS_REFRESH_MS", DEFAULTS.limits_refresh_ms, 10),
            kv_max_ops=_int(env, "QUEEN_KV_MAX_OPS_PER_CALL", DEFAULTS.kv_max_ops, 1, 10_000),
            kv_prune_interval_ms=_int(env, "QUEEN_KV_PRUNE_INTERVAL_MS", DEFAULTS.kv_prune_interval_ms, 10),
            kv_prune_batch=_int(env, "QUEEN_KV_PRUNE_BATCH", DEFAULTS.kv_prune_batch, 1),
            ephemeral_expiry_interval_ms=_int(env, "QUEEN_EPHEMERAL_EXPIRY_INTERVAL_MS", DEFAULTS.ephemeral_expiry_interval_ms, 10),
            ephemeral_idle_s=_int(env, "QUEEN_EPHEMERAL_IDLE_S", DEFAULTS.ephemeral_idle_s, 1),
            pop_default_batch=_int(env, "QUEEN_POP_DEFAULT_BATCH", DEFAULTS.pop_default_batch, 1, 10_000),
            push_lanes=_bool(env, "QUEEN_PUSH_LANES", DEFAULTS.push_lanes),
            lease_extend_s=_int(env, "QUEEN_LEASE_EXTEND_S", DEFAULTS.lease_extend_s, 1),
            log_retention_interval_ms=_int(env, "QUEEN_LOG_RETENTION_INTERVAL_MS", DEFAULTS.log_retention_interval_ms, 10),
            log_retention_batch=_int(env, "QUEEN_LOG_RETENTION_BATCH", DEFAULTS.log_retention_batch, 1, 1_000_000),
            test_hooks=_bool(env, "QUEEN_TEST_HOOKS", DEFAULTS.test_hooks),
            console=_bool(env, "QUEEN_CONSOLE", DEFAULTS.console),
            log_level=(_str(env, "QUEEN_LOG_LEVEL", DEFAULTS.log_level) or DEFAULTS.log_level).upper(),
            metrics_dir=_str(env, "PROMETHEUS_MULTIPROC_DIR", None),
        )
        s.validate()
        return s

    def validate(self) -> None:
        if self.sweeper_min_sleep_ms > self.sweeper_max_sleep_ms:
            raise ConfigError("QUEEN_SWEEPER_MIN_SLEEP_MS must not exceed QUEEN_SWEEPER_MAX_SLEEP_MS")
        if self.pool_min > self.pool_max:
            raise ConfigError("QUEEN_POOL_MIN must not exceed QUEEN_POOL_MAX")
        if self.jwt_public_key_file and not Path(self.jwt_public_key_file).is_file():
            raise ConfigError(f"QUEEN_JWT_PUBLIC_KEY_FILE={self.jwt_public_key_file!r} is not a readable file")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ConfigError("QUEEN_TLS_CERT_FILE and QUEEN_TLS_KEY_FILE must be given together")
        for var, path in (("QUEEN_TLS_CERT_FILE", self.tls_cert_file), ("QUEEN_TLS_KEY_FILE", self.tls_key_file)):
            if path and not Path(path).is_file():
                raise ConfigError(f"{var}={path!r} is not a readable file")
        if self.tls_cert_file and self.tls_key_file:
            import ssl

            try:
                self.ssl_context()
            except (ssl.SSLError, OSError, ValueError) as exc:
                raise ConfigError(f"QUEEN_TLS_CERT_FILE/QUEEN_TLS_KEY_FILE cannot be loaded: {exc}") from exc
        if self.log_level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ConfigError(f"QUEEN_LOG_LEVEL={self.log_level!r} is not one of DEBUG, INFO, WARNING, ERROR")

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert_file and self.tls_key_file)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The server TLS context from QUEEN_TLS_CERT_FILE / QUEEN_TLS_KEY_FILE (None: plain HTTP)."""
        if not self.tls:
            return None
        import ssl

        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(str(self.tls_cert_file), str(self.tls_key_file))
        return ctx

    @property
    def auth_enabled(self) -> bool:
        return bool(self.jwt_secret or self.jwt_public_key_file)

    def with_(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]

    def describe(self) -> dict[str, object]:
        """Settings for a start-up log line, secrets masked."""
        out: dict[str, object] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("jwt_secret",) and v:
                v = "***"
            elif f.name == "encryption_keys":
                v = [k for k, _ in v]
            elif f.name == "database_url" and v:
                v = _mask_url(str(v))
            out[f.name] = str(v) if isinstance(v, Path) else v
        return out


# The defaults: the fields of Settings are the one table of them. from_env reads its defaults here,
# SweeperConfig declares its own from the class, and the docs' configuration table is built from
# from_env's default expressions (tests/test_config.py keeps them all pointing here).
DEFAULTS = Settings()


def _mask_url(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        user = creds.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}"
    return url


# What each variable means, for people. The configuration reference of the documentation site
# (docs/reference/configuration.md) is rendered at build time from this table and from from_env()
# above (names, defaults, bounds, and the sections of Settings), so a setting read here cannot go
# undocumented: the build fails on a variable without its line (tests/test_config.py checks it too).
MEANINGS: dict[str, str] = {
    "QUEEN_HOST": 'Listen address (`0.0.0.0` to listen on every interface).',
    "QUEEN_PORT": 'Listen port.',
    "QUEEN_WORKERS": 'Worker processes sharing the port (1–256). On a small machine shared with PostgreSQL fewer can be faster: on 2 cores one worker served the benchmark shapes better than two (docs/guides/capacity-planning.md).',
    "QUEEN_DRAIN_TIMEOUT_S": 'On SIGTERM/SIGINT, how long in-flight requests may take to finish.',
    "QUEEN_LOG_LEVEL": '`DEBUG`, `INFO`, `WARNING` or `ERROR`; logs go to stderr, one line per record.',
    "QUEEN_DATABASE_URL": 'PostgreSQL DSN. Unset: an embedded PostgreSQL under `QUEEN_DATA_DIR`.',
    "QUEEN_DATA_DIR": 'Where the embedded PostgreSQL keeps its cluster (`<dir>/pg`).',
    "QUEEN_POOL_MIN": 'Connections each worker opens at boot and keeps open (idle connections are never closed: one reopened under load costs its request the connect and the first planning).',
    "QUEEN_POOL_MAX": 'Connections each worker may open (must be ≥ `QUEEN_POOL_MIN`).',
    "QUEEN_MAX_BODY_BYTES": 'Largest request body; larger is refused with 413 (minimum 1024).',
    "QUEEN_HEADER_TIMEOUT_S": "A request's line and headers must be complete this long after its first byte, else 408 `header_timeout` and the connection is closed (0 = off).",
    "QUEEN_BODY_TIMEOUT_S": "A request's body must be complete this long after its headers, else 408 `body_timeout`, the connection is closed and nothing of the call is applied (0 = off).",
    "QUEEN_KEEPALIVE_TIMEOUT_S": 'An idle keep-alive connection, or one that never sends a byte, is closed after this long.',
    "QUEEN_MAX_CONNECTIONS": "Open connections per worker; each further connection's request is answered 503 `too_many_connections` with `Retry-After: 1` and closed (0 = no cap). Keep it under the process's open-file limit.",
    "QUEEN_TLS_CERT_FILE": 'With `QUEEN_TLS_KEY_FILE`: serve HTTPS directly (PEM certificate chain; TLS 1.2+). Both or neither; a file that cannot be loaded stops the start.',
    "QUEEN_TLS_KEY_FILE": 'The PEM private key of `QUEEN_TLS_CERT_FILE`.',
    "QUEEN_JWT_SECRET": 'Turns authentication on, verifying HS256 tokens with this secret.',
    "QUEEN_JWT_PUBLIC_KEY_FILE": 'Turns authentication on, verifying EdDSA (Ed25519) or RS256 tokens with this PEM public key. May be combined with the secret.',
    "QUEEN_DEFAULT_TENANT": 'With authentication off, the tenant of every request.',
    "QUEEN_DEFAULT_SUB": 'With authentication off, the sub (`producerSub`) of every request.',
    "QUEEN_ENCRYPTION_KEYS": 'Encryption at rest: `id:base64key[,id:base64key...]`, AES-256-GCM keys of 32 bytes; the first encrypts, all decrypt (rotate by putting a new key first). A single bare key gets the id `default`.',
    "QUEEN_ZSTD_THRESHOLD_BYTES": 'Payloads at least this large are stored zstd-compressed (compression happens before encryption).',
    "QUEEN_ZSTD_LEVEL": 'zstd level (1–22).',
    "QUEEN_MAX_PAYLOAD_BYTES": "Largest single payload the cell accepts (a tenant's plan can only narrow it).",
    "QUEEN_POP_DEFAULT_BATCH": 'Messages per pop when the client does not say (1–10000).',
    "QUEEN_PUSH_LANES": "With more than one worker, hand a tenant's small pushes (up to 20 messages) to the one worker that owns the tenant, so they share commits instead of queueing on each other's partition locks: faster when a tenant pushes to a few partitions from many connections, slower otherwise (docs/performance.md, \"Push\").",
    "QUEEN_LEASE_EXTEND_S": 'Seconds a lease extension adds.',
    "QUEEN_LOG_RETENTION_INTERVAL_MS": "How often each worker's `log-retention` loop looks for messages past their queue's retention.",
    "QUEEN_LOG_RETENTION_BATCH": 'Messages deleted per retention pass at most (1–1000000).',
    "QUEEN_TIMERS_HORIZON_MS": 'Longest `delayMs` accepted.',
    "QUEEN_TIMERS_MAX_OPS": 'Operations per timer call (1–10000).',
    "QUEEN_SWEEPER_ENABLED": "Whether this broker's workers fire due timers.",
    "QUEEN_SWEEPER_LEASE_MS": "How long a sweeper's lease on due timers lasts (a dead broker's leases expire after this), and how long (at least 1 s) its fire transaction may sit idle before the database ends it.",
    "QUEEN_SWEEPER_MIN_SLEEP_MS": "Shortest time from one sweep cycle's start to the next one's when no row is due yet.",
    "QUEEN_SWEEPER_MAX_SLEEP_MS": 'Longest sleep between sweep cycles (a LISTEN/NOTIFY wake-up comes earlier).',
    "QUEEN_SWEEPER_BATCH": 'Timers claimed per cycle (1–100000).',
    "QUEEN_SWEEPER_TENANT_SLICE": "While several tenants have due timers, the most one tenant gets of a cycle's batch (each gets an equal share, the walk over tenants rotates).",
    "QUEEN_SWEEPER_MAX_ATTEMPTS": "Failed fires before a timer goes to its queue's DLQ.",
    "QUEEN_SWEEPER_BACKOFF_BASE_MS": 'First retry delay after a failed fire (doubling).',
    "QUEEN_SWEEPER_BACKOFF_CAP_MS": 'Longest retry delay.',
    "QUEEN_TIMERS_VACUUM_DEAD_ROWS": "From this many dead rows in `queen_timers` (fired, cancelled, rescheduled timers), one worker runs `VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) queen_timers` (the `timers-vacuum` loop, one vacuum at a time across brokers), so the claims never walk a long front of dead index entries whatever the server's autovacuum settings (0–100000000; 0: leave it to autovacuum).",
    "QUEEN_TIMERS_VACUUM_INTERVAL_MS": "How often each worker's `timers-vacuum` loop reads the dead-row count (at least 100).",
    "QUEEN_TIMERS_VACUUM_COST_DELAY_MS": "The `timers-vacuum` loop's VACUUM sleeps this long each time it has done `vacuum_cost_limit` of work (PostgreSQL's `vacuum_cost_delay` for that session; autovacuum's default), so it spreads its pass over the indexes instead of taking a core whole (0–100; 0: full speed). With 10,000,000 timers pending a pass reads ~800 MB of index every 5,000 fired rows: 0.37 s at full speed, 1.2–1.4 s throttled, and a steady 1,000/s lagged p99 11.6 ms at the consumer unthrottled against 6.8 ms throttled (p50 1.9 / 2.0 ms).",
    "QUEEN_TIMERS_ROW_QUOTA": 'Pending timers per tenant (`0`: unlimited).',
    "QUEEN_RATE_LIMIT_PER_S": 'Operations per second per tenant (`0`: unlimited).',
    "QUEEN_PERIOD_QUOTA_MESSAGES": 'Messages per tenant per period (`0`: unlimited).',
    "QUEEN_PERIOD_SECONDS": 'Length of a quota period.',
    "QUEEN_STORAGE_QUOTA_BYTES": 'Stored bytes per tenant (`0`: unlimited).',
    "QUEEN_LIMITS_REFRESH_MS": 'How often a worker re-reads plans and switches.',
    "QUEEN_KV_MAX_OPS_PER_CALL": 'Operations per KV call (1–10000).',
    "QUEEN_KV_PRUNE_INTERVAL_MS": 'How often expired KV rows are pruned.',
    "QUEEN_KV_PRUNE_BATCH": 'Expired rows removed per prune pass.',
    "QUEEN_EPHEMERAL_EXPIRY_INTERVAL_MS": "How often each worker's `ephemeral-expiry` loop drops the expired messages of ephemeral queues with a `ttlSeconds` (delivery never depends on it: a push or pop expires its queue first) and forgets idle implicit queues.",
    "QUEEN_EPHEMERAL_IDLE_S": "An implicit ephemeral queue (never configured) that is empty, holds no lease and saw no push or settle for this long is forgotten, with its groups' cursors and its counters (the next push or pop makes it again). Declared queues stay until deleted.",
    "QUEEN_CONSOLE": 'Serves the operator console at `/console`; `0` turns it off (every console path answers 404 `console_disabled`).',
    "QUEEN_TEST_HOOKS": 'Enables the fault-injection routes under `/api/v1/test/` (tests only; otherwise they answer 403 `test_hooks_disabled`).',
    "PROMETHEUS_MULTIPROC_DIR": 'Where workers write their metric samples (unset: a fresh temporary directory, removed at exit); set it only to keep them somewhere you choose (its `*.db` files are cleared at start).',
}

-- Bench-only SQL for bench_locks.py (not loaded by the broker): the floor of a lock on a KV row.

-- name: bare_acquire
-- Take permit row $2 of tenant $1 for owner value $3 when it is absent or expired: one upsert, a new
-- version from the KV's sequence; no name lock, no key lock, no slots, no metering, no storage gauge.
INSERT INTO queen_kv AS q (tenant, ns, key, value, version, expires_at)
VALUES ($1, 'queen-locks', $2, $3::jsonb, nextval('queen_kv_version'), now() + interval '30 seconds')
ON CONFLICT (tenant, ns, key) DO UPDATE
    SET value = excluded.value, version = excluded.version, expires_at = excluded.expires_at, updated_at = now()
    WHERE q.expires_at <= now()
RETURNING q.version;

-- name: bare_release
-- Give permit row $2 of tenant $1 back when it is still at version $3.
DELETE FROM queen_kv WHERE tenant = $1 AND ns = 'queen-locks' AND key = $2 AND version = $3;

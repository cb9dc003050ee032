-- Tenancy limits and metering: the usage meter, the storage and pending-timer gauges (statement-level
-- triggers on queen_messages and queen_timers) and the rate-limit token bucket.
-- Tables: broker/sql/migrations/0004_limits.sql.
-- Re-applied at boot when any function file changes (docs/guides/deploying.md, "Schema and upgrades"): CREATE OR
-- REPLACE statements only; tables, indexes and data belong in forward-only migrations.

-- The start of the metering period that contains `at`. STABLE, as its body is (extract() of a
-- timestamptz is STABLE): declared IMMUTABLE it could not be inlined, and a SQL function that is not
-- inlined is planned again at every call (pg_stat_statements showed it planned at every push).
CREATE OR REPLACE FUNCTION queen_period_start(at timestamptz, period_s integer) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT to_timestamp(floor(extract(epoch FROM at) / period_s) * period_s)
$$;

-- Meter usage inside the caller's transaction (rolled back with it). One statement.
-- PL/pgSQL rather than SQL: a SQL function called from PL/pgSQL (every push, every KV call) is
-- planned again at every call, most of the call's cost; a PL/pgSQL body keeps its plan for the session.
CREATE OR REPLACE FUNCTION queen_meter(p_tenant text, p_period_s integer, p_messages bigint, p_kv_ops bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_messages <> 0 OR p_kv_ops <> 0 THEN
        INSERT INTO queen_usage AS u (tenant, period_start, slot, messages, kv_ops)
        VALUES (p_tenant, queen_period_start(now(), p_period_s), (pg_backend_pid() % 64)::smallint, p_messages,
                p_kv_ops)
        ON CONFLICT (tenant, period_start, slot)
        DO UPDATE SET messages = u.messages + excluded.messages, kv_ops = u.kv_ops + excluded.kv_ops;
    END IF;
END
$$;

-- Add deltas to a tenant's gauges (in the caller's transaction).
CREATE OR REPLACE FUNCTION queen_gauge_add(p_tenant text, p_storage bigint, p_timers bigint)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO queen_usage_gauges AS g (tenant, slot, storage_bytes, timers_pending)
    SELECT p_tenant, (pg_backend_pid() % 64)::smallint, p_storage, p_timers
    WHERE p_storage <> 0 OR p_timers <> 0
    ON CONFLICT (tenant, slot)
    DO UPDATE SET storage_bytes = g.storage_bytes + excluded.storage_bytes,
                  timers_pending = g.timers_pending + excluded.timers_pending
$$;

-- Storage of the message log: one aggregate per INSERT/DELETE statement on queen_messages (transition
-- tables), never a per-row trigger and never a count over the log.
CREATE OR REPLACE FUNCTION queen_messages_storage_ins() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queen_usage_gauges AS g (tenant, slot, storage_bytes, timers_pending)
    SELECT n.tenant, (pg_backend_pid() % 64)::smallint, sum(octet_length(n.payload)), 0
    FROM queen_new_rows n GROUP BY n.tenant
    ORDER BY n.tenant
    ON CONFLICT (tenant, slot) DO UPDATE SET storage_bytes = g.storage_bytes + excluded.storage_bytes;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION queen_messages_storage_del() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queen_usage_gauges AS g (tenant, slot, storage_bytes, timers_pending)
    SELECT o.tenant, (pg_backend_pid() % 64)::smallint, -sum(octet_length(o.payload)), 0
    FROM queen_old_rows o GROUP BY o.tenant
    ORDER BY o.tenant
    ON CONFLICT (tenant, slot) DO UPDATE SET storage_bytes = g.storage_bytes + excluded.storage_bytes;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER queen_messages_storage_ins AFTER INSERT ON queen_messages
    REFERENCING NEW TABLE AS queen_new_rows FOR EACH STATEMENT EXECUTE FUNCTION queen_messages_storage_ins();

CREATE OR REPLACE TRIGGER queen_messages_storage_del AFTER DELETE ON queen_messages
    REFERENCING OLD TABLE AS queen_old_rows FOR EACH STATEMENT EXECUTE FUNCTION queen_messages_storage_del();

-- Take `p_n` tokens from the tenant's bucket (capacity = rate, refilled at `rate` per second, by the
-- database clock). Returns 0 when granted, else the milliseconds until enough tokens will be there.
-- A call larger than the capacity is granted when the bucket is full (the bucket goes into debt).
-- clock_timestamp(), not now(): the refill must see real elapsed time even inside a long transaction.
CREATE OR REPLACE FUNCTION queen_rate_take(p_tenant text, p_n double precision, p_rate double precision)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_tokens double precision;
    v_need   double precision := least(p_n, p_rate);
BEGIN
    INSERT INTO queen_rate_buckets (tenant, tokens, updated_at) VALUES (p_tenant, p_rate, clock_timestamp())
    ON CONFLICT (tenant) DO NOTHING;
    SELECT least(p_rate, b.tokens + p_rate * extract(epoch FROM clock_timestamp() - b.updated_at))
    INTO v_tokens FROM queen_rate_buckets b WHERE b.tenant = p_tenant FOR UPDATE;
    IF v_tokens >= v_need THEN
        UPDATE queen_rate_buckets SET tokens = v_tokens - p_n, updated_at = clock_timestamp()
        WHERE tenant = p_tenant;
        RETURN 0;
    END IF;
    UPDATE queen_rate_buckets SET tokens = v_tokens, updated_at = clock_timestamp() WHERE tenant = p_tenant;
    RETURN ceil((v_need - v_tokens) / p_rate * 1000)::bigint;
END
$$;

-- Pending-timer count per tenant, for the timer-row quota, without ever counting queen_timers:
-- statement-level triggers (transition tables) add one aggregate per INSERT / DELETE statement on
-- queen_timers (schedule of a new key, cancel, fire, DLQ move). A reschedule updates the row in
-- place and changes nothing; the sweeper's claim and backoff updates change nothing either.
--
-- Timer payloads are not added to the storage gauge: a pending timer is bounded by the timer-row quota
-- times the timer payload ceiling, and its bytes are counted as log storage once it fires.
CREATE OR REPLACE FUNCTION queen_timers_gauge_ins() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queen_usage_gauges AS g (tenant, slot, storage_bytes, timers_pending)
    SELECT n.tenant, (pg_backend_pid() % 64)::smallint, 0, count(*)
    FROM queen_new_timers n GROUP BY n.tenant ORDER BY n.tenant
    ON CONFLICT (tenant, slot) DO UPDATE SET timers_pending = g.timers_pending + excluded.timers_pending;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION queen_timers_gauge_del() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queen_usage_gauges AS g (tenant, slot, storage_bytes, timers_pending)
    SELECT o.tenant, (pg_backend_pid() % 64)::smallint, 0, -count(*)
    FROM queen_old_timers o GROUP BY o.tenant ORDER BY o.tenant
    ON CONFLICT (tenant, slot) DO UPDATE SET timers_pending = g.timers_pending + excluded.timers_pending;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER queen_timers_gauge_ins AFTER INSERT ON queen_timers
    REFERENCING NEW TABLE AS queen_new_timers FOR EACH STATEMENT EXECUTE FUNCTION queen_timers_gauge_ins();

CREATE OR REPLACE TRIGGER queen_timers_gauge_del AFTER DELETE ON queen_timers
    REFERENCING OLD TABLE AS queen_old_timers FOR EACH STATEMENT EXECUTE FUNCTION queen_timers_gauge_del();

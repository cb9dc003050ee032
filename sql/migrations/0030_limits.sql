-- Tenancy limits and metering: per-tenant plans, operator switches, usage meters, storage and
-- pending-timer gauges, and the rate-limit token buckets.
--
-- Counters are SLOTTED: every tenant has up to 16 rows per counter, and a writer adds to the slot of its
-- own backend (pg_backend_pid() % 16). Two connections writing for one tenant at once therefore
-- (almost always) touch different rows, so a meter update inside a writer's transaction never
-- serialises that tenant's writers on one hot row. A reader sums the slots: at most 16 rows per tenant,
-- never a scan of the data being counted.

-- A tenant's own plan. NULL = inherit the cell's value (Settings). A stored value can only narrow the
-- cell's: the admin route refuses a widening value with 400, and the effective value is always
-- least(cell, tenant) (so a cell later narrowed below a stored plan still wins).
CREATE TABLE queen_tenant_plans (
    tenant                text PRIMARY KEY,
    timers_horizon_ms     bigint,
    max_payload_bytes     bigint,
    timers_row_quota      bigint,
    rate_limit_per_s      bigint,
    period_quota_messages bigint,
    storage_quota_bytes   bigint,
    updated_at            timestamptz NOT NULL DEFAULT now()
);

-- Operator switches for one tenant (schedule paused) ...
CREATE TABLE queen_tenant_switches (
    tenant        text PRIMARY KEY,
    timers_paused boolean NOT NULL DEFAULT false,
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- ... and for the whole cell. `tenant` is the cell-wide pseudo tenant '*' so the table still leads
-- with tenant like every other one.
CREATE TABLE queen_cell_switches (
    tenant     text PRIMARY KEY DEFAULT '*' CHECK (tenant = '*'),
    suspended  boolean NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO queen_cell_switches (tenant) VALUES ('*');

-- Usage per tenant per metering period (periods are aligned on the Unix epoch, period_seconds long).
-- Units: messages = pushed messages + timer schedule/reschedule ops; kv_ops = KV operations applied.
CREATE TABLE queen_usage (
    tenant       text NOT NULL,
    period_start timestamptz NOT NULL,
    slot         smallint NOT NULL,
    messages     bigint NOT NULL DEFAULT 0,
    kv_ops       bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, period_start, slot)
);

-- Gauges (not per period): bytes stored (log payloads + KV keys/values + pending timer payloads) and
-- pending timer rows. Maintained by statement-level triggers on the tables that hold the data and by
-- queen_kv_apply / the KV pruner.
CREATE TABLE queen_usage_gauges (
    tenant         text NOT NULL,
    slot           smallint NOT NULL,
    storage_bytes  bigint NOT NULL DEFAULT 0,
    timers_pending bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, slot)
);

-- Token buckets for the rate limit (one row per tenant that has a rate limit and has been admitted).
CREATE TABLE queen_rate_buckets (
    tenant     text PRIMARY KEY,
    tokens     double precision NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The start of the metering period that contains `at`.
CREATE FUNCTION queen_period_start(at timestamptz, period_s integer) RETURNS timestamptz
LANGUAGE sql IMMUTABLE AS $$
    SELECT to_timestamp(floor(extract(epoch FROM at) / period_s) * period_s)
$$;

-- Meter usage inside the caller's transaction (rolled back with it). One statement.
CREATE FUNCTION queen_meter(p_tenant text, p_period_s integer, p_messages bigint, p_kv_ops bigint)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO queen_usage AS u (tenant, period_start, slot, messages, kv_ops)
    SELECT p_tenant, queen_period_start(now(), p_period_s), (pg_backend_pid() % 16)::smallint, p_messages, p_kv_ops
    WHERE p_messages <> 0 OR p_kv_ops <> 0
    ON CONFLICT (tenant, period_start, slot)
    DO UPDATE SET messages = u.messages + excluded.messages, kv_ops = u.kv_ops + excluded.kv_ops
$$;

-- Add deltas to a tenant's gauges (in the caller's transaction).
CREATE FUNCTION queen_gauge_add(p_tenant text, p_storage bigint, p_timers bigint)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO queen_usage_gauges AS g (tenant, slot, storage_bytes, timers_pending)
    SELECT p_tenant, (pg_backend_pid() % 16)::smallint, p_storage, p_timers
    WHERE p_storage <> 0 OR p_timers <> 0
    ON CONFLICT (tenant, slot)
    DO UPDATE SET storage_bytes = g.storage_bytes + excluded.storage_bytes,
                  timers_pending = g.timers_pending + excluded.timers_pending
$$;

-- Storage of the message log: one aggregate per INSERT/DELETE statement on queen_messages (transition
-- tables), never a per-row trigger and never a count over the log.
CREATE FUNCTION queen_messages_storage_ins() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queen_usage_gauges AS g (tenant, slot, storage_bytes, timers_pending)
    SELECT n.tenant, (pg_backend_pid() % 16)::smallint, sum(octet_length(n.payload)), 0
    FROM queen_new_rows n GROUP BY n.tenant
    ORDER BY n.tenant
    ON CONFLICT (tenant, slot) DO UPDATE SET storage_bytes = g.storage_bytes + excluded.storage_bytes;
    RETURN NULL;
END
$$;

CREATE FUNCTION queen_messages_storage_del() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queen_usage_gauges AS g (tenant, slot, storage_bytes, timers_pending)
    SELECT o.tenant, (pg_backend_pid() % 16)::smallint, -sum(octet_length(o.payload)), 0
    FROM queen_old_rows o GROUP BY o.tenant
    ORDER BY o.tenant
    ON CONFLICT (tenant, slot) DO UPDATE SET storage_bytes = g.storage_bytes + excluded.storage_bytes;
    RETURN NULL;
END
$$;

CREATE TRIGGER queen_messages_storage_ins AFTER INSERT ON queen_messages
    REFERENCING NEW TABLE AS queen_new_rows FOR EACH STATEMENT EXECUTE FUNCTION queen_messages_storage_ins();
CREATE TRIGGER queen_messages_storage_del AFTER DELETE ON queen_messages
    REFERENCING OLD TABLE AS queen_old_rows FOR EACH STATEMENT EXECUTE FUNCTION queen_messages_storage_del();

-- Take `p_n` tokens from the tenant's bucket (capacity = rate, refilled at `rate` per second, by the
-- database clock). Returns 0 when granted, else the milliseconds until enough tokens will be there.
-- A call larger than the capacity is granted when the bucket is full (the bucket goes into debt).
-- clock_timestamp(), not now(): the refill must see real elapsed time even inside a long transaction.
CREATE FUNCTION queen_rate_take(p_tenant text, p_n double precision, p_rate double precision)
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

-- Messages already in the log when this migration runs (a one-time count, at migration only).
INSERT INTO queen_usage_gauges (tenant, slot, storage_bytes, timers_pending)
SELECT tenant, 0, sum(octet_length(payload)), 0 FROM queen_messages GROUP BY tenant
ON CONFLICT (tenant, slot) DO UPDATE SET storage_bytes = queen_usage_gauges.storage_bytes + excluded.storage_bytes;

-- Tenancy limits and metering: per-tenant plans, operator switches, usage meters, storage and
-- pending-timer gauges, and the rate-limit token buckets. Metering, admission and the gauge triggers
-- are in broker/sql/functions/limits.sql.
--
-- Counters are SLOTTED: every tenant has up to 64 rows per counter, and a writer adds to the slot of its
-- own backend (pg_backend_pid() % 64). Two connections writing for one tenant at once therefore
-- (almost always) touch different rows, so a meter update inside a writer's transaction rarely
-- serialises that tenant's writers on one hot row (with 16 slots, 8 concurrent writers shared a slot
-- in ~88 % of cases and queued on it until commit; with 64, ~37 %). A reader sums the slots: at
-- most 64 rows per tenant, never a scan of the data being counted.

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
-- with tenant like every other one. kv_enabled is the operator's KV kill switch: with false every KV
-- call is refused (POST /api/v1/kv and the path routes: 503 kv_disabled with Retry-After; the
-- transaction rider: 403 kv_disabled). Read by every worker through the limits cache (NOTIFYed on
-- change).
CREATE TABLE queen_cell_switches (
    tenant     text PRIMARY KEY DEFAULT '*' CHECK (tenant = '*'),
    suspended  boolean NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now(),
    kv_enabled boolean NOT NULL DEFAULT true
);
-- The one row every worker reads.
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


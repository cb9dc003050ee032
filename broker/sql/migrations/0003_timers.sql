-- Timers: messages that are not in the log yet. Schedule, claim and fire are in
-- broker/sql/functions/timers.sql; the gauge of pending timers in broker/sql/functions/limits.sql.
--
-- One row per pending timer, keyed (tenant, queue, timer_key). A row lives from its schedule until
-- its fire (the row is deleted in the same transaction that writes the message), its cancel, or its
-- move to the DLQ after the attempt budget. There is no tombstone.
--
-- due_at is "the next instant a sweeper may claim this row", and the only column the sweeper's claim
-- looks at:
--   fresh row        due_at = deliver_at
--   claimed row      due_at = claimed_until (so an expired claim is simply due again)
--   row in backoff   due_at = now() + backoff, claim cleared (not claimed, so still cancellable)
-- A row is "claimed" (cancel/reschedule answer too_late, peek says claimed:true) exactly when
-- claim_token IS NOT NULL AND claimed_until > now(), compared by the database clock.
--
-- payload holds the stored bytes. Unencrypted: the client's bytes as sent (zstd when payload_zstd);
-- the fire checks they are JSON and seals them for the log. Encrypted (key_id set): the output of
-- broker.payloads.seal at schedule time (codec = 1 when payload_zstd), moved into the log untouched.
--
-- The sweeper finds due timers by walking queen_tenants (every index leads with tenant), so a timer
-- whose tenant is missing there would never fire. The schedule path registers the tenant; the foreign
-- key makes the invariant hold for any writer of queen_timers, loudly.
CREATE TABLE queen_timers (
    tenant        text NOT NULL,
    queue         text COLLATE "C" NOT NULL,
    timer_key     text COLLATE "C" NOT NULL,
    partition     text COLLATE "C" NOT NULL DEFAULT 'Default',
    txn           text COLLATE "C" NOT NULL,
    message_id    uuid NOT NULL,
    payload       bytea NOT NULL,
    payload_zstd  boolean NOT NULL DEFAULT false,
    key_id        text,
    producer_sub  text,
    deliver_at    timestamptz NOT NULL,
    due_at        timestamptz NOT NULL,
    attempts      integer NOT NULL DEFAULT 0,   -- permanent failures: the budget
    failures      integer NOT NULL DEFAULT 0,   -- every failure: the backoff exponent
    last_error    text,
    claim_token   uuid,
    claimed_until timestamptz,
    claimed_by    text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, queue, timer_key),
    CONSTRAINT queen_timers_tenant_fk FOREIGN KEY (tenant) REFERENCES queen_tenants (tenant)
);

-- The sweeper walks tenants (queen_tenants) and, per tenant, the earliest due rows.
--
-- Both due indexes are PARTIAL on "due_at IS NOT NULL" (true of every row: the column is NOT NULL).
-- The planner may use a partial index only for a query whose WHERE implies its predicate, and it does
-- not read NOT NULL constraints for that: a claim's "due_at <= now()" implies it (a strict operator),
-- a lookup by key does not. So a lookup by (tenant, queue, timer_key) can only be served by the
-- primary key. Without this, on a table whose statistics are stale (filled by one burst, never
-- analyzed), (tenant, queue, partition, due_at) and the primary key tie on cost and the planner
-- picked the smaller one, reading every row of the queue per key: measured 1.8 s per 256-op schedule
-- at 50k rows in one queue, and 1-4 s per 1,000-row claim at 20k due.
CREATE INDEX queen_timers_due ON queen_timers (tenant, due_at) WHERE due_at IS NOT NULL;
-- A partition's due rows, earliest first (the claim's per-partition walk).
CREATE INDEX queen_timers_partition_due ON queen_timers (tenant, queue, partition, due_at)
    WHERE due_at IS NOT NULL;
-- Claims only: "does a live claim hold this partition?" is one probe of a small index.
CREATE INDEX queen_timers_partition_claims ON queen_timers (tenant, queue, partition, claimed_until)
    WHERE claim_token IS NOT NULL;

-- Operator switches, cluster-wide (tenant '*'), read by every worker from the database so they hold
-- across workers and brokers: sweeper_paused stops the fire (only an operator can), and
-- scheduling_enabled = false refuses POST /api/v1/timers (503) and the transaction rider (403) while
-- the DELETE cancel keeps working.
CREATE TABLE queen_timer_switches (
    tenant             text PRIMARY KEY,
    sweeper_paused     boolean NOT NULL DEFAULT false,
    scheduling_enabled boolean NOT NULL DEFAULT true,
    updated_at         timestamptz NOT NULL DEFAULT now()
);

-- The cluster-wide row every worker reads.
INSERT INTO queen_timer_switches (tenant) VALUES ('*');

-- Fault injection for tests (QUEEN_TEST_HOOKS=1 only; see broker/http/test_hooks.py): the next
-- `remaining` fires of (tenant, queue) fail with failure_class, or stall for stall_ms before firing.
CREATE TABLE queen_timer_faults (
    tenant        text NOT NULL,
    queue         text COLLATE "C" NOT NULL,
    failure_class text NOT NULL CHECK (failure_class IN ('transient', 'permanent', 'stall')),
    remaining     integer NOT NULL CHECK (remaining >= 0),
    stall_ms      integer NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, queue)
);


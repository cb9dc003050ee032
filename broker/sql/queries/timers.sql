-- Timers: the schedule/cancel/peek/list surface, the sweeper, the operator switches and the test hooks.
-- The functions live in broker/sql/functions/timers.sql (queen_timers_take: partition-exclusive takes),
-- the tables in broker/sql/migrations/0003_timers.sql.

-- name: timers_apply
SELECT idx, status, txn, message_id, deliver_at
FROM queen_timers_apply(p_tenant => $1::text, p_sub => $2::text, p_check_switch => $3::boolean,
                        p_near_ms => $4::bigint, p_ops => $5::text[], p_queues => $6::text[], p_keys => $7::text[],
                        p_partitions => $8::text[], p_txns => $9::text[], p_ids => $10::uuid[],
                        p_payloads => $11::bytea[], p_zstd => $12::boolean[], p_key_ids => $13::text[],
                        p_delays => $14::bigint[], p_ready => $15::boolean[]);

-- name: timers_schedule
-- POST /api/v1/timers and the timers rider: queen_timers_apply and the meter of the promises it made
-- (scheduled and rescheduled) in ONE statement (in autocommit, or in the bundle's transaction); $1-$15 as
-- timers_apply, $16 the metering period in seconds (broker.timers.calls.TimersApply).
WITH r AS MATERIALIZED (
    SELECT idx, status, txn, message_id, deliver_at
    FROM queen_timers_apply(p_tenant => $1::text, p_sub => $2::text, p_check_switch => $3::boolean,
                            p_near_ms => $4::bigint, p_ops => $5::text[], p_queues => $6::text[],
                            p_keys => $7::text[], p_partitions => $8::text[], p_txns => $9::text[],
                            p_ids => $10::uuid[], p_payloads => $11::bytea[], p_zstd => $12::boolean[],
                            p_key_ids => $13::text[], p_delays => $14::bigint[], p_ready => $15::boolean[])
),
m AS MATERIALIZED (
    SELECT queen_meter($1::text, $16::integer,
                       (SELECT count(*) FROM r WHERE r.status IN ('scheduled', 'rescheduled')), 0::bigint) AS done
)
SELECT r.idx, r.status, r.txn, r.message_id, r.deliver_at FROM r CROSS JOIN m ORDER BY r.idx;

-- name: timers_encrypting_queues
SELECT name FROM queen_queues
WHERE tenant = $1 AND name = ANY($2::text[]) AND encryption_enabled;

-- name: timers_peek
SELECT queue, timer_key, partition, deliver_at, txn, message_id, payload, payload_zstd, key_id,
       producer_sub, attempts, last_error,
       (claim_token IS NOT NULL AND claimed_until > now()) AS claimed, created_at, updated_at,
       recur, occurrences, last_fired_at, (recur IS NOT NULL AND due_at IS NULL) AS paused
FROM queen_timers
WHERE tenant = $1 AND queue = $2 AND timer_key = $3;

-- name: timers_list
-- $4 is the page size + 1, so "truncated" is known without a count.
SELECT queue, timer_key, partition, deliver_at, txn, message_id, payload_zstd, key_id, producer_sub,
       attempts, last_error, (claim_token IS NOT NULL AND claimed_until > now()) AS claimed,
       created_at, updated_at, recur, occurrences, last_fired_at, (recur IS NOT NULL AND due_at IS NULL) AS paused
FROM queen_timers
WHERE tenant = $1 AND queue = $2 AND ($3::text IS NULL OR timer_key > $3::text COLLATE "C")
ORDER BY timer_key
LIMIT $4;

-- name: timers_sweeper_session
-- The sweeper's own connection: a fire transaction left idle longer than the lease (a hung sweeper) is
-- ended by the database, which rolls it back and frees its partitions; $1 in ms. Its commits do not
-- wait for the WAL flush (synchronous_commit off): a fire deletes the timers and pushes their messages
-- in one transaction, so a database crash that loses it loses both halves and the timers fire again
-- (same message ids and txns); and any client that has seen the messages through a write of its own
-- (a pop's lease or autoAck cursor, an ack) committed after the fire, so its flush covered the fire.
-- The commit's WAL flush would otherwise be the largest part of a small cycle.
-- $2: how many sweepers share this database's timers (this broker's workers), for queen_timers_take's
-- split of a due set that fits one cycle.
SELECT set_config('idle_in_transaction_session_timeout', $1::bigint::text, false),
       set_config('synchronous_commit', 'off', false),
       set_config('queen.sweeper_peers', $2::integer::text, false);

-- name: timers_take
-- Inside the sweeper's fire transaction (queen_timers_take: partition-exclusive, writes nothing).
SELECT tenant, queue, timer_key, partition, message_id, tid, payload, payload_zstd, key_id, deliver_at,
       fault, stall_ms, next_due_ms, paused
FROM queen_timers_take(p_batch => $1::integer, p_cursor => $2::text, p_faults => $3::boolean,
                       p_slice_cap => $4::integer);

-- name: timers_sweep
-- One cycle's take and, when every row taken is ready, its fire (queen_timers_sweep): rows 'fired' /
-- 'duplicate', or 'taken' (to pack and fire; p_in_tx: inside the sweeper's fire transaction) or 'unready'
-- (to take again in one; p_in_tx false: the statement is the cycle's transaction), then one 'summary'.
-- Taken rows carry recur and db_now (a recurring row's schedule and the database's clock).
SELECT kind, tenant, queue, timer_key, partition, message_id, tid, payload, payload_zstd, key_id, deliver_at,
       fault, stall_ms, next_due_ms, paused, taken, lag_s, recur, db_now
FROM queen_timers_sweep(p_batch => $1::integer, p_cursor => $2::text, p_faults => $3::boolean,
                        p_slice_cap => $4::integer, p_max_attempts => $5::integer, p_backoff_base_ms => $6::bigint,
                        p_backoff_cap_ms => $7::bigint, p_in_tx => $8::boolean);

-- name: timers_lease
-- Rows taken in this transaction that must be held past it (an injected stall): stamp a lease.
SELECT tenant, queue, timer_key, claimed_until
FROM queen_timers_lease(p_token => $1::uuid, p_lease_ms => $2::bigint, p_claimed_by => $3::text,
                        p_tenants => $4::text[], p_queues => $5::text[], p_keys => $6::text[], p_ids => $7::uuid[]);

-- name: timers_fire
-- Fire and fail the rows of a cycle: taken in this (open) transaction (p_token NULL; an error comes back
-- as a row of kind 'error'), or leased under p_token (in autocommit; an error is raised).
SELECT kind, tenant, queue, timer_key, lag_s
FROM queen_timers_fire(p_token => $1::uuid, g_tenants => $2::text[], g_queues => $3::text[], g_keys => $4::text[],
                       g_ids => $5::uuid[], g_tids => $6::tid[], g_payloads => $7::bytea[], g_codecs => $8::smallint[],
                       f_tenants => $9::text[], f_queues => $10::text[], f_keys => $11::text[], f_ids => $12::uuid[],
                       f_errors => $13::text[], f_costs => $14::integer[], f_wrap => $15::boolean[],
                       p_max_attempts => $16::integer, p_backoff_base_ms => $17::bigint,
                       p_backoff_cap_ms => $18::bigint);

-- name: timers_release_leases
-- Drain: hand back the leases this sweeper still holds; the rows are due again at once.
UPDATE queen_timers
   SET claim_token = NULL, claimed_until = NULL, claimed_by = NULL, due_at = deliver_at
WHERE claim_token = ANY($1::uuid[]);

-- name: timers_pending_total
-- queen_timers_pending: the per-tenant counters the triggers of broker/sql/functions/limits.sql keep, never a count of queen_timers.
SELECT coalesce(sum(timers_pending), 0)::bigint FROM queen_usage_gauges;

-- name: timers_switches_get
SELECT sweeper_paused, scheduling_enabled, updated_at FROM queen_timer_switches WHERE tenant = '*';

-- name: timers_switch_sweeper
UPDATE queen_timer_switches SET sweeper_paused = $1, updated_at = now() WHERE tenant = '*'
RETURNING sweeper_paused, scheduling_enabled, updated_at;

-- name: timers_switch_scheduling
UPDATE queen_timer_switches SET scheduling_enabled = $1, updated_at = now() WHERE tenant = '*'
RETURNING sweeper_paused, scheduling_enabled, updated_at;

-- name: timers_wake
-- Wake every sweeper: a timer due in $1 ms was committed (payload as queen_timers_apply sends it), or
-- '0' to look now (a resume, a released claim).
SELECT pg_notify('queen_timers', $1::text);

-- name: timers_fault_set
INSERT INTO queen_timer_faults (tenant, queue, failure_class, remaining, stall_ms)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (tenant, queue) DO UPDATE
   SET failure_class = excluded.failure_class, remaining = excluded.remaining, stall_ms = excluded.stall_ms
RETURNING tenant, queue, failure_class, remaining, stall_ms;

-- name: timers_hold
-- Test hook: lease one timer now for $4 ms without firing it (a token nobody holds in memory).
UPDATE queen_timers
   SET claim_token = gen_random_uuid(), claimed_until = now() + $4::bigint * interval '1 millisecond',
       due_at = greatest(deliver_at, now() + $4::bigint * interval '1 millisecond'),
       claimed_by = 'test-hook:hold'
WHERE tenant = $1 AND queue = $2 AND timer_key = $3
RETURNING claimed_until;

-- name: timers_release_hook_leases
-- Test hook: release every live lease of the tenant (optionally one queue / one key).
UPDATE queen_timers
   SET claim_token = NULL, claimed_until = NULL, claimed_by = NULL, due_at = deliver_at
WHERE tenant = $1 AND claim_token IS NOT NULL
  AND ($2::text IS NULL OR queue = $2::text) AND ($3::text IS NULL OR timer_key = $3::text);

-- name: timers_faults_clear
DELETE FROM queen_timer_faults WHERE tenant = $1 AND ($2::text IS NULL OR queue = $2::text);

-- name: timers_overview_queues
-- The console's timers page: the tenant's pending timers per queue and each queue's earliest due
-- instant. The scan reads at most $2 rows of the tenant (a bounded cost whatever the backlog); the
-- caller says `truncated` when it read that many. The tenant's exact total is timers_overview_total.
SELECT t.queue, count(*)::bigint AS pending, min(t.due_at) AS next_due_at,
       count(*) FILTER (WHERE t.claim_token IS NOT NULL AND t.claimed_until > now())::bigint AS claimed,
       count(*) FILTER (WHERE t.failures > 0)::bigint AS retrying
FROM (SELECT queue, due_at, claim_token, claimed_until, failures FROM queen_timers WHERE tenant = $1 LIMIT $2) t
GROUP BY t.queue
ORDER BY t.queue;

-- name: timers_overview_next
-- The tenant's next due timers, earliest first (index queen_timers_due).
SELECT queue, timer_key, partition, deliver_at, due_at, attempts,
       (claim_token IS NOT NULL AND claimed_until > now()) AS claimed
FROM queen_timers
WHERE tenant = $1
ORDER BY due_at, queue, timer_key
LIMIT $2;

-- name: timers_overview_total
-- The tenant's pending timers as the triggers of 0032 count them (exact, never a count of the table).
SELECT coalesce(sum(timers_pending), 0)::bigint AS pending, now() AS now
FROM queen_usage_gauges WHERE tenant = $1;

-- name: timers_vacuum_lock
-- One vacuum of queen_timers at a time across every worker and broker (a session lock of the
-- timers-vacuum loop's connection, released right after its VACUUM).
SELECT pg_try_advisory_lock(1364478286, 1) AS locked;

-- name: timers_vacuum_throttle
-- The timers-vacuum loop's VACUUM pauses $1 ms each time it has done vacuum_cost_limit of work, as
-- autovacuum does (QUEEN_TIMERS_VACUUM_COST_DELAY_MS). For this session, until timers_vacuum_unthrottle
-- (pooled connections carry no session state: broker/store/pool.py).
SELECT set_config('vacuum_cost_delay', $1::integer::text, false);

-- name: timers_vacuum_unthrottle
RESET vacuum_cost_delay;

-- name: timers_vacuum_unlock
SELECT pg_advisory_unlock(1364478286, 1);

-- name: timers_dead_rows
-- Dead rows of queen_timers (fired, cancelled, rescheduled) as the statistics system counts them: a
-- backend reports its deletes within about a second of its commit.
SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'queen_timers'::regclass), 0)::bigint;

-- name: timers_vacuum
-- Outside any transaction. INDEX_CLEANUP ON: the dead entries at the front of the due indexes are the
-- point (see broker/sql/migrations/0022_timers_vacuum.sql); SKIP_LOCKED: when autovacuum is on the table
-- already, this one steps aside instead of waiting.
VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) queen_timers;

-- name: timers_recur_apply
-- Recurring ops of POST /api/v1/timers and of the timers rider (queen_timers_recur_apply) and the meter
-- of the schedules among them ($18 = the metering period in seconds, 0: not metered): one statement, as
-- timers_schedule (broker.timers.calls.TimersRecurApply).
WITH r AS MATERIALIZED (
    SELECT idx, status, txn, message_id, deliver_at
    FROM queen_timers_recur_apply(p_tenant => $1::text, p_sub => $2::text, p_check_switch => $3::boolean,
                                  p_near_ms => $4::bigint, p_ops => $5::text[], p_queues => $6::text[],
                                  p_keys => $7::text[], p_partitions => $8::text[], p_txns => $9::text[],
                                  p_ids => $10::uuid[], p_payloads => $11::bytea[], p_zstd => $12::boolean[],
                                  p_key_ids => $13::text[], p_recur => $14::text[], p_delays => $15::bigint[],
                                  p_cand_idx => $16::integer[], p_cands => $17::timestamptz[])
),
m AS MATERIALIZED (
    SELECT queen_meter($1::text, $18::integer,
                       (SELECT count(*) FROM r WHERE r.status IN ('scheduled', 'rescheduled')), 0::bigint) AS done
    WHERE $18::integer > 0  -- 0: not metered
)
SELECT r.idx, r.status, r.txn, r.message_id, r.deliver_at FROM r LEFT JOIN m ON true ORDER BY r.idx;

-- name: timers_fire_recur
-- timers_fire for a cycle with recurring rows among those it fires ($1-$18 as timers_fire; $19-$28 the
-- recurring rows, each moved to the next occurrence the sweeper computed and its due occurrence pushed
-- when r_fire; $29 the metering period in seconds: broker.timers.calls.TimersFire with recur).
SELECT kind, tenant, queue, timer_key, lag_s
FROM queen_timers_fire(p_token => $1::uuid, g_tenants => $2::text[], g_queues => $3::text[], g_keys => $4::text[],
                       g_ids => $5::uuid[], g_tids => $6::tid[], g_payloads => $7::bytea[], g_codecs => $8::smallint[],
                       f_tenants => $9::text[], f_queues => $10::text[], f_keys => $11::text[], f_ids => $12::uuid[],
                       f_errors => $13::text[], f_costs => $14::integer[], f_wrap => $15::boolean[],
                       p_max_attempts => $16::integer, p_backoff_base_ms => $17::bigint,
                       p_backoff_cap_ms => $18::bigint,
                       r_tenants => $19::text[], r_queues => $20::text[], r_keys => $21::text[], r_ids => $22::uuid[],
                       r_payloads => $23::bytea[], r_codecs => $24::smallint[], r_fire => $25::boolean[],
                       r_next => $26::timestamptz[], r_next_ids => $27::uuid[], r_next_txns => $28::text[],
                       p_period_s => $29::integer);

-- Ephemeral queues (docs/protocol.md §6): speed over durability. The DECLARATION of a queue is an
-- ordinary (logged) table, so a configured queue survives anything the database survives; its
-- CONTENTS - messages, group cursors, in-flight leases, drop counters - live in UNLOGGED tables:
-- no WAL, shared by every worker and broker on this database like the rest of the state, and emptied
-- by PostgreSQL's crash recovery (a clean restart keeps them). They are not replicated to standbys.
-- The functions are in broker/sql/functions/ephemeral.sql.

-- One row per queue a tenant has, declared (POST /api/v1/ephemeral/configure) or implicit (first
-- named by a push or a pop, with these defaults; forgotten by the ephemeral-expiry loop once empty and
-- idle for QUEEN_EPHEMERAL_IDLE_S). Like every table, each of them leads with tenant.
CREATE TABLE queen_eph_queues (
    tenant       text NOT NULL,
    name         text COLLATE "C" NOT NULL,
    declared     boolean NOT NULL DEFAULT false,
    max_bytes    bigint NOT NULL DEFAULT 67108864,
    max_length   bigint NOT NULL DEFAULT 100000,
    policy       text NOT NULL DEFAULT 'reject' CHECK (policy IN ('reject', 'dropOldest')),
    ttl_s        integer NOT NULL DEFAULT 0,
    lease_s      integer NOT NULL DEFAULT 30,
    retry_limit  integer NOT NULL DEFAULT 3,
    window_ms    integer NOT NULL DEFAULT 0,
    window_count integer NOT NULL DEFAULT 0,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, name)
);

-- Message numbers: one logged sequence, so a number is never handed out twice, even across a crash
-- that emptied the unlogged tables (an ack of a message from before the crash can never hit a new one).
CREATE SEQUENCE queen_eph_seq;

-- The ring: FIFO per (queue, partition) in seq order.
CREATE UNLOGGED TABLE queen_eph_messages (
    tenant     text NOT NULL,
    queue      text COLLATE "C" NOT NULL,
    seq        bigint NOT NULL,
    partition  text COLLATE "C" NOT NULL,
    payload    jsonb NOT NULL,
    bytes      integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, queue, seq)
);
CREATE INDEX queen_eph_messages_partition ON queen_eph_messages (tenant, queue, partition, seq);
CREATE INDEX queen_eph_messages_age ON queen_eph_messages (tenant, queue, created_at);

-- Each consumer group's cursor per partition: every message of the partition with seq <= last_seq
-- has been handed to the group (or skipped by it).
CREATE UNLOGGED TABLE queen_eph_cursors (
    tenant    text NOT NULL,
    queue     text COLLATE "C" NOT NULL,
    grp       text COLLATE "C" NOT NULL,
    partition text COLLATE "C" NOT NULL,
    last_seq  bigint NOT NULL,
    PRIMARY KEY (tenant, queue, grp, partition)
);

-- Messages a group holds under a lease (not yet acked). A row whose lease_until has passed is due for
-- redelivery to the same group (attempts + 1), or dropped once attempts exceed the retry limit.
-- last_error is the error of the nack that asked for the redelivery (shown on the redelivered message).
CREATE UNLOGGED TABLE queen_eph_inflight (
    tenant      text NOT NULL,
    queue       text COLLATE "C" NOT NULL,
    grp         text COLLATE "C" NOT NULL,
    seq         bigint NOT NULL,
    partition   text COLLATE "C" NOT NULL,
    attempts    integer NOT NULL,
    lease_until timestamptz NOT NULL,
    last_error  text,
    PRIMARY KEY (tenant, queue, grp, seq)
);
CREATE INDEX queen_eph_inflight_due ON queen_eph_inflight (tenant, queue, grp, lease_until);
CREATE INDEX queen_eph_inflight_seq ON queen_eph_inflight (tenant, queue, seq);

-- Gauges and drop counters per queue, kept by the functions that insert and delete messages.
CREATE UNLOGGED TABLE queen_eph_stats (
    tenant         text NOT NULL,
    queue          text COLLATE "C" NOT NULL,
    depth          bigint NOT NULL DEFAULT 0,
    bytes          bigint NOT NULL DEFAULT 0,
    dropped_bounds bigint NOT NULL DEFAULT 0,
    dropped_ttl    bigint NOT NULL DEFAULT 0,
    dropped_retry  bigint NOT NULL DEFAULT 0,
    touched_at     timestamptz NOT NULL DEFAULT now(),  -- the last push, settle or drop
    PRIMARY KEY (tenant, queue)
);

-- The incarnation of a tenant's unlogged contents: made on first use, and again (with a new tag) after
-- a crash emptied the table. Message ids carry the tag, so an ack of an id minted before the crash
-- answers `stale` instead of touching anything.
CREATE UNLOGGED TABLE queen_eph_incarnation (
    tenant text PRIMARY KEY,
    tag    text NOT NULL
);

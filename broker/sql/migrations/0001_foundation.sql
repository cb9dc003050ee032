-- Foundation: tenants, queues, partitions, the message log and its dead letters. The functions that
-- write and read them live in broker/sql/functions/ (re-applied at boot); this file holds tables and indexes
-- only. A change to a table or an index is a NEW migration (forward only), never an edit of this one.
--
-- Every table leads with tenant, so a tenant can be moved between cells. Names that are compared or
-- paged by key carry COLLATE "C" (byte order, the same on every machine).

CREATE TABLE queen_tenants (
    tenant     text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- partition_count is kept by queen_push (partitions created so far): a pop compares it with the
-- group's cursor_count to learn, without a search, whether the group lacks a cursor somewhere.
CREATE TABLE queen_queues (
    tenant             text NOT NULL,
    name               text COLLATE "C" NOT NULL,
    namespace          text,
    task               text,
    lease_time_s       integer NOT NULL DEFAULT 300,
    retry_limit        integer NOT NULL DEFAULT 3,
    dlq_enabled        boolean NOT NULL DEFAULT true,
    encryption_enabled boolean NOT NULL DEFAULT false,
    options            jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    partition_count    integer NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, name)
);

-- The queues the log pruner looks at: only those with a retention option.
CREATE INDEX queen_queues_retention ON queen_queues (tenant, name)
    WHERE options ?| ARRAY['retentionSeconds', 'completedRetentionSeconds'];

-- next_seq is the partition's offset counter. A push takes the partition row's lock while it
-- allocates offsets, so within one partition commit order equals offset order and offsets have no
-- gaps: a consumer cursor ("everything <= seq is done") can never skip a late committer.
-- The row is rewritten on every push: room is left on each page so those updates stay HOT (no new
-- index entries), and it is vacuumed early.
CREATE TABLE queen_partitions (
    tenant       text NOT NULL,
    id           uuid NOT NULL,
    queue        text COLLATE "C" NOT NULL,
    name         text COLLATE "C" NOT NULL,
    next_seq     bigint NOT NULL DEFAULT 1,
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_push_at timestamptz,
    PRIMARY KEY (tenant, id),
    UNIQUE (tenant, queue, name)
) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_insert_scale_factor = 0.05);

-- The log. payload holds the stored bytes: JSON text, zstd-compressed when codec = 1, AES-GCM
-- encrypted (nonce || ciphertext) when key_id is set. Idempotency is (partition, transaction id).
CREATE TABLE queen_messages (
    tenant       text NOT NULL,
    partition_id uuid NOT NULL,
    seq          bigint NOT NULL,
    id           uuid NOT NULL,
    txn          text COLLATE "C" NOT NULL,
    trace_id     uuid,
    payload      bytea NOT NULL,
    codec        smallint NOT NULL DEFAULT 0,
    key_id       text,
    producer_sub text,
    deadline_at  timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, partition_id, seq),
    UNIQUE (tenant, partition_id, txn)
);

-- Dead letters. consumer_group is the group whose consumer gave up; synthetic = true marks a row that
-- never had a consumer group (a timer that exhausted its fire attempts): replaying it is refused,
-- because its "offset" is not a position in any group and a phantom group has no meaning.
CREATE TABLE queen_dlq (
    tenant              text NOT NULL,
    id                  uuid NOT NULL,
    queue               text COLLATE "C" NOT NULL,
    partition_id        uuid,
    partition           text COLLATE "C",
    consumer_group      text NOT NULL,
    synthetic           boolean NOT NULL DEFAULT false,
    message_id          uuid NOT NULL,
    txn                 text COLLATE "C" NOT NULL,
    trace_id            uuid,
    payload             bytea,
    codec               smallint NOT NULL DEFAULT 0,
    key_id              text,
    producer_sub        text,
    error               text,
    retry_count         integer NOT NULL DEFAULT 0,
    original_created_at timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, id)
);
CREATE INDEX queen_dlq_queue ON queen_dlq (tenant, queue, created_at);
CREATE INDEX queen_dlq_message ON queen_dlq (tenant, message_id);

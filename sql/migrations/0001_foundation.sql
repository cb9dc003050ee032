-- Foundation: tenants, queues, partitions and the message log, plus the one push function that every
-- writer of the log (push, transaction, timer fire) goes through.
--
-- Every table leads with tenant, so a tenant can be moved between cells. Names that are compared or
-- paged by key carry COLLATE "C" (byte order, the same on every machine).

CREATE TABLE queen_tenants (
    tenant     text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);

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
    PRIMARY KEY (tenant, name)
);

-- next_seq is the partition's offset counter. A push takes the partition row's lock while it
-- allocates offsets, so within one partition commit order equals offset order and offsets have no
-- gaps: a consumer cursor ("everything <= seq is done") can never skip a late committer.
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
);

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
CREATE INDEX queen_messages_txn ON queen_messages (tenant, txn);

-- queen_push: write a batch of messages in one statement.
--
-- Items are given as parallel arrays (index i of each array is item i). Queues and partitions are
-- created on first use. Returns one row per item, in item order:
--   status 'queued'    -> the message was written with message_id/partition_id/seq
--   status 'duplicate' -> (partition, txn) already exists (or repeats an earlier item of this batch);
--                         message_id is the existing message's id
-- Notifies channel queen_push with '<tenant>\t<queue>' once per queue touched (delivered at commit).
CREATE FUNCTION queen_push(
    p_tenant      text,
    p_queues      text[],
    p_partitions  text[],
    p_ids         uuid[],
    p_txns        text[],
    p_traces      uuid[],
    p_payloads    bytea[],
    p_codecs      smallint[],
    p_key_ids     text[],
    p_subs        text[],
    p_deadline_ms bigint[]
) RETURNS TABLE (idx integer, status text, message_id uuid, partition_id uuid, seq bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    INSERT INTO queen_tenants (tenant) VALUES (p_tenant) ON CONFLICT DO NOTHING;

    INSERT INTO queen_queues (tenant, name)
    SELECT DISTINCT p_tenant, q FROM unnest(p_queues) AS q
    ORDER BY 2
    ON CONFLICT DO NOTHING;

    -- A session-lifetime scratch table (rows vanish at commit), created once per connection.
    IF to_regclass('pg_temp.queen_push_items') IS NULL THEN
        CREATE TEMP TABLE queen_push_items (
            i integer, queue text COLLATE "C", part text COLLATE "C", id uuid, txn text COLLATE "C",
            trace uuid, payload bytea, codec smallint, key_id text, sub text, deadline_ms bigint,
            pid uuid, dup_of uuid, first_i integer, seq bigint
        ) ON COMMIT DELETE ROWS;
    END IF;
    DELETE FROM queen_push_items;

    INSERT INTO queen_push_items (i, queue, part, id, txn, trace, payload, codec, key_id, sub, deadline_ms)
    SELECT u.ord::integer, u.q, u.p, u.id, u.t, u.tr, u.pl, u.c, u.k, u.s, u.d
    FROM unnest(p_queues, p_partitions, p_ids, p_txns, p_traces, p_payloads, p_codecs, p_key_ids, p_subs, p_deadline_ms)
         WITH ORDINALITY AS u(q, p, id, t, tr, pl, c, k, s, d, ord);

    -- Create missing partitions, then lock every partition of the batch in a fixed order (so two
    -- batches over the same partitions cannot deadlock) and learn their ids.
    INSERT INTO queen_partitions (tenant, id, queue, name)
    SELECT p_tenant, gen_random_uuid(), x.queue, x.part
    FROM (SELECT DISTINCT queue, part FROM queen_push_items ORDER BY queue, part) x
    ON CONFLICT (tenant, queue, name) DO NOTHING;

    UPDATE queen_push_items it SET pid = p.id
    FROM (SELECT qp.id, qp.queue, qp.name FROM queen_partitions qp
          WHERE qp.tenant = p_tenant
            AND (qp.queue, qp.name) IN (SELECT DISTINCT queue, part FROM queen_push_items)
          ORDER BY qp.queue, qp.name
          FOR UPDATE) p
    WHERE p.queue = it.queue AND p.name = it.part;

    -- Duplicates: an existing message with the same (partition, txn), or an earlier item of this batch.
    UPDATE queen_push_items it SET dup_of = m.id
    FROM queen_messages m
    WHERE m.tenant = p_tenant AND m.partition_id = it.pid AND m.txn = it.txn;

    UPDATE queen_push_items it SET first_i = f.first_i
    FROM (SELECT pid, txn, min(i) AS first_i FROM queen_push_items GROUP BY pid, txn) f
    WHERE f.pid = it.pid AND f.txn = it.txn;

    UPDATE queen_push_items it SET dup_of = first.id
    FROM queen_push_items first
    WHERE it.dup_of IS NULL AND it.first_i <> it.i AND first.i = it.first_i AND first.pid = it.pid;

    -- Offsets: contiguous per partition, in item order.
    UPDATE queen_push_items it SET seq = qp.next_seq + r.rn - 1
    FROM (SELECT i, pid, row_number() OVER (PARTITION BY pid ORDER BY i) AS rn
          FROM queen_push_items WHERE dup_of IS NULL AND first_i = i) r,
         queen_partitions qp
    WHERE r.i = it.i AND qp.tenant = p_tenant AND qp.id = r.pid;

    UPDATE queen_partitions qp SET next_seq = qp.next_seq + c.n, last_push_at = now()
    FROM (SELECT pid, count(*) AS n FROM queen_push_items WHERE seq IS NOT NULL GROUP BY pid) c
    WHERE qp.tenant = p_tenant AND qp.id = c.pid;

    INSERT INTO queen_messages (tenant, partition_id, seq, id, txn, trace_id, payload, codec, key_id,
                                producer_sub, deadline_at)
    SELECT p_tenant, it.pid, it.seq, it.id, it.txn, it.trace, it.payload, coalesce(it.codec, 0), it.key_id,
           it.sub, CASE WHEN it.deadline_ms IS NULL THEN NULL
                        ELSE now() + it.deadline_ms * interval '1 millisecond' END
    FROM queen_push_items it WHERE it.seq IS NOT NULL
    ORDER BY it.pid, it.seq;

    PERFORM pg_notify('queen_push', p_tenant || E'\t' || q)
    FROM (SELECT DISTINCT queue AS q FROM queen_push_items WHERE seq IS NOT NULL) s;

    RETURN QUERY
    SELECT it.i, CASE WHEN it.seq IS NULL THEN 'duplicate' ELSE 'queued' END,
           coalesce(it.dup_of, it.id), it.pid, it.seq
    FROM queen_push_items it ORDER BY it.i;
END
$$;

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

-- Streams (the official client's streams SDK, /streams/v1/*): registered queries and their state.
-- The functions that read and write them are in broker/sql/functions/streams.sql.
--
-- A query is registered by name (unique per tenant) and gets a broker-minted id; config_hash is the
-- SDK's digest of its operator chain, compared at every registration (a different chain under the same
-- name is refused unless the caller asks to reset its state).
CREATE TABLE queen_stream_queries (
    tenant       text NOT NULL,
    id           uuid NOT NULL,
    name         text COLLATE "C" NOT NULL,
    source_queue text COLLATE "C" NOT NULL,
    sink_queue   text COLLATE "C",
    config_hash  text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, id),
    UNIQUE (tenant, name)
);

-- One row per (query, source partition, key): the operator state a cycle upserts or deletes. The
-- primary key serves reads by key and by key prefix (C collation: a prefix is an index range).
CREATE TABLE queen_stream_state (
    tenant       text NOT NULL,
    query_id     uuid NOT NULL,
    partition_id uuid NOT NULL,
    key          text COLLATE "C" NOT NULL,
    value        jsonb NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, query_id, partition_id, key)
);

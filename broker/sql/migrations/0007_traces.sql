-- Traces: events a consumer records about a message while it works on it (the official client's
-- msg.trace({...}), POST /api/v1/traces), read back per message or per trace name. A trace names its
-- message by address (partition id, transaction id); the message must exist when it is recorded.
CREATE TABLE queen_traces (
    tenant         text NOT NULL,
    id             uuid NOT NULL,
    partition_id   uuid NOT NULL,
    txn            text COLLATE "C" NOT NULL,
    consumer_group text COLLATE "C" NOT NULL,
    event_type     text NOT NULL,
    trace_names    text[] NOT NULL DEFAULT '{}',
    data           jsonb NOT NULL,
    sub            text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, id)
);
CREATE INDEX queen_traces_message ON queen_traces (tenant, partition_id, txn, created_at);

-- One row per (trace, name): the by-name reads and the name listing walk this index only.
CREATE TABLE queen_trace_names (
    tenant     text NOT NULL,
    name       text COLLATE "C" NOT NULL,
    created_at timestamptz NOT NULL,
    trace_id   uuid NOT NULL,
    PRIMARY KEY (tenant, name, created_at, trace_id)
);

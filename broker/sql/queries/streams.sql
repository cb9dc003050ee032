-- Streams (/streams/v1/*): one statement per route; the functions are in broker/sql/functions/streams.sql.

-- name: streams_register
-- The parameters of these three calls are built by broker.streams.calls, in $n order.
SELECT outcome, query_id, fresh, did_reset
FROM queen_streams_register(p_tenant => $1, p_name => $2, p_source => $3, p_sink => $4, p_hash => $5,
                            p_reset => $6);

-- name: streams_state_get
SELECT key, value, updated_at
FROM queen_streams_state_get(p_tenant => $1, p_query => $2, p_pid => $3, p_keys => $4, p_prefix => $5,
                             p_ripe => $6);

-- name: streams_cycle
-- $1-$9 the cycle's own, then the sink pushes as log_push_edge takes them ($10-$22).
SELECT kind, idx, status, message_id, partition_id, seq, detail
FROM queen_streams_cycle(p_query => $1, p_pid => $2, p_group => $3, p_op_keys => $4, p_op_values => $5,
                         p_ack_txn => $6, p_ack_lease => $7, p_ack_count => $8, p_release => $9,
                         p_tenant => $10, p_plain => $11, p_queues => $12, p_partitions => $13, p_ids => $14,
                         p_txns => $15, p_traces => $16, p_payloads => $17, p_codecs => $18, p_key_ids => $19,
                         p_subs => $20, p_deadline_ms => $21, p_period_s => $22);

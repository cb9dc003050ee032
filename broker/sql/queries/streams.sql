-- Streams (/streams/v1/*): one statement per route; the functions are in broker/sql/functions/streams.sql.

-- name: streams_register
-- $1 tenant, $2 name, $3 source queue, $4 sink queue or NULL, $5 config hash, $6 reset
SELECT outcome, query_id, fresh, did_reset FROM queen_streams_register($1, $2, $3, $4, $5, $6);

-- name: streams_state_get
-- $1 tenant, $2 query id, $3 partition id, $4 keys (empty = all), $5 key prefix or NULL, $6 ripe ms or NULL
SELECT key, value, updated_at FROM queen_streams_state_get($1, $2, $3, $4, $5, $6);

-- name: streams_cycle
-- $1 tenant, $2 query id, $3 partition id, $4 group, $5 state keys, $6 state values (JSON text, NULL =
-- delete), $7 ack txn or NULL, $8 ack lease, $9 ack count, $10 release lease, $11 metering period s,
-- $12 plain queues, then queen_push's arrays ($13..$22).
SELECT kind, idx, status, message_id, partition_id, seq, detail
FROM queen_streams_cycle($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
                         $19, $20, $21, $22);

-- The official client retries a dead letter by the message's address, (partitionId, transactionId)
-- (POST /api/v1/messages/:partitionId/:transactionId/retry): this index finds its DLQ rows in one probe,
-- whether or not the message itself is still in the log.
CREATE INDEX queen_dlq_address ON queen_dlq (tenant, partition_id, txn);

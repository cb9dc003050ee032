-- Deleting one message (DELETE /api/v1/messages/{pid}/{txn}, docs/decisions.md §9): the row stays at its
-- offset as a tombstone (payload emptied, deleted_at set), so a partition's offsets stay gapless and the
-- cursors' "every offset <= acked_seq is done" stays true. queen_message_delete (broker/sql/functions/
-- log.sql) writes it; queen_pop passes over it as done for every consumer group.
ALTER TABLE queen_messages ADD COLUMN deleted_at timestamptz;

-- Recurring timers (broker/timers/recur.py, docs/concepts/recurring-schedules.md): a row of queen_timers
-- whose recur column holds its schedule is fired occurrence after occurrence instead of once. Its
-- deliver_at is always the next occurrence and its txn / message_id that occurrence's frame's; the
-- sweeper's fire pushes the occurrence and moves the row to the next one in the same statement
-- (queen_timers_fire, broker/sql/functions/timers.sql), so an occurrence is fired once or not at all.
--
-- recur:       the schedule as JSON text ({cron, timeZone, missed, txn} or {everyMs, missed, txn}); NULL
--              for a one-shot timer. text, not jsonb: the broker only ever reads it back whole.
-- occurrences: frames fired so far (the first one was metered at schedule, the later ones at their fire).
-- last_fired_at: the database clock at the last fire.
-- due_at becomes nullable: a PAUSED recurring row has due_at NULL, so it is in none of the due indexes
-- (all partial on due_at IS NOT NULL, 0003_timers.sql) and no take ever reads it; its deliver_at keeps
-- the occurrence it will resume from. Every other row keeps a due_at, as before.
ALTER TABLE queen_timers ADD COLUMN recur text;
ALTER TABLE queen_timers ADD COLUMN occurrences bigint NOT NULL DEFAULT 0;
ALTER TABLE queen_timers ADD COLUMN last_fired_at timestamptz;
ALTER TABLE queen_timers ALTER COLUMN due_at DROP NOT NULL;

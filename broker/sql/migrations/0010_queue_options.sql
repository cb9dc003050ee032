-- The queue options that gate delivery and admission, as typed columns of queen_queues so that push and
-- pop read them with the row they already look up (no jsonb parsing, no extra lookup). They are
-- GENERATED from queen_queues.options, which stays the one place configure writes (and what the API
-- renders back): the two can never disagree. 0 = the option is off (the client's default).
--   priority           a namespace/task pop serves the queues of higher priority first;
--   delay_s            delayedProcessing: a message is not delivered before created_at + delay_s;
--   window_s           windowBuffer: a partition is not served until its newest message is window_s old;
--   retry_delay_ms     retryDelay: a failed delivery is not retried before the failure + retry_delay_ms;
--   max_wait_s         maxWaitTimeSeconds: a message still undelivered max_wait_s after it was pushed is
--                      dead-lettered at the next pop that reaches it, instead of being delivered;
--   max_size           maxSize: a push is refused when the queue's backlog plus the push would exceed it.
-- The option values are validated at configure (broker/log/parse.py) to be integers in range.
ALTER TABLE queen_queues
    ADD COLUMN priority integer NOT NULL
        GENERATED ALWAYS AS (coalesce((options ->> 'priority')::integer, 0)) STORED,
    ADD COLUMN delay_s integer NOT NULL
        GENERATED ALWAYS AS (coalesce((options ->> 'delayedProcessing')::integer, 0)) STORED,
    ADD COLUMN window_s integer NOT NULL
        GENERATED ALWAYS AS (coalesce((options ->> 'windowBuffer')::integer, 0)) STORED,
    ADD COLUMN retry_delay_ms integer NOT NULL
        GENERATED ALWAYS AS (coalesce((options ->> 'retryDelay')::integer, 0)) STORED,
    ADD COLUMN max_wait_s integer NOT NULL
        GENERATED ALWAYS AS (coalesce((options ->> 'maxWaitTimeSeconds')::integer, 0)) STORED,
    ADD COLUMN max_size bigint NOT NULL
        GENERATED ALWAYS AS (coalesce((options ->> 'maxSize')::bigint, 0)) STORED;

-- retryDelay: when a failed delivery of this message (a nack, or a lease that ran out) may be retried.
-- NULL = at once.
ALTER TABLE queen_msg_state ADD COLUMN retry_at timestamptz;

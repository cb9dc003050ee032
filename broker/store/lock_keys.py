"""Every fixed number the broker uses in a PostgreSQL advisory-lock key, in one place.

Most advisory locks here take two 32-bit keys: a class number from this table and a hash of the thing
locked (``pg_advisory_xact_lock(WAKE, queen_wake_key(tenant, queue))``). Two locks of different classes
never collide, whatever their hashes; a number reused for two purposes would make unrelated work wait
for each other, or a try-lock skip work it should do. The SQL writes these numbers literally (a
function body cannot import Python): tests/test_structure.py checks that the SQL uses exactly the
numbers listed here, each for the function named beside it. A new lock class takes a new number here
first.

Locks keyed by a hash alone (no class: the ephemeral rings, the stream steps) need no entry; their
strings carry their own prefix or separator.
"""

from __future__ import annotations

# Session lock of one migration run (broker/store/migrate.py): one bigint key, "QUEEN" in ASCII.
MIGRATE = 0x51_55_45_45_4E
# The wake-up handshake of (tenant, queue): a waiting pop registers under the exclusive lock, writers
# NOTIFY under the shared one (queen_listen, queen_wake).
WAKE = 7301
# One retention prune of a queue at a time across workers (queen_log_prune).
LOG_PRUNE = 7302
# A capped queue's maxSize check against concurrent pushes (queen_push_guard).
QUEUE_CAP = 7303
# One pop at a time makes a group's cursors for a queue's new partitions; the others walk the cursors
# that exist instead of waiting on the same rows (queen_pop).
CURSOR_MAKE = 7304
# The gathered pops of one (tenant, queue, consumer group) one statement at a time across workers and
# brokers, so two walks of the group's cursors do not pass over each other's locks (queen_pop_many).
POP_WALK = 7305
# The seed of hashtextextended for a KV key's (and a lock permit's) lock id (queen_kv_lock_id).
KV_KEY_SEED = 7142
# The calls on one lock name, serialised (queen_locks_apply).
LOCK_NAME = 7143
# One sweeper per (tenant, queue, partition) at a time (queen_timers_take).
TIMERS_PARTITION = 1_364_478_285
# One VACUUM of queen_timers at a time across workers and brokers (the timers-vacuum loop, a session lock
# with second key 1).
TIMERS_VACUUM = 1_364_478_286

# Every class number the SQL files use, each with a function or query that uses it (the structure test
# checks the numbers both ways and each number's user).
IN_SQL: dict[int, str] = {
    WAKE: "queen_wake",
    LOG_PRUNE: "queen_log_prune",
    QUEUE_CAP: "queen_push_guard",
    CURSOR_MAKE: "queen_pop",
    POP_WALK: "queen_pop_many",
    KV_KEY_SEED: "queen_kv_lock_id",
    LOCK_NAME: "queen_locks_apply",
    TIMERS_PARTITION: "queen_timers_take",
    TIMERS_VACUUM: "timers_vacuum_lock",
}

"""The message log: queues and partitions, push, pop with consumer groups and leases, acks, the DLQ,
transactions and lookups. ``parse`` validates what clients send (pure, no I/O), ``service`` and
``catalog`` run the named queries (one round trip per batch on the hot paths), ``transaction`` runs a
bundle, ``render`` builds the wire shapes, ``waiters`` holds the long polls woken by LISTEN/NOTIFY.
"""

QUEUE_MODE = "__QUEUE_MODE__"

"""Ephemeral queues (docs/protocol.md §6): speed over durability.

A queue's declaration is an ordinary table; its contents (messages, group cursors, leases, drop
counters) are UNLOGGED PostgreSQL tables: no WAL, still the one shared state of every worker and
broker, judged by the database clock, and emptied when PostgreSQL recovers from a crash (a clean
restart keeps them; a standby never has them). ``parse`` validates what clients send (pure),
``service`` runs the named queries of ``broker/sql/queries/ephemeral.sql`` (one round trip per call) and the
long polls, woken by NOTIFY ``queen_ephemeral``.
"""

CHANNEL = "queen_ephemeral"

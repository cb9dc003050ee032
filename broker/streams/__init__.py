"""Streams: the broker side of the official client's streams SDK (``/streams/v1/*``, docs/protocol.md §11).

A stream query is registered by name (``register``); its runner pops the source queue with the log's
ordinary pop (consumer group ``streams.<name>``) and commits each step with ONE ``cycle``: the
operator state it upserts or deletes, the items it pushes to its sink, and the acknowledgement of the
source batch, in one database transaction (``queen_streams_cycle``, which calls the log's own
``queen_ack`` and ``queen_push_edge``). ``state_get`` reads the state back. ``parse`` validates what
clients send (pure, no I/O); ``service`` runs the named queries and builds the answers.
"""

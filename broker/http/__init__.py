"""HTTP surfaces, one module per surface: parse + validate, call the domain, render. No SQL here, and
no background work: the services and loops are created and started by ``broker.services``.

Each module exposes ``setup(app)`` that adds its routes and nothing else. ``ROUTE_MODULES`` is the one
list the app factory walks. Handlers read the worker's context and the caller through
``broker.context`` (``broker(request)``, ``principal(request)``), never through ``broker.app``.
"""

from broker.http import (
    admin,
    admin_limits,
    admin_timers,
    console,
    consumer_groups,
    ephemeral,
    health,
    kv,
    locks,
    messages,
    metrics,
    monitoring,
    openapi,
    queues,
    reads,
    streams,
    test_hooks,
    timers,
    traces,
    transactions,
    usage,
)

ROUTE_MODULES = [health, metrics, admin, admin_limits, kv, usage, queues, messages, transactions]
ROUTE_MODULES += [timers, admin_timers, test_hooks, console, openapi]
ROUTE_MODULES += [consumer_groups, monitoring, traces, reads]
ROUTE_MODULES += [locks]
ROUTE_MODULES += [streams]
ROUTE_MODULES += [ephemeral]

"""HTTP surfaces, one module per surface: parse + validate, call the domain, render. No SQL here.

Each module exposes ``setup(app)`` that adds its routes (and registers its background loops with
``Broker.on_ready``). ``ROUTE_MODULES`` is the one list the app factory walks.
"""

from broker.http import (
    admin,
    admin_limits,
    admin_timers,
    health,
    kv,
    messages,
    metrics,
    queues,
    test_hooks,
    timers,
    transactions,
    usage,
)

ROUTE_MODULES = [health, metrics, admin, admin_limits, kv, usage, queues, messages, transactions]
ROUTE_MODULES += [timers, admin_timers, test_hooks]

"""The timer domain: op validation (``ops``), the closed status taxonomy and the result shapes
(``status``), schedule / cancel / peek / list against the database (``service``) and the ``timers``
rider of ``POST /api/v1/transaction`` (``rider``). The fire loop is ``broker.timers.sweeper``.

A timer is a message that is not in the log yet (docs/timer-routes.md). Every instant is computed by
PostgreSQL: ``deliverAt = now() + delayMs`` in SQL, claims and leases compared with ``now()`` in SQL.
"""

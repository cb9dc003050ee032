"""The one place that creates and starts the broker's services and background loops.

``build(broker)`` creates every per-worker service (one typed field each) and the transaction riders;
``create_app`` calls it once. Route modules only mount handlers: they never start anything.

Lifecycle (River's maintenance-service shape, driven by ``broker.app``):

- ``start(broker)``: once boot has finished (migrations applied, pool open), subscribe the services to
  their NOTIFY channels and start the supervised loops (``broker.process.loops``), in this order:
  ``listen`` (the LISTEN connection), ``limits-refresh``, ``kv-pruner``, ``log-retention``,
  ``ephemeral-expiry``, ``timers-vacuum`` (unless ``QUEEN_TIMERS_VACUUM_DEAD_ROWS=0``), ``sweeper``
  (unless ``QUEEN_SWEEPER_ENABLED=0``), then open the worker's push lane (``broker.log.lanes``, with ``QUEEN_PUSH_LANES=1``).
  ``/health`` lists the loops under ``loops``. Every loop body is named
  ``run``: a module's ``run(pool, settings)`` for a housekeeping loop (``kv.pruner``, ``log.retention``,
  ``ephemeral.expiry``, ``timers.vacuum``), or the ``run`` method of the object that holds the loop's
  state (the notifier, the limits cache, the sweeper).
- ``shutdown(broker)``: aiohttp's on_shutdown, before it waits for in-flight requests: the worker is
  draining and the long polls (the log's and the ephemeral queues') answer now.
- ``stop(broker)``: at drain, before the loops are cancelled and the pool is closed: the sweeper stops
  taking and hands its leases back, then the long-poll waiters are woken. Each step is bounded by
  ``QUEEN_DRAIN_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker import limits, metering, riders
from broker.ephemeral import CHANNEL as EPH_CHANNEL
from broker.ephemeral import expiry
from broker.ephemeral.service import EphemeralService
from broker.kv import pruner
from broker.kv.rider import RIDER as KV_RIDER
from broker.limits import LimitsCache
from broker.log import retention
from broker.log.service import LogService
from broker.log.waiters import CHANNEL as LOG_CHANNEL
from broker.timers import vacuum as timers_vacuum
from broker.timers.rider import RIDER as TIMERS_RIDER
from broker.timers.sweeper import CHANNEL as TIMERS_CHANNEL
from broker.timers.sweeper import Sweeper, SweeperConfig

if TYPE_CHECKING:
    from broker.context import Broker

log = logging.getLogger("queen.services")


@dataclass
class Services:
    log: LogService
    ephemeral: EphemeralService
    limits: LimitsCache
    riders: dict[str, riders.Rider]
    sweeper: Sweeper | None  # None when QUEEN_SWEEPER_ENABLED=0
    started: bool = False


def build(b: Broker) -> Services:
    """Create this worker's services (nothing runs yet) and attach them to ``b.services``."""
    s = b.settings
    metering.configure(s)
    services = Services(
        log=LogService(b),
        ephemeral=EphemeralService(b),
        limits=LimitsCache(s),
        riders=riders.registry(KV_RIDER, TIMERS_RIDER),
        sweeper=Sweeper(b.dsn, SweeperConfig.from_settings(s), b.codec) if s.sweeper_enabled else None,
    )
    b.services = services
    return services


async def start(b: Broker) -> None:
    """Subscribe to NOTIFY and start every background loop (boot has finished: the pool is open)."""
    svc = b.services
    assert b.notifier is not None
    notifier = b.notifier
    b.loops.start("listen", notifier.run)

    cache = svc.limits
    notifier.subscribe(limits.NOTIFY_CHANNEL, cache.invalidate)
    notifier.on_reconnect(lambda: cache.invalidate("*"))
    b.loops.start("limits-refresh", lambda: cache.run(b.require_pool))

    b.loops.start("kv-pruner", lambda: pruner.run(b.require_pool, b.settings))

    notifier.subscribe(LOG_CHANNEL, svc.log.waiters.notify)
    notifier.on_reconnect(svc.log.waiters.wake_all)
    notifier.subscribe(EPH_CHANNEL, svc.ephemeral.waiters.notify)
    notifier.on_reconnect(svc.ephemeral.waiters.wake_all)
    b.loops.start("log-retention", lambda: retention.run(b.require_pool, b.settings))
    b.loops.start("ephemeral-expiry", lambda: expiry.run(b.require_pool, b.settings))
    if b.settings.timers_vacuum_dead_rows:
        b.loops.start("timers-vacuum", lambda: timers_vacuum.run(b.require_pool, b.settings))

    if svc.sweeper is not None:
        notifier.subscribe(TIMERS_CHANNEL, svc.sweeper.notify)
        b.loops.start("sweeper", svc.sweeper.run)
    await svc.log.start()  # the push lanes' socket: other workers hand this one its tenants' pushes
    svc.started = True


async def shutdown(b: Broker) -> None:
    """aiohttp on_shutdown (before in-flight requests are awaited): long polls answer 204 now."""
    b.draining = True
    b.services.log.waiters.wake_all()
    b.services.ephemeral.waiters.wake_all()


async def _bounded(b: Broker, step: Awaitable[None], what: str) -> None:
    try:
        await asyncio.wait_for(step, timeout=b.settings.drain_timeout_s or 1)
    except Exception:
        log.exception("stop step %s failed", what)


async def _wake_waiters(b: Broker) -> None:
    b.services.log.waiters.wake_all()
    b.services.ephemeral.waiters.wake_all()


async def stop(b: Broker) -> None:
    """At drain, before the loops are cancelled and the pool closed: hand back the sweeper's leases,
    then wake the long-poll waiters."""
    svc = b.services
    if svc.started and svc.sweeper is not None:
        await _bounded(b, svc.sweeper.stop(timeout_s=max(1.0, b.settings.drain_timeout_s - 1)), "sweeper")
    await _bounded(b, _wake_waiters(b), "log-waiters")
    await _bounded(b, svc.log.close(), "log-coalescers")  # calls in flight answer their waiters

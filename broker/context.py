"""The per-worker context and the request accessors: a leaf of the import graph.

``Broker`` is the one context per worker process (``app[BROKER]``): the settings, the pool, the LISTEN
notifier, the key ring, the codec, the token verifier, the supervised loops, the boot/drain flags and
the typed ``services`` (built and started by ``broker.services``). HTTP modules read it with
``broker(request)`` and the authenticated caller with ``principal(request)``; the middleware in
``broker.app`` sets both. Nothing here imports the app, the route modules or the domain services, so
every one of them can import this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import asyncpg
from aiohttp import web

from broker import errors
from broker.auth import Principal, TokenVerifier
from broker.codec import Codec
from broker.config import Settings
from broker.crypto import KeyRing
from broker.process.loops import Loops
from broker.store.listen import Notifier

if TYPE_CHECKING:  # annotations only: broker.services imports the domain, which names Broker
    from broker.services import Services


@dataclass
class Broker:
    settings: Settings
    dsn: str
    worker_index: int = 0
    lanes_dir: str | None = None  # the push lanes' sockets (broker/log/lanes.py); None: no lanes
    verifier: TokenVerifier = field(init=False)
    keyring: KeyRing = field(init=False)
    codec: Codec = field(init=False)
    loops: Loops = field(default_factory=Loops)
    pool: asyncpg.Pool | None = None
    notifier: Notifier | None = None
    ready: bool = False
    boot_reason: str = "starting"
    draining: bool = False
    # Set by broker.services.build right after construction (create_app); typed, one field per service.
    services: Services = field(init=False)

    def __post_init__(self) -> None:
        self.verifier = TokenVerifier(self.settings)
        self.keyring = KeyRing(self.settings.encryption_keys)
        self.codec = Codec(self.settings.zstd_threshold_bytes, self.settings.zstd_level)

    def require_pool(self) -> asyncpg.Pool:
        if self.pool is None or not self.ready:
            raise errors.booting()
        return self.pool


BROKER: web.AppKey[Broker] = web.AppKey("broker", Broker)
PRINCIPAL_KEY = "queen.principal"


def principal(request: web.Request) -> Principal:
    p: Principal = request[PRINCIPAL_KEY]
    return p


def broker(request: web.Request) -> Broker:
    return request.app[BROKER]

"""Logging set-up: one line per record, with the process role in front.

asyncpg's pool logs a WARNING with the exception's traceback each time it fails to reopen a connection
("Failed to restore the pool connection floor"): during a failover that is a traceback per retry for an
event the broker handles. ``QuietOutages`` keeps the line and drops the traceback when the exception
is a database failure (``failures.DB_FAILURE``); anything else keeps its traceback.
"""

from __future__ import annotations

import logging
import sys


class QuietOutages(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        from broker.store.failures import DB_FAILURE, describe

        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and isinstance(exc, DB_FAILURE):
            record.msg = f"{record.getMessage()} ({describe(exc)})"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


def configure_logging(level: str = "INFO", prefix: str = "main") -> None:
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(asctime)s {prefix} %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("pgserver").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("asyncpg.pool").addFilter(QuietOutages())

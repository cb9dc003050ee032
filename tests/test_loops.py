"""Supervised loops: a crash of the code is logged with its traceback at each restart; an outage of the
database (a failover, a standby answering) is one WARNING line when it starts and one INFO line when the
loops run again, whatever the number of restarts in between."""

from __future__ import annotations

import asyncio
import logging

import pytest
from asyncpg import exceptions as pgx

from broker.process import loops as loops_mod
from broker.process.loops import Loops


async def test_an_outage_is_one_line_down_and_one_line_back(caplog, monkeypatch):
    monkeypatch.setattr(loops_mod, "RECOVERED_AFTER_S", 0.2)
    state = {"down": True, "runs": 0}

    async def body() -> None:
        state["runs"] += 1
        if state["down"]:
            raise pgx.ReadOnlySQLTransactionError("cannot execute INSERT in a read-only transaction")
        await asyncio.Event().wait()

    async def other() -> None:
        if state["down"]:
            raise ConnectionRefusedError(111, "Connection refused")
        await asyncio.Event().wait()

    caplog.set_level(logging.INFO, logger="queen.loops")
    lp = Loops(min_backoff_s=0.01, max_backoff_s=0.02)
    lp.start("a", body)
    lp.start("b", other)
    await asyncio.sleep(0.3)
    assert state["runs"] >= 5
    state["down"] = False
    await asyncio.sleep(0.8)
    await lp.stop()
    records = [r for r in caplog.records if r.name == "queen.loops"]
    down = [r for r in records if "database unavailable" in r.getMessage()]
    back = [r for r in records if "database back" in r.getMessage()]
    assert len(down) == 1 and len(back) == 1, [r.getMessage() for r in records]
    assert "read-only transaction" in down[0].getMessage() and down[0].levelno == logging.WARNING
    assert back[0].levelno == logging.INFO
    assert not any(r.exc_info for r in records)
    assert lp.restarts["a"] >= 5 and lp.outage_since is None


async def test_a_crash_of_the_code_keeps_its_traceback(caplog):
    async def body() -> None:
        raise KeyError("bug")

    caplog.set_level(logging.INFO, logger="queen.loops")
    lp = Loops(min_backoff_s=0.01, max_backoff_s=0.02)
    lp.start("c", body)
    await asyncio.sleep(0.1)
    await lp.stop()
    crashes = [r for r in caplog.records if "crashed" in r.getMessage()]
    assert len(crashes) >= 2 and all(r.exc_info for r in crashes)
    assert lp.outage_since is None


def test_asyncpg_pool_reconnect_warnings_lose_their_traceback_in_an_outage():
    from broker.process.logsetup import QuietOutages

    f = QuietOutages()
    try:
        raise ConnectionRefusedError(111, "Connection refused")
    except ConnectionRefusedError:
        import sys

        rec = logging.LogRecord("asyncpg.pool", logging.WARNING, __file__, 1, "Failed to restore %s", ("the floor",), sys.exc_info())
    assert f.filter(rec) and rec.exc_info is None
    assert "Failed to restore the floor" in rec.getMessage() and "Connection refused" in rec.getMessage()
    try:
        raise KeyError("bug")
    except KeyError:
        import sys

        rec = logging.LogRecord("asyncpg.pool", logging.WARNING, __file__, 1, "boom", None, sys.exc_info())
    assert f.filter(rec) and rec.exc_info is not None


pytestmark = pytest.mark.timeout(30)

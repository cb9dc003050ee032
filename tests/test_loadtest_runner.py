"""The load harness judges what it can see, broker-neutrally: push_pop's verdict says whether consumers kept
up (a growing backlog is red even with no failed request), and a broker without timers is told so in one
line before any load is sent, while push_pop still runs against it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from broker.process.localserver import LocalBroker
from conformance.mutants import Mutant, MutantProxy, Resp
from loadtest import report, runner

pytestmark = pytest.mark.timeout(120)


def test_backlog_verdict_judges_whether_consumers_kept_up() -> None:
    # the run: 10 s, pushed 1,489 msg/s, popped 381: the backlog grew by about 11,000 messages
    grew = runner.backlog_verdict({"items": 14_890}, {"items": 3_810}, 10.0)
    assert grew == {"pushed": 14_890, "acked": 3_810, "backlog_growth": 11_080, "backlog_growth_per_s": 1108.0,
                    "consumers_kept_up": False}
    assert "DID NOT KEEP UP" in runner.backlog_line(grew) and "11080" in runner.backlog_line(grew)
    kept = runner.backlog_verdict({"items": 1000}, {"items": 990}, 10.0)
    assert kept["consumers_kept_up"] is True and kept["backlog_growth"] == 10
    assert runner.backlog_verdict({"items": 0}, {}, 10.0)["consumers_kept_up"] is True


def test_a_capacity_step_is_judged_on_delivery_lag_at_the_consumers() -> None:
    def step(fire_p99: float | None, deliv_p99: float | None, scheduled: float = 1000, fired: float = 1000) -> dict[str, Any]:
        return {"fire_lag": {"p99_ms": fire_p99}, "delivery_lag": {"p99_ms": deliv_p99},
                "schedule_rate": scheduled, "fire_rate": fired}

    # a fire lag well inside the SLO does not hold the step when the consumers receive late
    assert runner.step_reasons(step(8.0, 75.0), 1000, 50, 0.95) == ["delivery-lag p99 75 ms > SLO 50 ms"]
    assert runner.step_reasons(step(40.0, 49.0), 1000, 50, 0.95) == []
    assert runner.step_reasons(step(5.0, None), 1000, 50, 0.95) == ["no timer reached the consumers"]
    assert runner.step_reasons(step(None, None), 1000, 50, 0.95) == ["no timer fired"]
    assert runner.step_reasons(step(5.0, 10.0, scheduled=900, fired=800), 1000, 50, 0.95) == [
        "scheduled 900/s < 95% of target", "fired 800/s < 95% of target"]


def test_push_pop_verdict_is_red_when_the_backlog_grows() -> None:
    s: dict[str, Any] = {"push_msgs_per_s": 1489, "pop_msgs_per_s": 381, "ack_msgs_per_s": 381, "failures": [],
                         **runner.backlog_verdict({"items": 14_890}, {"items": 3_810}, 10.0)}
    html = report._verdict("push_pop", s)
    assert 'class="verdict bad"' in html and "did not keep up" in html and "11080" in html
    s.update(runner.backlog_verdict({"items": 3_810}, {"items": 3_810}, 10.0))
    assert 'class="verdict good"' in report._verdict("push_pop", s)


def _no_timers(req: Any, st: dict[str, Any]) -> Any:
    """A broker without the timer routes: every /api/v1/timers call is a 404."""
    if req.path.startswith("/api/v1/timers"):
        return Resp(404, {"Content-Type": "application/json"}, b'{"error": "Not found"}')
    return req


def test_a_broker_without_timers_is_told_in_one_line(broker: LocalBroker, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    with MutantProxy(broker.url, Mutant("no-timers", (), "no timer routes", on_request=_no_timers)) as url:
        rc = runner.main(["timers_lag", "--url", url, "--duration", "2", "--out", str(tmp_path / "lag")])
        out = capsys.readouterr().out
        assert rc == 2
        lines = [ln for ln in out.splitlines() if "offers no timers" in ln]
        assert len(lines) == 1 and "timers_lag cannot run" in lines[0] and "404" in lines[0], out
        assert not (tmp_path / "lag" / "timers_lag_stats.csv").exists(), "load was sent anyway"

        rc = runner.main(["push_pop", "--url", url, "--duration", "3", "--users", "2", "--out", str(tmp_path / "pp"),
                          "--", "--max-items", "200"])
        out = capsys.readouterr().out
    assert rc == 0
    assert "push_pop does not need them, running it" in out
    s = json.loads((tmp_path / "pp" / "summary.json").read_text())
    assert s["pushed"] > 0 and "consumers_kept_up" in s
    assert ("consumers kept up" in out) or ("CONSUMERS DID NOT KEEP UP" in out)

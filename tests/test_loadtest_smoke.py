"""Each load scenario runs end to end for a few seconds against the shared test broker.

These keep the harness working while the surfaces it loads change; they assert that traffic flowed and
was measured (not how fast: the machine is shared). Budget: well under 90 s together.
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser import launched, save_view, shot_on_failure

from broker.process.localserver import LocalBroker
from loadtest import runner
from loadtest.outage_deadlines import DbClock

pytestmark = pytest.mark.timeout(120)


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def _stats(out: Path, scenario: str) -> dict[tuple[str, str], dict[str, str]]:
    with open(out / f"{scenario}_stats.csv") as f:
        return {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}


def look_at_report(out: Path, name: str, *, plots: int) -> str:
    """Open ``out/report.html`` in headless Chromium: the verdict comes first, every plot is an inline
    image that decoded, and the page asks nothing from anywhere else. Returns the verdict's text."""
    path = out / "report.html"
    assert path.exists(), "the run wrote no report.html"
    with launched() as browser:
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        fetched: list[str] = []
        page.on("request", lambda r: fetched.append(r.url))
        with shot_on_failure(page, f"report-{name}"):
            page.goto(path.as_uri())
            headings = page.locator("h2").all_inner_texts()
            assert headings[0] == "Verdict" and "Machine" in headings and "Settings" in headings, headings
            verdict = page.inner_text("#verdict")
            images = page.locator("img")
            assert images.count() == plots
            for i in range(plots):
                assert images.nth(i).get_attribute("src").startswith("data:image/png;base64,")
                assert images.nth(i).evaluate("img => img.complete && img.naturalWidth > 100")
            assert [u for u in fetched if not u.startswith(("file:", "data:"))] == [], fetched
            assert "CPUs" in page.inner_text("body")
            save_view(page, f"report-{name}")
            return verdict


@pytest.mark.browser
def test_timers_lag_measures_fire_and_delivery_lag(broker: LocalBroker, tmp_path: Path) -> None:
    rc = runner.main(["timers_lag", "--url", broker.url, "--duration", "7", "--rate", "100", "--users", "2",
                      "--window-ms", "1000", "--out", str(tmp_path)])
    assert rc == 0
    s = _summary(tmp_path)
    assert s["schedule_failures"] == 0, s["failures"]
    assert s["scheduled"] >= 200  # 100/s for 4 s of scheduling, loosely
    assert s["received"] >= 0.5 * s["scheduled"]  # the rest may still be due when the run stops on a busy box
    assert s["fire_lag"]["count"] >= s["received"]  # the broker histogram saw at least the fires we received
    assert s["fire_lag"]["p99_ms"] is not None and s["delivery_lag"]["p99_ms"] is not None
    stats = _stats(tmp_path, "timers_lag")
    # both lags are Locust request types of their own, in its CSV
    assert int(stats[("FIRE_LAG", "createdAt - deliverAt")]["Request Count"]) == s["received"]
    assert int(stats[("DELIVERY_LAG", "receipt - deliverAt")]["Request Count"]) == s["received"]
    assert (tmp_path / "lag_percentiles.png").stat().st_size > 0
    assert (tmp_path / "rates.png").stat().st_size > 0
    verdict = look_at_report(tmp_path, "timers_lag", plots=3)  # lag, rates, errors
    assert "timers/s" in verdict and "p99" in verdict


def test_timers_schedule_runs_every_batch_size_and_cancels(broker: LocalBroker, tmp_path: Path) -> None:
    rc = runner.main(["timers_schedule", "--url", broker.url, "--duration", "4", "--users", "3", "--out", str(tmp_path)])
    assert rc == 0
    s = _summary(tmp_path)
    assert s["failures"] == []
    for n in ("1", "16", "256"):
        assert s["schedule"][n]["requests"] and s["schedule"][n]["timers"] == s["schedule"][n]["requests"] * int(n)
    assert s["cancel"]["requests"] and not s["cancel"]["failures"]
    assert (tmp_path / "report.html").stat().st_size > 0


def test_push_pop_moves_messages_within_the_count_bound(broker: LocalBroker, tmp_path: Path) -> None:
    rc = runner.main(["push_pop", "--url", broker.url, "--duration", "4", "--users", "2", "--out", str(tmp_path),
                      "--", "--max-items", "300"])
    assert rc == 0
    s = _summary(tmp_path)
    assert s["failures"] == []
    assert s["push_msgs_per_s"] > 0 and s["pop_msgs_per_s"] > 0 and s["ack_msgs_per_s"] > 0
    pushed = _stats(tmp_path, "push_pop")[("POST", "POST /api/v1/push [10]")]
    assert 0 < int(pushed["Request Count"]) <= 30  # --max-items 300 in batches of 10: the run stopped sending
    assert "msg/s" in (tmp_path / "report.html").read_text()


def test_distributed_master_and_two_workers(broker: LocalBroker, tmp_path: Path) -> None:
    rc = runner.main(["timers_lag", "--url", broker.url, "--duration", "7", "--rate", "100", "--users", "2",
                      "--window-ms", "500", "--distributed", "2", "--out", str(tmp_path)])
    assert rc == 0
    s = _summary(tmp_path)
    # The master runs no users: everything counted was done by the two worker processes, and together
    # they held the target rate (each worker knows the total user count and the scheduling time).
    expected = 100 * s["schedule_seconds"]
    assert s["schedule_failures"] == 0 and 0.5 * expected <= s["scheduled"] <= 1.15 * expected
    assert s["received"] > 0


@pytest.mark.browser
def test_capacity_steps_the_rate(broker: LocalBroker, pg: Any, tmp_path: Path) -> None:
    rc = runner.main(["capacity", "--url", broker.url, "--rates", "50,100", "--step-duration", "5", "--window-ms", "500",
                      "--slo-p99-ms", "5000", "--hold-fraction", "0.5", "--bare-dsn", pg.admin_dsn, "--out", str(tmp_path)])
    assert rc == 0
    s = _summary(tmp_path)
    assert [st["target_rate"] for st in s["steps"]] == [50.0, 100.0]
    assert s["highest_rate_held"] == 100.0 and s["broke_at"] is None
    assert all(st["delivery_lag"]["p99_ms"] is not None for st in s["steps"])  # what each step was judged on
    # judged against the default target, and set beside the bare-SQL fire rate of the same server
    assert s["target_rate"] == 15000 and s["target_met"] is False
    assert s["bare_fire_rate"] > 0 and s["held_vs_bare"] == round(100 / s["bare_fire_rate"], 3)
    assert (tmp_path / "capacity.png").exists()
    verdict = look_at_report(tmp_path, "capacity", plots=1)
    assert "Capacity at the SLO: 100 timers/s" in verdict


@pytest.mark.browser
def test_outage_deadlines_short_run(broker: LocalBroker, tmp_path: Path) -> None:
    rc = runner.main(["outage_deadlines", "--url", broker.url, "--interval", "0.1", "--duration", "3", "--timeout", "0.5",
                      "--outage-start", "0.6", "--outage", "3", "--drain", "4", "--out", str(tmp_path)])
    assert rc == 0
    s = _summary(tmp_path)
    without, with_ = s["without"], s["with"]
    for o in (without, with_):
        assert o["orders"] == 30 and o["succeeded"] + o["failed"] == 30
        assert o["failed"] > 0  # billing was down longer than timeout + retry
    # without deadlines every call is run once billing returns: the failed orders were charged anyway
    assert without["expired_skipped"] == 0
    assert without["charged_after_failed"] > 0 and without["charges"] > without["succeeded"]
    # with deadlines the broker skipped the expired calls (DLQ rows with deadline_exceeded)
    assert with_["expired_skipped"] > 0 and with_["skipped_by_consumer"] <= with_["expired_skipped"]
    assert with_["charges"] < without["charges"]
    # The guarantee (the run's exit code above says the same): every charge was told to its caller as a
    # success, and no order was charged twice. Billing checked each popped call's deadlineAt right
    # before charging; the caller waited until its deadline had passed and its replies were read.
    assert with_["charged_twice"] == 0 and with_["charged_after_failed"] == 0, with_
    assert with_["guarantee"] == [] and with_["charges"] == with_["succeeded"], with_
    assert with_["clock_uncertainty_ms"] is not None and with_["clock_uncertainty_ms"] < 1000 * with_["margin_s"]
    verdict = look_at_report(tmp_path, "outage_deadlines", plots=0)
    assert f"made {without['charges']} charges" in verdict.replace("\n", " ")
    assert "deadline guarantee held" in verdict


async def test_outage_billing_reads_the_database_clock(broker: LocalBroker) -> None:
    """Billing's last check reads PostgreSQL's clock off its own monotonic one: on this machine both
    share the kernel's clock, so the bounds it measured must bracket the local wall clock."""
    clock = DbClock()
    async with httpx.AsyncClient(base_url=broker.url, timeout=30) as c:
        await clock.measure(c)
    low, wall, high = clock.earliest(), time.time(), clock.latest()
    assert low <= wall + 0.002 and wall <= high + 0.002, (low, wall, high)
    assert 0 <= clock.uncertainty_ms < 1000  # the bounds are ordered and tight enough to be of use


@pytest.mark.browser
def test_recurring_runs_schedules_across_tenants(start_broker, tmp_path: Path) -> None:
    """Every-second schedules over three tenants (a broker that authenticates, tokens minted by the
    scenario) for a few seconds: occurrences flowed, none missed or doubled, lags and the cost of the next
    occurrence measured."""
    secret = "recurring-smoke-" + "x" * 32
    b = start_broker(env={"QUEEN_JWT_SECRET": secret})
    rc = runner.main(["recurring", "--url", b.url, "--schedules", "30", "--tenants", "3", "--duration", "5",
                      "--jwt-secret", secret, "--out", str(tmp_path)])
    assert rc == 0
    s = _summary(tmp_path)
    assert s["tenants"] == 3 and s["scheduled"] == 30 and not s["errors"], s["errors"]
    assert s["expected"] >= 30 and s["received"] >= s["expected"]
    assert s["missed"] == 0 and s["doubles"] == 0
    assert s["fire_lag_ms"]["p99"] is not None and s["delivery_lag_ms"]["count"] == s["received"]
    assert s["next_cost_us_local"] > 0 and s["next_cost_us_broker"] is not None
    verdict = look_at_report(tmp_path, "recurring", plots=0)
    assert "0 missed, 0 doubled" in verdict

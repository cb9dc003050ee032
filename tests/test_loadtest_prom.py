"""loadtest.prom: quantiles from Prometheus histogram bucket deltas, and parsing the broker's text."""

from __future__ import annotations

import math

import pytest

from loadtest import prom
from loadtest.report import format_table, lag_series

TEXT = """# HELP queen_timers_fire_lag_seconds lag
# TYPE queen_timers_fire_lag_seconds histogram
queen_timers_fire_lag_seconds_bucket{le="0.005"} 10.0
queen_timers_fire_lag_seconds_bucket{le="0.01"} 90.0
queen_timers_fire_lag_seconds_bucket{le="0.05"} 100.0
queen_timers_fire_lag_seconds_bucket{le="+Inf"} 100.0
queen_timers_fire_lag_seconds_sum 0.8
queen_timers_fire_lag_seconds_count 100.0
# TYPE queen_timers_fired_total counter
queen_timers_fired_total 100.0
# TYPE queen_timers_ops_total counter
queen_timers_ops_total{status="scheduled"} 7.0
queen_timers_ops_total{status="cancelled"} 2.0
"""


def test_parse_histogram_and_counters() -> None:
    s = prom.parse(TEXT, at=1.0)
    h = s.hist(prom.FIRE_LAG)
    assert h.buckets == {0.005: 10.0, 0.01: 90.0, 0.05: 100.0, math.inf: 100.0}
    assert h.count == 100 and h.sum == pytest.approx(0.8)
    assert s.counter(prom.FIRED) == 100
    assert s.counter(prom.TIMER_OPS) == 9
    assert s.counter(prom.TIMER_OPS, status="scheduled") == 7


def test_quantiles_interpolate_inside_the_bucket() -> None:
    h = prom.parse(TEXT).hist(prom.FIRE_LAG)
    assert h.quantile(0.05) == pytest.approx(0.0025)  # rank 5 of 10 in [0, 5 ms]
    assert h.quantile(0.5) == pytest.approx(0.0075)  # rank 50: 40 of 80 into (5, 10] ms
    assert h.quantile(0.99) == pytest.approx(0.046)  # rank 99: 9 of 10 into (10, 50] ms
    assert h.max_bound() == 0.05
    s = h.summary_ms()
    assert (s["p50_ms"], s["p99_ms"], s["max_le_ms"], s["mean_ms"]) == (7.5, 46.0, 50.0, 8.0)
    assert s["above_last_bucket"] is False


def test_delta_between_scrapes_is_what_happened_in_between() -> None:
    before = prom.Histogram({0.005: 10, 0.01: 10, math.inf: 10}, 0.02, 10)
    after = prom.Histogram({0.005: 10, 0.01: 30, math.inf: 31}, 0.3, 31)
    d = after - before
    assert d.buckets == {0.005: 0, 0.01: 20, math.inf: 21} and d.count == 21
    assert d.quantile(0.5) == pytest.approx(0.005 + 0.005 * 10.5 / 20)
    # the 21st observation lies beyond the last finite bound: only the bound is known
    assert d.quantile(1.0) == pytest.approx(0.01)
    assert d.max_bound() == math.inf and d.summary_ms()["above_last_bucket"] is True


def test_empty_histogram_has_no_quantiles() -> None:
    h = prom.Histogram()
    assert h.quantile(0.99) is None and h.max_bound() is None
    assert prom.Histogram({0.01: 0, math.inf: 0}).summary_ms()["p99_ms"] is None
    with pytest.raises(ValueError):
        h.quantile(1.5)


def test_lag_series_skips_windows_without_fires() -> None:
    def point(at: float, c5: float, c10: float) -> dict:
        return {"at": at, "fire_lag": {"buckets": [[0.005, c5], [0.01, c10], ["+Inf", c10]], "sum": 0, "count": c10},
                "counters": {}}

    pts = [point(0, 0, 0), point(1, 0, 0), point(2, 0, 0), point(3, 4, 4), point(4, 4, 8)]
    series = lag_series(pts, window=1)
    assert [p["t"] for p in series] == [3, 4]
    assert series[0]["p99_ms"] <= 5.0 and series[1]["p50_ms"] > 5.0


def test_format_table_aligns_and_marks_missing() -> None:
    t = format_table(["name", "n"], [["a", 1], ["bb", None]])
    lines = t.splitlines()
    assert lines[0].startswith("name") and lines[3].endswith("-") and len({len(x) for x in lines}) == 1

"""Reading the broker's Prometheus text: histogram buckets, counters, and quantiles from bucket deltas.

A Prometheus histogram is a set of cumulative counters (``_bucket{le=...}``). The distribution of what
happened between two scrapes is the difference of the two sets; a quantile is found the way
``histogram_quantile`` does it: locate the bucket holding the rank and interpolate linearly inside it.
The largest observation is only known to lie below the upper bound of the highest non-empty bucket,
so ``max`` is that bound (an upper estimate), never a measured value.
"""

from __future__ import annotations

import math
import time
import urllib.request
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

FIRE_LAG = "queen_timers_fire_lag_seconds"
FIRED = "queen_timers_fired_total"
SWEEP_CYCLE = "queen_sweeper_cycle_seconds"
TIMER_OPS = "queen_timers_ops_total"
PUSHED = "queen_messages_pushed_total"
EXPIRED = "queen_messages_expired_total"


@dataclass
class Histogram:
    """Cumulative bucket counts keyed by upper bound (``math.inf`` for ``+Inf``), plus sum and count."""

    buckets: dict[float, float] = field(default_factory=dict)
    sum: float = 0.0
    count: float = 0.0

    def __sub__(self, older: Histogram) -> Histogram:
        bounds = sorted(set(self.buckets) | set(older.buckets))
        return Histogram(
            {b: max(0.0, self.buckets.get(b, 0.0) - older.buckets.get(b, 0.0)) for b in bounds},
            self.sum - older.sum,
            max(0.0, self.count - older.count),
        )

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0..1) in the histogram's unit, or None when it holds no observation."""
        if not 0.0 <= q <= 1.0:
            raise ValueError("q must be within [0, 1]")
        bounds = sorted(self.buckets)
        if not bounds:
            return None
        total = self.buckets[bounds[-1]]
        if total <= 0:
            return None
        rank = q * total
        lower_bound, lower_count = 0.0, 0.0
        for b in bounds:
            c = self.buckets[b]
            if c >= rank and c > lower_count:
                if math.isinf(b):
                    # Beyond the last finite bound nothing is known but the bound itself.
                    return lower_bound
                return lower_bound + (b - lower_bound) * (rank - lower_count) / (c - lower_count)
            lower_bound, lower_count = b, c
        return lower_bound

    def max_bound(self) -> float | None:
        """Upper bound of the highest non-empty bucket (the largest observation is at most this)."""
        bounds = sorted(self.buckets)
        prev = 0.0
        top: float | None = None
        for b in bounds:
            c = self.buckets[b]
            if c > prev:
                top = b
            prev = c
        return top

    def summary_ms(self) -> dict[str, float | int | None]:
        def ms(v: float | None) -> float | None:
            if v is None:
                return None
            return None if math.isinf(v) else round(v * 1000.0, 3)

        top = self.max_bound()
        return {
            "count": int(self.count),
            "p50_ms": ms(self.quantile(0.50)),
            "p90_ms": ms(self.quantile(0.90)),
            "p99_ms": ms(self.quantile(0.99)),
            # the largest observation is at most this (upper bound of the highest non-empty bucket);
            # None with ``above_last_bucket`` when it fell beyond the last finite bound
            "max_le_ms": ms(top),
            "above_last_bucket": bool(top is not None and math.isinf(top)),
            "mean_ms": round(self.sum / self.count * 1000.0, 3) if self.count else None,
        }


@dataclass
class Scrape:
    """One scrape of ``/metrics/prometheus``: wall time, histograms and counter totals by name."""

    at: float
    histograms: dict[str, Histogram]
    counters: dict[str, float]

    def hist(self, name: str) -> Histogram:
        return self.histograms.get(name, Histogram())

    def counter(self, name: str, **labels: str) -> float:
        key = _key(name, labels)
        return self.counters.get(key, 0.0)


def _key(name: str, labels: dict[str, str]) -> str:
    if not labels:
        return name
    return name + "{" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}"


def parse(text: str, at: float | None = None) -> Scrape:
    histograms: dict[str, Histogram] = {}
    counters: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.type == "histogram":
            h = histograms.setdefault(fam.name, Histogram())
            for s in fam.samples:
                # Sum over any label other than ``le`` (a histogram with labels is aggregated).
                if s.name.endswith("_bucket"):
                    le = float(s.labels["le"])
                    h.buckets[le] = h.buckets.get(le, 0.0) + s.value
                elif s.name.endswith("_sum"):
                    h.sum += s.value
                elif s.name.endswith("_count"):
                    h.count += s.value
        elif fam.type in ("counter", "gauge"):
            for s in fam.samples:
                if s.name.endswith("_created"):
                    continue
                labels = {k: v for k, v in s.labels.items() if k != "pid"}
                name = s.name if fam.type == "gauge" else (s.name if s.name.endswith("_total") else s.name + "_total")
                total_key = name  # all label sets together
                counters[total_key] = counters.get(total_key, 0.0) + s.value
                if labels:
                    k = _key(name, labels)
                    counters[k] = counters.get(k, 0.0) + s.value
    return Scrape(time.time() if at is None else at, histograms, counters)


def scrape(base_url: str, timeout: float = 5.0) -> Scrape:
    with urllib.request.urlopen(base_url.rstrip("/") + "/metrics/prometheus", timeout=timeout) as resp:
        return parse(resp.read().decode("utf-8", "replace"))

"""Turning a run's raw files (Locust CSVs, the metrics timeline) into a summary and PNG plots."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from loadtest import prom


def read_stats(prefix: Path) -> list[dict[str, Any]]:
    """Rows of ``<prefix>_stats.csv`` with numbers parsed, plus ``items`` (requests x content size)."""
    path = Path(f"{prefix}_stats.csv")
    if not path.exists():
        return []
    rows = []
    with path.open() as f:
        for r in csv.DictReader(f):
            row: dict[str, Any] = {"type": r["Type"], "name": r["Name"]}
            for key, col in (("requests", "Request Count"), ("failures", "Failure Count"), ("rps", "Requests/s"),
                             ("avg_ms", "Average Response Time"), ("max_ms", "Max Response Time"),
                             ("p50_ms", "50%"), ("p90_ms", "90%"), ("p99_ms", "99%"),
                             ("avg_size", "Average Content Size")):
                row[key] = _num(r.get(col))
            row["items"] = round((row["requests"] or 0) * (row["avg_size"] or 0))
            rows.append(row)
    return rows


def read_history(prefix: Path) -> list[dict[str, Any]]:
    path = Path(f"{prefix}_stats_history.csv")
    if not path.exists():
        return []
    out = []
    with path.open() as f:
        for r in csv.DictReader(f):
            out.append({
                "at": _num(r["Timestamp"]), "type": r["Type"], "name": r["Name"],
                "p50_ms": _num(r.get("50%")), "p90_ms": _num(r.get("90%")), "p99_ms": _num(r.get("99%")),
                "requests": _num(r.get("Total Request Count")), "avg_size": _num(r.get("Total Average Content Size")),
            })
    return out


def read_failures(prefix: Path) -> list[dict[str, Any]]:
    path = Path(f"{prefix}_failures.csv")
    if not path.exists():
        return []
    with path.open() as f:
        return [{"method": r["Method"], "name": r["Name"], "error": r["Error"], "occurrences": int(r["Occurrences"])}
                for r in csv.DictReader(f)]


def _num(v: str | None) -> float | None:
    if v is None or v in ("", "N/A"):
        return None
    try:
        return float(v)
    except ValueError:
        return None


def row(stats: list[dict[str, Any]], type_: str, name: str | None = None) -> dict[str, Any] | None:
    for r in stats:
        if r["type"] == type_ and (name is None or r["name"] == name):
            return r
    return None


# ---- the broker metrics timeline written by loadtest.common
def read_timeline(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return json.loads(path.read_text()).get("points", [])


def hist_of(point: dict[str, Any], key: str = "fire_lag") -> prom.Histogram:
    fl = point.get(key)
    if not fl:
        return prom.Histogram()
    return prom.Histogram({float(b): c for b, c in fl["buckets"]}, fl["sum"], fl["count"])


def counter_delta(points: list[dict[str, Any]], key: str) -> float:
    if len(points) < 2:
        return 0.0
    return points[-1]["counters"].get(key, 0.0) - points[0]["counters"].get(key, 0.0)


def fire_lag_summary(points: list[dict[str, Any]], key: str = "fire_lag") -> dict[str, Any]:
    """Quantiles of a scraped histogram over the run (last scrape minus first)."""
    if len(points) < 2:
        return {"count": 0}
    return (hist_of(points[-1], key) - hist_of(points[0], key)).summary_ms()


def lag_series(points: list[dict[str, Any]], window: int = 2) -> list[dict[str, Any]]:
    """Fire-lag quantiles per window of ``window`` scrape intervals (empty windows skipped)."""
    out = []
    for i in range(window, len(points)):
        h = hist_of(points[i]) - hist_of(points[i - window])
        if h.count <= 0:
            continue
        s = h.summary_ms()
        out.append({"t": points[i]["at"] - points[0]["at"], **s})
    return out


def rate_series(points: list[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    out = []
    for a, b in zip(points, points[1:], strict=False):
        dt = b["at"] - a["at"]
        if dt > 0:
            out.append((b["at"] - points[0]["at"], (b["counters"].get(key, 0.0) - a["counters"].get(key, 0.0)) / dt))
    return out


def items_rate_series(history: list[dict[str, Any]], type_: str, name: str) -> list[tuple[float, float]]:
    """Items/s over time for one request name, from the cumulative count x average content size."""
    pts = [h for h in history if h["type"] == type_ and h["name"] == name and h["requests"] is not None]
    out = []
    if not pts:
        return out
    t0 = pts[0]["at"] or 0.0
    for a, b in zip(pts, pts[1:], strict=False):
        dt = (b["at"] or 0) - (a["at"] or 0)
        if dt <= 0:
            continue
        ia = (a["requests"] or 0) * (a["avg_size"] or 0)
        ib = (b["requests"] or 0) * (b["avg_size"] or 0)
        out.append(((b["at"] or 0) - t0, (ib - ia) / dt))
    return out


# ---- plots
def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_lag(out: Path, points: list[dict[str, Any]], history: list[dict[str, Any]], title: str) -> Path | None:
    series = lag_series(points)
    deliv = [h for h in history if h["type"] == "DELIVERY_LAG" and h["p50_ms"] is not None and (h["requests"] or 0) > 0]
    if not series and not deliv:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    if series:
        t = [s["t"] for s in series]
        for q, style in (("p50_ms", "-"), ("p90_ms", "--"), ("p99_ms", ":")):
            ax.plot(t, [s[q] if s[q] is not None else math.nan for s in series], style, label=f"fire lag {q[:-3]} (broker histogram)")
    if deliv:
        t0 = points[0]["at"] if points else deliv[0]["at"]
        td = [(h["at"] or 0) - (t0 or 0) for h in deliv]
        for q, style in (("p50_ms", "-"), ("p99_ms", ":")):
            ax.plot(td, [h[q] for h in deliv], style, alpha=0.7, label=f"delivery lag {q[:-3]} (consumer, 10 s window)")
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("ms")
    ax.set_yscale("symlog", linthresh=10)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    path = out / "lag_percentiles.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_rates(out: Path, lines: list[tuple[str, list[tuple[float, float]]]], target: float | None, title: str,
               ylabel: str = "per second") -> Path | None:
    lines = [(label, s) for label, s in lines if s]
    if not lines:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for label, s in lines:
        ax.plot([x for x, _ in s], [y for _, y in s], label=label)
    if target:
        ax.axhline(target, color="k", linestyle="--", linewidth=1, label=f"target {target:g}/s")
    ax.set_xlabel("seconds since start")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    path = out / "rates.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_capacity(out: Path, steps: list[dict[str, Any]], slo_ms: float) -> Path | None:
    if not steps:
        return None
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.5))
    x = [s["target_rate"] for s in steps]
    a1.plot(x, [s["schedule_rate"] for s in steps], "o-", label="scheduled/s")
    a1.plot(x, [s["fire_rate"] for s in steps], "s-", label="fired/s")
    a1.plot(x, x, "k--", linewidth=1, label="target")
    a1.set_xlabel("target timers/s")
    a1.set_ylabel("achieved /s")
    a1.legend(fontsize=8)
    a1.grid(True, alpha=0.3)
    for q in ("p50_ms", "p99_ms"):
        a2.plot(x, [s["fire_lag"].get(q) or math.nan for s in steps], "o-", label=f"fire lag {q[:-3]}")
    a2.axhline(slo_ms, color="r", linestyle="--", linewidth=1, label=f"SLO p99 {slo_ms:g} ms")
    a2.set_xlabel("target timers/s")
    a2.set_ylabel("ms")
    a2.set_yscale("log")
    a2.legend(fontsize=8)
    a2.grid(True, alpha=0.3)
    fig.suptitle("capacity: schedule rate stepped up until the fire-lag SLO or the rate breaks")
    path = out / "capacity.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def format_table(headers: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.2f}"
        return str(v)

    cells = [headers] + [[cell(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def stats_table(stats: list[dict[str, Any]]) -> str:
    rows = []
    for r in stats:
        if r["name"] == "Aggregated":
            continue
        per_s = (r["rps"] or 0) * (r["avg_size"] or 0) if (r["avg_size"] or 0) > 0 else None
        label = r["name"] if r["name"].startswith(r["type"] + " ") else f"{r['type']} {r['name']}"
        rows.append([label, int(r["requests"] or 0), int(r["failures"] or 0), r["rps"], per_s,
                     r["p50_ms"], r["p90_ms"], r["p99_ms"], r["max_ms"]])
    return format_table(["request", "count", "fail", "req/s", "items/s", "p50 ms", "p90 ms", "p99 ms", "max ms"], rows)

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
        a2.plot(x, [s["delivery_lag"].get(q) or math.nan for s in steps], "o-", label=f"delivery lag {q[:-3]}")
    a2.plot(x, [s["fire_lag"].get("p99_ms") or math.nan for s in steps], "x:", label="fire lag p99 (at the commit)")
    a2.axhline(slo_ms, color="r", linestyle="--", linewidth=1, label=f"SLO p99 {slo_ms:g} ms")
    a2.set_xlabel("target timers/s")
    a2.set_ylabel("ms")
    a2.set_yscale("log")
    a2.legend(fontsize=8)
    a2.grid(True, alpha=0.3)
    fig.suptitle("capacity: schedule rate stepped up until the delivery-lag SLO or the rate breaks")
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


# ---- failures over time (Locust's history: cumulative failures of the Aggregated row)
def failure_series(prefix: Path) -> list[tuple[float, float]]:
    path = Path(f"{prefix}_stats_history.csv")
    if not path.exists():
        return []
    pts = []
    with path.open() as f:
        for r in csv.DictReader(f):
            if r.get("Name") == "Aggregated":
                at, n = _num(r.get("Timestamp")), _num(r.get("Total Failure Count"))
                if at is not None and n is not None:
                    pts.append((at, n))
    return [(b[0] - pts[0][0], max(0.0, (b[1] - a[1]) / (b[0] - a[0])))
            for a, b in zip(pts, pts[1:], strict=False) if b[0] > a[0]]


def plot_errors(out: Path, series: list[tuple[float, float]], title: str) -> Path | None:
    if not series:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 3))
    ax.plot([x for x, _ in series], [y for _, y in series], color="tab:red", label="failed requests/s")
    ax.set_ylim(bottom=0, top=max(1.0, max(y for _, y in series) * 1.2))
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("per second")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    path = out / "errors.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ---- one-file HTML report: verdict first, then plots, then the machine and the settings
_CSS = """body{font:14px/1.45 system-ui,'DejaVu Sans',sans-serif;margin:24px auto;max-width:1000px;color:#1d2330;padding:0 16px}
h1{font-size:21px;margin:0 0 4px}h2{font-size:17px;margin:26px 0 8px;border-bottom:1px solid #d8dce4}
table{border-collapse:collapse;margin:6px 0 12px}th,td{border:1px solid #d8dce4;padding:3px 9px;text-align:left}
th{background:#eceff4}td.n{text-align:right;font-variant-numeric:tabular-nums}.verdict{font-size:17px;padding:10px 14px;
border-radius:5px;margin:10px 0}.good{background:#e9f7ee;border:1px solid #9ed0ae}.bad{background:#fdecec;border:1px solid #e4a4a4}
.muted{color:#6b7385}img{max-width:100%;border:1px solid #d8dce4;margin:6px 0}pre{background:#f0f2f6;padding:8px;overflow:auto}"""


def _e(v: Any) -> str:
    import html

    return html.escape("-" if v is None else str(v))


def _cell(v: Any) -> str:
    if isinstance(v, float):
        v = f"{v:,.1f}" if abs(v) >= 10 else f"{v:.2f}"
    elif isinstance(v, int) and not isinstance(v, bool):
        v = f"{v:,}"
    cls = ' class="n"' if isinstance(v, str) and v[:1].isdigit() else ""
    return f"<td{cls}>{_e(v)}</td>"


def html_table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_cell(v) for v in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _img(path: str | Path, alt: str) -> str:
    import base64

    p = Path(path)
    if not p.exists():
        return ""
    data = base64.b64encode(p.read_bytes()).decode("ascii")
    return f'<figure><img alt="{_e(alt)}" src="data:image/png;base64,{data}"><figcaption class="muted">{_e(alt)}</figcaption></figure>'


def _lag_rows(s: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for label, key in (("fire lag, broker histogram", "fire_lag"), ("fire lag, per message (createdAt - deliverAt)", "fire_lag_per_message"),
                       ("delivery lag (receipt - deliverAt)", "delivery_lag"), ("sweep cycle (claim + pack + commit)", "sweep_cycle")):
        v = s.get(key) or {}
        if not v:
            continue
        count = v.get("count", v.get("requests"))
        biggest = f"<= {v['max_le_ms']}" if v.get("max_le_ms") is not None else v.get("max_ms")
        rows.append([label, int(count) if count is not None else None, v.get("p50_ms"), v.get("p90_ms"), v.get("p99_ms"), biggest])
    return rows


def _verdict(kind: str, s: dict[str, Any]) -> str:
    if kind == "capacity":
        held, broke, slo = s.get("highest_rate_held"), s.get("broke_at"), s.get("slo_p99_ms")
        if held is not None:
            text = (f"Capacity at the SLO: <b>{held:g} timers/s</b> held delivery-lag p99 &le; {slo:g} ms at the "
                    f"long-polling consumers, with schedule and fire rates within {s.get('hold_fraction', 0):.0%} of "
                    "the target.")
        else:
            text = f"<b>No step held the SLO</b> (delivery-lag p99 &le; {slo:g} ms at the consumers)."
        if s.get("target_rate"):
            text += (f" Target {s['target_rate']:g} timers/s: <b>{'met' if s.get('target_met') else 'missed'}</b>.")
        if s.get("bare_fire_rate"):
            text += f" Bare-SQL fire rate of the server: {s['bare_fire_rate']:,} timers/s"
            text += f" (held {s['held_vs_bare']:.2f}x of it)." if s.get("held_vs_bare") is not None else "."
        if broke:
            text += f" It broke at {broke['target_rate']:g}/s: {_e('; '.join(broke['reasons']))}."
        elif held is not None:
            text += " The last step still held: raise --rates to find the break."
        cls = "good" if held is not None else "bad"
        rows = [[f"{st['target_rate']:g}" + (f" #{st['attempt']}" if st["attempt"] > 1 else ""), st["schedule_rate"],
                 st["fire_rate"], st["fire_lag"].get("p50_ms"), st["fire_lag"].get("p99_ms"),
                 st["delivery_lag"].get("p99_ms"), (st.get("machine") or {}).get("loadavg_1m_end"),
                 "held" if st["held"] else "broke: " + "; ".join(st["reasons"])] for st in s.get("steps", [])]
        return f'<div class="verdict {cls}" id="verdict">{text}</div>' + html_table(
            ["target/s", "scheduled/s", "fired/s", "fire p50 ms", "fire p99 ms", "delivery p99 ms", "load", "step"], rows)
    if kind == "outage_deadlines":
        from loadtest import outage_deadlines as od

        w, d = s["without"], s["with"]
        text = (f"Without deadlines billing made <b>{w['charges']}</b> charges ({w['charged_after_failed']} although the caller "
                f"saw \"failed\"); with <code>deadlineMs</code> it made <b>{d['charges']}</b> and skipped "
                f"{d['expired_skipped']} expired calls unrun. {_e(od.verdict_line(d))}.")
        cls = "bad" if d.get("guarantee") else "good"
        rows = [[label, w.get(key), od.SEED["without"].get(key), d.get(key), od.SEED["with"].get(key)] for key, label in od.ROWS]
        return f'<div class="verdict {cls}" id="verdict">{text}</div>' + html_table(
            ["", "without deadlines", "(seed, 35 s run)", "with deadlineMs", "(seed, 35 s run)"], rows)
    if kind == "recurring":
        from loadtest import recurring as rc

        fl, dl = s["fire_lag_ms"], s["delivery_lag_ms"]
        text = (f"{_e(rc.verdict_line(s))}. Fire lag p50 {_e(fl.get('p50'))} ms, p99 <b>{_e(fl.get('p99'))} ms</b>; "
                f"next occurrence {_e(s.get('next_cost_us_broker'))} us each in the broker.")
        cls = "good" if s["missed"] == 0 and s["doubles"] == 0 and not s["errors"] else "bad"
        rows = [["fire lag (createdAt - occurrence)", fl.get("count"), fl.get("p50"), fl.get("p90"), fl.get("p99"), fl.get("max")],
                ["delivery lag (receipt - occurrence)", dl.get("count"), dl.get("p50"), dl.get("p90"), dl.get("p99"), dl.get("max")]]
        return f'<div class="verdict {cls}" id="verdict">{text}</div>' + html_table(
            ["lag (ms)", "count", "p50", "p90", "p99", "max"], rows) + html_table(
            ["", "value"], [["expected occurrences", s["expected"]], ["received", s["received"]], ["missed", s["missed"]],
                            ["doubled", s["doubles"]], ["next occurrence, us (broker)", s.get("next_cost_us_broker")],
                            ["next occurrence, us (measured here)", s.get("next_cost_us_local")],
                            ["schedule call median, ms", s.get("schedule_call_ms")]])
    if kind == "failover":
        from loadtest import failover as fo

        return fo.html_verdict(s, _e, html_table)
    failed = sum(int(f.get("occurrences", 0)) for f in s.get("failures", []))
    cls = "bad" if failed else "good"
    if kind == "timers_lag":
        fl = s.get("fire_lag") or {}
        text = (f"Scheduled <b>{s.get('schedule_rate', 0):g}</b> timers/s (target {s.get('target_rate', 0):g}) and fired "
                f"<b>{s.get('fire_rate', 0):g}</b>/s; broker fire lag p50 {_e(fl.get('p50_ms'))} ms, "
                f"p99 <b>{_e(fl.get('p99_ms'))} ms</b>; {failed} failed requests.")
        return f'<div class="verdict {cls}" id="verdict">{text}</div>' + html_table(
            ["lag (ms)", "count", "p50", "p90", "p99", "max"], _lag_rows(s))
    if kind == "timers_schedule":
        sch = s.get("schedule") or {}
        best = max((v.get("timers_per_s") or 0 for v in sch.values()), default=0)
        text = f"Up to <b>{best:g} timers/s</b> accepted (best batch size); {failed} failed requests."
        rows = [[n, v.get("requests"), v.get("timers"), v.get("timers_per_s"), v.get("p50_ms"), v.get("p99_ms")] for n, v in sch.items()]
        return f'<div class="verdict {cls}" id="verdict">{text}</div>' + html_table(
            ["ops per call", "calls", "timers", "timers/s", "p50 ms", "p99 ms"], rows)
    kept_up = s.get("consumers_kept_up", True)
    text = (f"Pushed <b>{s.get('push_msgs_per_s', 0):g}</b> msg/s, popped {s.get('pop_msgs_per_s', 0):g}, "
            f"acked {s.get('ack_msgs_per_s', 0):g}; {failed} failed requests. ")
    if kept_up:
        text += f"Consumers kept up ({s.get('acked', 0)} of {s.get('pushed', 0)} pushed messages acknowledged)."
    else:
        text += (f"<b>Consumers did not keep up</b>: {s.get('acked', 0)} of {s.get('pushed', 0)} pushed messages "
                 f"acknowledged; the backlog grew by <b>{s.get('backlog_growth', 0)}</b> messages.")
        cls = "bad"
    return f'<div class="verdict {cls}" id="verdict">{text}</div>'


def _requests_html(s: dict[str, Any]) -> str:
    rows = []
    for r in s.get("requests", []):
        if r["name"] == "Aggregated":
            continue
        label = r["name"] if r["name"].startswith(r["type"] + " ") else f"{r['type']} {r['name']}"
        rows.append([label, int(r["requests"] or 0), int(r["failures"] or 0), r["rps"], r["p50_ms"], r["p99_ms"], r["max_ms"]])
    out = html_table(["request", "count", "failed", "req/s", "p50 ms", "p99 ms", "max ms"], rows) if rows else ""
    fails = s.get("failures") or []
    if fails:
        out += "<h3>Failures</h3>" + html_table(["count", "request", "error"],
                                                [[f["occurrences"], f"{f['method']} {f['name']}", f["error"][:300]] for f in fails[:30]])
    elif rows:
        out += '<p id="no-failures">No request failed.</p>'
    return out


def write_html(out: Path, kind: str, summary: dict[str, Any], settings: dict[str, Any]) -> Path:
    """``<out>/report.html``: one self-contained file (plots inline as base64 PNG, no external reference)."""
    import platform
    import sys
    import time as _time

    plots = [p for p in summary.get("plots", []) if p]
    figures = "".join(_img(p, Path(p).stem.replace("_", " ")) for p in plots)
    m = summary.get("machine") or {}
    cpu_model = ""
    try:
        cpu_model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                          if ln.startswith("model name")), "")
    except OSError:
        pass
    machine_rows = [["CPUs", m.get("cpus")], ["CPU model", cpu_model or None],
                    ["1-min load average at start / end", f"{m.get('loadavg_1m_start')} / {m.get('loadavg_1m_end')}"],
                    ["system", platform.platform()], ["Python", sys.version.split()[0]],
                    ["broker", summary.get("url")]]
    settings_rows = [[k, v] for k, v in sorted(settings.items()) if v not in (None, "", [])]
    body = (
        f"<h1>queen loadtest: {_e(kind)}</h1><p class='muted'>written {_e(_time.strftime('%Y-%m-%d %H:%M:%S %Z'))}</p>"
        f"<h2>Verdict</h2>{_verdict(kind, summary)}"
        + (f"<h2>Plots</h2>{figures}" if figures else "")
        + (f"<h2>Requests and errors</h2>{_requests_html(summary)}" if summary.get("requests") else "")
        + "<h2>Machine</h2>" + html_table(["", ""], machine_rows)
        + "<h2>Settings</h2>" + html_table(["option", "value"], settings_rows)
        + "<p class='muted'>Raw data beside this file: summary.json"
        + (", Locust's CSVs and the broker's metrics timeline" if summary.get("requests") or summary.get("steps") else "")
        + ".</p>"
    )
    page = (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>queen loadtest: {_e(kind)}</title>"
            f"<style>{_CSS}</style></head><body>{body}</body></html>")
    path = out / "report.html"
    path.write_text(page)
    return path

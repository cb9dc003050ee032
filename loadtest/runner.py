"""``queen loadtest``: run a scenario against a broker, write the CSVs, a JSON summary, plots and a
one-file ``report.html`` (verdict first, plots inline, machine and settings).

    queen loadtest SCENARIO [--url U] [--rate R] [--users N] [--duration D] [--out DIR] [--distributed K]
    queen loadtest capacity --slo-p99-ms 50 [--rates 250,500,1000,...] [--step-duration 20]
    queen loadtest timers_lag --rate 1000 -- --partitions 8     (after `--`: Locust / scenario options)

Scenarios: ``timers_lag``, ``timers_schedule``, ``push_pop`` (Locust, headless, in a child process),
``outage_deadlines``, ``recurring`` and ``cells_move`` (asyncio programs, see their module docstrings:
``queen loadtest recurring --schedules 200 --tenants 4 [--mode minute]``; ``cells_move``
starts its own two cells and HAProxy, so it takes no ``--url``: its options go after ``--``). ``failover`` (also asyncio,
loadtest/failover.py) needs ``--url`` and ``--fault-cmd``: ``--users`` producers, schedulers, KV writers
and consumers each, ``--rounds`` faults, every acknowledged write checked afterwards. Without ``--url`` a broker is
started for the run (``broker.process.localserver.LocalBroker``, embedded PostgreSQL in a temporary directory)
and stopped afterwards. Traffic goes only to that broker or to the URL given. Every run is bounded: the
Locust child gets ``-t`` and ``--max-items`` and is killed if it overstays by 90 s (or on Ctrl-C).

``--distributed K`` runs one Locust master and K worker processes on this machine (the same command
lines work across machines: see docs/guides/capacity-planning.md, "Distributed Locust").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from loadtest import report

HERE = Path(__file__).resolve().parent
LOCUST_SCENARIOS = {
    "timers_lag": {"file": "timers_lag.py", "users": 4, "duration": 30},
    "timers_schedule": {"file": "timers_schedule.py", "users": 8, "duration": 30},
    "push_pop": {"file": "push_pop.py", "users": 6, "duration": 30},
}
SCENARIOS = (*LOCUST_SCENARIOS, "outage_deadlines", "capacity", "recurring", "failover", "cells_move")
DEFAULT_CAPACITY_RATES = (100, 250, 500, 1000, 2000, 4000, 6000, 8000, 10000, 12500, 15000, 20000)


# What each scenario cannot run without (push_pop needs only the core wire).
NEEDS: dict[str, tuple[str, ...]] = {"timers_lag": ("timers",), "timers_schedule": ("timers",), "capacity": ("timers",),
                                     "outage_deadlines": ("deadlines",), "push_pop": (), "recurring": ("timers",),
                                     "failover": ("timers",)}


def missing_features(scenario: str, url: str) -> dict[str, str]:
    """{feature: evidence} of the features (timers, deadlines) the broker at ``url`` does not offer, by the
    conformance suite's own probes (conformance/features.py): a broker without timers is told apart from a
    slow one before any load is sent."""
    import httpx

    from conformance.features import probe

    wanted = ("timers", "deadlines") if scenario == "outage_deadlines" else ("timers",)
    out = {}
    with httpx.Client(base_url=url, timeout=10.0) as http:
        for feature in wanted:
            got = probe(feature, http)
            if got.missing:
                out[feature] = got.evidence
    return out


def machine(load_start: tuple[float, float, float] | None = None) -> dict[str, Any]:
    """CPU count and 1-minute load average (at start and now): the context of every number on a shared box."""
    now = os.getloadavg()
    return {"cpus": os.cpu_count(), "loadavg_1m_start": None if load_start is None else round(load_start[0], 2),
            "loadavg_1m_end": round(now[0], 2)}


def machine_line(m: dict[str, Any]) -> str:
    return f"machine: {m['cpus']} CPUs, 1-min load average {m['loadavg_1m_start']} at start, {m['loadavg_1m_end']} at end"


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The options of this run, as the report shows them (command-line values, Locust pass-through)."""
    skip = {"load_start", "duration_given"}
    outage = {"interval", "timeout", "retries", "outage_start", "outage", "drain"}
    cap = {"slo_p99_ms", "rates", "step_duration", "confirm", "hold_fraction"}
    fo = {"fault_cmd", "rounds", "fault_at", "settle"}
    if args.scenario != "failover":
        skip |= fo
    else:
        skip |= cap | (outage - {"drain"}) | {"rate", "distributed", "window_ms", "duration", "broker_workers"}
    if args.scenario not in ("outage_deadlines", "failover"):
        skip |= outage
    else:
        skip |= cap | {"rate", "users", "distributed", "window_ms"}
    if args.scenario != "capacity":
        skip |= cap
    else:
        skip |= {"rate", "users", "duration"}
    if args.scenario not in ("timers_lag", "capacity"):
        skip |= {"rate", "window_ms"}
    rec = {"schedules", "tenants", "mode", "jwt_secret"}
    if args.scenario != "recurring":
        skip |= rec
    else:
        skip |= {"rate", "users", "distributed", "window_ms", "jwt_secret"}
    out = {k: v for k, v in vars(args).items() if k not in skip}
    out["locust_args"] = " ".join(args.locust_args) if getattr(args, "locust_args", None) else None
    return out


# ---- the broker under test
@contextlib.contextmanager
def target(url: str | None, broker_workers: int, log_dir: Path, env: dict[str, str] | None = None,
           server: list[str] | None = None) -> Iterator[str]:
    """Yield the URL to load: the one given, or a local broker started (and stopped) for this run on an
    embedded PostgreSQL this runner starts; then ``server`` (when given) gets that server's admin DSN, for
    the bare-SQL baseline of ``capacity``."""
    if url:
        yield url.rstrip("/")
        return
    from broker.process.localserver import LocalBroker
    from broker.store import embedded

    emb = embedded.start_scratch("queen-loadtest-")  # stop() deletes its directory
    print(f"loadtest: starting a local broker ({broker_workers} workers, embedded PostgreSQL in {emb.scratch})",
          flush=True)
    if server is not None:
        server.append(emb.dsn())
    b = LocalBroker(dsn=emb.dsn(), workers=broker_workers, log_path=log_dir / "broker.log", env=env)
    try:
        b.start(timeout=120)
        yield b.url
    finally:
        b.stop()
        emb.stop()


# ---- one Locust run
def locust_cmd(scenario: str, url: str, users: int, duration: float, prefix: Path, extra: list[str]) -> list[str]:
    spec = LOCUST_SCENARIOS[scenario]
    return [
        sys.executable, "-m", "locust", "-f", str(HERE / spec["file"]), "--headless",
        "-u", str(users), "-r", str(users), "-t", f"{int(round(duration))}s", "--host", url,
        "--csv", str(prefix), "--csv-full-history", "--only-summary", "--stop-timeout", "1",
        "--prom-out", f"{prefix}_metrics.json", "--loglevel", "WARNING", *extra,
    ]


def run_locust(scenario: str, url: str, users: int, duration: float, out: Path, extra: list[str],
               distributed: int = 0) -> int:
    prefix = out / scenario
    cmd = locust_cmd(scenario, url, users, duration, prefix, extra)
    log = open(out / "locust.log", "ab")  # noqa: SIM115 - shared by the child processes, closed below
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    workers: list[subprocess.Popen[bytes]] = []
    proc: subprocess.Popen[bytes] | None = None
    try:
        if distributed > 0:
            from broker.process.localserver import free_port

            port = free_port()
            cmd += ["--master", "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port),
                    "--expect-workers", str(distributed), "--expect-workers-max-wait", "60"]
            master = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            for _ in range(distributed):
                workers.append(subprocess.Popen(
                    [sys.executable, "-m", "locust", "-f", str(HERE / LOCUST_SCENARIOS[scenario]["file"]), "--worker",
                     "--master-host", "127.0.0.1", "--master-port", str(port), "--loglevel", "WARNING"],
                    stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
            proc = master
        else:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=duration + 90)
        except subprocess.TimeoutExpired:
            print(f"loadtest: locust overstayed {duration + 90:.0f} s; stopping it", file=sys.stderr)
            _kill(proc)
            rc = -1
        for w in workers:
            try:
                w.wait(timeout=20)
            except subprocess.TimeoutExpired:
                _kill(w)
        return rc
    finally:
        # Children run in their own sessions (a Ctrl-C here does not reach them): stop what is left.
        for p in [*workers, *([proc] if proc is not None else [])]:
            if p.poll() is None:
                _kill(p)
        log.close()


def _kill(p: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGTERM)
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=5)


def timers_lag_args(rate: float, window_ms: int, users: int, duration: float) -> list[str]:
    """Scenario options of timers_lag. Total users and the scheduling time are explicit because a
    distributed worker receives only the scenario's own options from the master, not -u or -t."""
    return ["--timer-rate", str(rate), "--window-ms", str(window_ms), "--total-users", str(users),
            "--schedule-seconds", str(schedule_seconds(duration, window_ms))]


def schedule_seconds(duration: float, window_ms: int) -> float:
    return max(1.0, duration - window_ms / 1000.0 - 2.0)


# ---- summaries per scenario
def summarize_timers_lag(out: Path, target_rate: float, duration: float, window_ms: int) -> dict[str, Any]:
    prefix = out / "timers_lag"
    stats = report.read_stats(prefix)
    points = report.read_timeline(Path(f"{prefix}_metrics.json"))
    sched_s = schedule_seconds(duration, window_ms)
    sched = report.row(stats, "POST", "POST /api/v1/timers") or {}
    fire = report.row(stats, "FIRE_LAG") or {}
    deliv = report.row(stats, "DELIVERY_LAG") or {}
    scheduled = int(sched.get("items") or 0)
    fired = report.counter_delta(points, "queen_timers_fired_total")
    received = int(deliv.get("requests") or 0)
    return {
        "scenario": "timers_lag",
        "target_rate": target_rate,
        "schedule_seconds": sched_s,
        "scheduled": scheduled,
        "schedule_rate": round(scheduled / sched_s, 1),
        "fired": int(fired),
        "fire_rate": round(fired / sched_s, 1),
        "received": received,
        "schedule_failures": int(sched.get("failures") or 0),
        "schedule_request_ms": {k: sched.get(k) for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms")},
        "fire_lag": report.fire_lag_summary(points),
        # where the time goes when the fire falls behind: one sweep cycle (claim + pack + commit)
        "sweep_cycle": report.fire_lag_summary(points, "sweep_cycle"),
        "fire_lag_per_message": {k: fire.get(k) for k in ("requests", "p50_ms", "p90_ms", "p99_ms", "max_ms")},
        "delivery_lag": {k: deliv.get(k) for k in ("requests", "p50_ms", "p90_ms", "p99_ms", "max_ms")},
    }


def lag_table(s: dict[str, Any]) -> str:
    fl, pm, dl, sc = s["fire_lag"], s["fire_lag_per_message"], s["delivery_lag"], s.get("sweep_cycle", {})
    rows = [
        ["fire lag, broker histogram", fl.get("count"), fl.get("p50_ms"), fl.get("p90_ms"), fl.get("p99_ms"),
         f"<= {fl.get('max_le_ms')}" if fl.get("max_le_ms") is not None else None],
        ["fire lag, createdAt - deliverAt", int(pm.get("requests") or 0), pm.get("p50_ms"), pm.get("p90_ms"), pm.get("p99_ms"), pm.get("max_ms")],
        ["delivery lag, receipt - deliverAt", int(dl.get("requests") or 0), dl.get("p50_ms"), dl.get("p90_ms"), dl.get("p99_ms"), dl.get("max_ms")],
    ]
    t = report.format_table(["lag (ms)", "count", "p50", "p90", "p99", "max"], rows)
    return (t + f"\ntarget {s['target_rate']:g}/s: scheduled {s['scheduled']} ({s['schedule_rate']:g}/s over "
            f"{s['schedule_seconds']:g} s), fired {s['fired']} ({s['fire_rate']:g}/s), received {s['received']}, "
            f"schedule failures {s['schedule_failures']}"
            f"\nsweep cycles: {sc.get('count', 0)}, duration p50 {sc.get('p50_ms')} ms, p99 {sc.get('p99_ms')} ms")


def write_locust_report(scenario: str, out: Path, args: argparse.Namespace, url: str, rc: int) -> dict[str, Any]:
    prefix = out / scenario
    stats = report.read_stats(prefix)
    history = report.read_history(prefix)
    points = report.read_timeline(Path(f"{prefix}_metrics.json"))
    summary: dict[str, Any] = {"scenario": scenario, "url": url, "users": args.users, "duration_s": args.duration,
                               "locust_exit_code": rc, "requests": stats, "failures": report.read_failures(prefix)}
    plots = []
    if scenario == "timers_lag":
        summary.update(summarize_timers_lag(out, args.rate, args.duration, args.window_ms))
        plots.append(report.plot_lag(out, points, history, f"timers_lag at {args.rate:g} timers/s"))
        plots.append(report.plot_rates(out, [
            ("scheduled/s (accepted by the broker)", report.items_rate_series(history, "POST", "POST /api/v1/timers")),
            ("fired/s (queen_timers_fired_total)", report.rate_series(points, "queen_timers_fired_total")),
        ], args.rate, "timers_lag: achieved vs target rate", "timers per second"))
    elif scenario == "timers_schedule":
        lines = [(f"{n}-op batches: timers/s", report.items_rate_series(history, "POST", f"POST /api/v1/timers [{n}]"))
                 for n in (1, 16, 256)]
        plots.append(report.plot_rates(out, lines, None, "timers_schedule: timers accepted per second", "timers per second"))
        per_batch = {}
        for n in (1, 16, 256):
            r = report.row(stats, "POST", f"POST /api/v1/timers [{n}]") or {}
            per_batch[str(n)] = {"requests": r.get("requests"), "timers": r.get("items"),
                                 "timers_per_s": round((r.get("rps") or 0) * (r.get("avg_size") or 0), 1),
                                 "p50_ms": r.get("p50_ms"), "p99_ms": r.get("p99_ms")}
        summary["schedule"] = per_batch
        c = report.row(stats, "DELETE") or {}
        summary["cancel"] = {"requests": c.get("requests"), "failures": c.get("failures"), "rps": c.get("rps"),
                             "p50_ms": c.get("p50_ms"), "p99_ms": c.get("p99_ms")}
    elif scenario == "push_pop":
        push = next((r for r in stats if r["name"].startswith("POST /api/v1/push")), {})
        pop = report.row(stats, "GET", "GET /api/v1/pop") or {}
        ack = report.row(stats, "POST", "POST /api/v1/ack/batch") or {}
        summary["push_msgs_per_s"] = round((push.get("rps") or 0) * (push.get("avg_size") or 0), 1)
        summary["pop_msgs_per_s"] = round((pop.get("rps") or 0) * (pop.get("avg_size") or 0), 1)
        summary["ack_msgs_per_s"] = round((ack.get("rps") or 0) * (ack.get("avg_size") or 0), 1)
        summary.update(backlog_verdict(push, ack, args.duration))
        plots.append(report.plot_rates(out, [
            ("pushed msgs/s", report.items_rate_series(history, "POST", push.get("name", ""))),
            ("popped msgs/s", report.items_rate_series(history, "GET", "GET /api/v1/pop")),
            ("acked msgs/s", report.items_rate_series(history, "POST", "POST /api/v1/ack/batch")),
        ], None, "push_pop: messages per second", "messages per second"))
    plots.append(report.plot_errors(out, report.failure_series(prefix), f"{scenario}: failed requests per second"))
    summary["plots"] = [str(p) for p in plots if p]
    summary["machine"] = machine(args.load_start)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    summary["report"] = str(report.write_html(out, scenario, summary, settings(args)))
    print(f"\n== {scenario}: {url}, {args.users} users, {args.duration:g} s ==")
    print(machine_line(summary["machine"]))
    print(report.stats_table(stats))
    if scenario == "timers_lag":
        print()
        print(lag_table(summary))
    elif scenario == "push_pop":
        print(f"\npush {summary['push_msgs_per_s']:g} msg/s, pop {summary['pop_msgs_per_s']:g} msg/s, "
              f"ack {summary['ack_msgs_per_s']:g} msg/s")
        print(backlog_line(summary))
    if summary["failures"]:
        print("\nfailures:")
        for f in summary["failures"][:10]:
            print(f"  {f['occurrences']:>6} x {f['method']} {f['name']}: {f['error'][:160]}")
    print(f"\nwritten: {out}/ (report.html, CSV, summary.json, {', '.join(Path(p).name for p in summary['plots']) or 'no plots'})")
    return summary


# Consumers kept up when they acknowledged at least this share of what was pushed during the run: the rest
# is the backlog the run left behind (messages in flight at the end, under a lease or in a pop, are a
# few batches, far below 5 % of any run long enough to measure).
KEPT_UP_SHARE = 0.95


def backlog_verdict(push: dict[str, Any], ack: dict[str, Any], duration: float) -> dict[str, Any]:
    """push_pop's verdict: did the consumers keep up? (pushed, acked, backlog growth in messages and msg/s).
    A run with no failed request can still leave a growing backlog: that is a broker (or a consumer) that
    cannot take what is pushed, and the verdict says so."""
    pushed = int(push.get("items") or 0)
    acked = int(ack.get("items") or 0)
    growth = max(0, pushed - acked)
    return {"pushed": pushed, "acked": acked, "backlog_growth": growth,
            "backlog_growth_per_s": round(growth / duration, 1) if duration else None,
            "consumers_kept_up": pushed == 0 or acked >= KEPT_UP_SHARE * pushed}


def backlog_line(s: dict[str, Any]) -> str:
    if s["consumers_kept_up"]:
        return f"consumers kept up: {s['acked']} of {s['pushed']} pushed messages acknowledged"
    return (f"CONSUMERS DID NOT KEEP UP: {s['acked']} of {s['pushed']} pushed messages acknowledged, the backlog "
            f"grew by {s['backlog_growth']} messages")


def step_reasons(s: dict[str, Any], rate: float, slo_p99_ms: float, hold_fraction: float) -> list[str]:
    """Why a capacity step broke (empty: it held). Judged where the user is, at the long-polling
    consumers: the delivery-lag p99; then the achieved schedule and fire rates against the target."""
    reasons = []
    deliv = s["delivery_lag"].get("p99_ms")
    if s["fire_lag"].get("p99_ms") is None:
        reasons.append("no timer fired")
    elif deliv is None:
        reasons.append("no timer reached the consumers")
    elif deliv > slo_p99_ms:
        reasons.append(f"delivery-lag p99 {deliv:g} ms > SLO {slo_p99_ms:g} ms")
    if s["schedule_rate"] < hold_fraction * rate:
        reasons.append(f"scheduled {s['schedule_rate']:g}/s < {hold_fraction:.0%} of target")
    if s["fire_rate"] < hold_fraction * rate:
        reasons.append(f"fired {s['fire_rate']:g}/s < {hold_fraction:.0%} of target")
    return reasons


def _capacity_step(args: argparse.Namespace, url: str, out: Path, rate: float, attempt: int) -> dict[str, Any]:
    step_out = out / (f"step-{int(rate)}" + (f"-retry{attempt}" if attempt else ""))
    step_out.mkdir(parents=True, exist_ok=True)
    users = max(2, min(16, int(rate // 250) + 2))
    extra = timers_lag_args(rate, args.window_ms, users, args.step_duration)
    load_start = os.getloadavg()
    rc = run_locust("timers_lag", url, users, args.step_duration, step_out, extra)
    s = summarize_timers_lag(step_out, rate, args.step_duration, args.window_ms)
    reasons = step_reasons(s, rate, args.slo_p99_ms, args.hold_fraction)
    step = {"target_rate": rate, "attempt": attempt + 1, "users": users, "locust_exit_code": rc, "held": not reasons,
            "reasons": reasons, **{k: s[k] for k in ("schedule_rate", "fire_rate", "scheduled", "fired", "fire_lag",
                                                    "delivery_lag", "sweep_cycle", "schedule_failures")},
            "machine": machine(load_start)}
    fl, sc = s["fire_lag"], s["sweep_cycle"]
    print(f"capacity: {rate:>7g}/s{' (again)' if attempt else ''}  scheduled {s['schedule_rate']:>8g}/s  "
          f"fired {s['fire_rate']:>8g}/s  fire lag p50 {fl.get('p50_ms')} p99 {fl.get('p99_ms')} ms  "
          f"delivery lag p99 {s['delivery_lag'].get('p99_ms')} ms  "
          f"sweep cycle p99 {sc.get('p99_ms')} ms  load {step['machine']['loadavg_1m_end']}  "
          f"-> {'held' if not reasons else 'BROKE: ' + '; '.join(reasons)}",
          flush=True)
    return step


# ---- capacity
BARE_FIRE_ROWS = 20_000


def bare_fire(server: str | None) -> float | None:
    """The bare-SQL fire rate (timers/s) of the broker's PostgreSQL server, in a scratch migrated database:
    due rows locked, deleted and pushed into the log 1,000 a statement on one connection
    (bench/baseline.py). None without a server DSN."""
    if not server:
        return None
    import asyncio

    from bench.baseline import bare_fire_rate
    from bench.db import new_migrated_db

    async def go() -> float:
        return await bare_fire_rate(await new_migrated_db(server, "capacity_bare"), BARE_FIRE_ROWS)

    return asyncio.run(go())


def capacity(args: argparse.Namespace, url: str, out: Path, server: str | None = None) -> dict[str, Any]:
    rates = [float(x) for x in args.rates.split(",")] if args.rates else list(DEFAULT_CAPACITY_RATES)
    bare = bare_fire(args.bare_dsn or server)
    if bare is not None:
        print(f"capacity: bare-SQL fire rate of this server {bare:,.0f} timers/s ({BARE_FIRE_ROWS:,} due rows, "
              "1,000 a statement, one connection)", flush=True)
    steps: list[dict[str, Any]] = []
    held: dict[str, Any] | None = None
    broke: dict[str, Any] | None = None
    for rate in rates:
        step = None
        for attempt in range(1 + max(0, args.confirm)):
            step = _capacity_step(args, url, out, rate, attempt)
            steps.append(step)
            if step["held"]:
                break  # a step that breaks is re-run (--confirm) before it counts: the machine may be shared
        assert step is not None
        if not step["held"]:
            broke = step
            break
        held = step
    best = held["target_rate"] if held else None
    result = {"slo_p99_ms": args.slo_p99_ms, "hold_fraction": args.hold_fraction, "step_duration_s": args.step_duration,
              "highest_rate_held": best, "broke_at": broke, "steps": steps, "url": url,
              "target_rate": args.target_rate, "target_met": best is not None and best >= args.target_rate,
              "bare_fire_rate": round(bare) if bare is not None else None,
              "held_vs_bare": round(best / bare, 3) if best is not None and bare else None}
    plot = report.plot_capacity(out, steps, args.slo_p99_ms)
    result["plots"] = [str(plot)] if plot else []
    result["machine"] = machine(args.load_start)
    (out / "summary.json").write_text(json.dumps(result, indent=2, default=str))
    report.write_html(out, "capacity", result, settings(args))
    rows = [[f"{s['target_rate']:g}" + (f" #{s['attempt']}" if s["attempt"] > 1 else ""), s["schedule_rate"], s["fire_rate"], s["fire_lag"].get("p50_ms"),
             s["fire_lag"].get("p99_ms"), s["delivery_lag"].get("p99_ms"), s["sweep_cycle"].get("p99_ms"),
             "held" if s["held"] else "broke"] for s in steps]
    print()
    print(report.format_table(["target/s", "scheduled/s", "fired/s", "fire p50 ms", "fire p99 ms", "deliv p99 ms",
                               "cycle p99 ms", ""], rows))
    if held:
        print(f"\nhighest schedule rate that held the SLO (delivery-lag p99 at the consumers <= {args.slo_p99_ms:g} ms, "
              f"rates within {args.hold_fraction:.0%}): {held['target_rate']:g} timers/s")
    else:
        print(f"\nno step held the SLO (delivery-lag p99 at the consumers <= {args.slo_p99_ms:g} ms)")
    print(f"target: >= {args.target_rate:g} timers/s held: {'MET' if result['target_met'] else 'missed'}"
          + (f"; held {result['held_vs_bare']:.2f}x the bare-SQL fire rate ({bare:,.0f}/s)"
             if result["held_vs_bare"] is not None and bare else
             "" if bare else "; bare-SQL fire rate n/a (give --bare-dsn, the broker's PostgreSQL server)"))
    if broke:
        print(f"broke at {broke['target_rate']:g}/s: {'; '.join(broke['reasons'])}")
    elif held:
        print("the last step still held: raise --rates to find the break")
    print(machine_line(result["machine"]))
    print(f"written: {out}/ (report.html, summary.json, capacity.png, one directory per step)")
    return result


def _finish(args: argparse.Namespace, kind: str, url: str, out: Path, result: dict[str, Any], title: str,
            table: Callable[[dict[str, Any]], str]) -> dict[str, Any]:
    """What every asyncio scenario does with its result: the machine's context and the URL added, written as
    summary.json and report.html (verdict first), and its table printed."""
    result["machine"] = machine(args.load_start)
    result["url"] = url
    (out / "summary.json").write_text(json.dumps(result, indent=2, default=str))
    report.write_html(out, kind, result, settings(args))
    print(f"\n== {kind}: {title} ==")
    print(table(result))
    print(machine_line(result["machine"]))
    print(f"\nwritten: {out}/report.html and summary.json")
    return result


def run_outage(args: argparse.Namespace, url: str, out: Path) -> dict[str, Any]:
    from loadtest import outage_deadlines as od

    p = od.Params(url=url, interval=args.interval, duration=args.duration if args.duration_given else 35.0,
                  timeout=args.timeout, retries=args.retries, outage_start=args.outage_start, outage=args.outage,
                  drain=args.drain, margin=args.margin)
    result = od.run_both(p)
    return _finish(args, "outage_deadlines", url, out, result, url, od.table)


def run_recurring(args: argparse.Namespace, url: str, out: Path) -> dict[str, Any]:
    from loadtest import recurring as rc

    p = rc.Params(url=url, schedules=args.schedules, tenants=args.tenants, mode=args.mode,
                  duration=args.duration if args.duration_given else 20.0, jwt_secret=args.jwt_secret)
    result = rc.run(p)
    return _finish(args, "recurring", url, out, result, url, rc.table)


def run_failover(args: argparse.Namespace, url: str, out: Path) -> dict[str, Any]:
    from loadtest import failover as fo

    p = fo.Params(url=url, fault_cmd=args.fault_cmd, rounds=args.rounds, fault_at=args.fault_at, settle=args.settle,
                  producers=args.users, schedulers=args.users, kv_writers=args.users, consumers=args.users,
                  drain=args.drain, token=os.environ.get("QUEEN_TOKEN", ""))
    result = fo.run(p)
    return _finish(args, "failover", url, out, result, f"{url}, fault: {args.fault_cmd}", fo.table)


# ---- command line
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="queen loadtest", description="Load and capacity harness (Locust).",
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("scenario", choices=SCENARIOS)
    ap.add_argument("--url", help="broker to load (default: start a local one with embedded PostgreSQL)")
    ap.add_argument("--rate", type=float, default=1000.0, help="timers_lag: target timers scheduled per second")
    ap.add_argument("--users", type=int, help="Locust users (default per scenario)")
    ap.add_argument("--duration", type=float, help="seconds (default per scenario; outage_deadlines: 35)")
    ap.add_argument("--out", help="report directory (default loadtest-out/<scenario>-<time>)")
    ap.add_argument("--distributed", type=int, default=0, metavar="K", help="one Locust master and K worker processes")
    ap.add_argument("--broker-workers", type=int, default=2, help="worker processes of the local broker")
    ap.add_argument("--window-ms", type=int, default=2000, help="timers_lag/capacity: delays spread over this window")
    # capacity
    ap.add_argument("--slo-p99-ms", type=float, default=50.0,
                    help="capacity: SLO on the delivery-lag p99 at the long-polling consumers (fire lag is shown beside)")
    ap.add_argument("--target-rate", type=float, default=15000.0,
                    help="capacity: the rate the run is judged against (printed MET or missed)")
    ap.add_argument("--bare-dsn", default=None,
                    help="capacity: admin DSN of the broker's PostgreSQL server, for the bare-SQL fire rate printed "
                         "beside the result (default: the embedded server of a broker this runner starts)")
    ap.add_argument("--rates", default="", help="capacity: comma-separated rates to step through")
    ap.add_argument("--step-duration", type=float, default=20.0, help="capacity: seconds per step")
    ap.add_argument("--confirm", type=int, default=1, help="capacity: re-run a breaking step this many times before it counts")
    ap.add_argument("--hold-fraction", type=float, default=0.95,
                    help="capacity: achieved rates must reach this fraction of the target")
    # outage_deadlines
    ap.add_argument("--interval", type=float, default=0.2, help="outage_deadlines: seconds between orders")
    ap.add_argument("--timeout", type=float, default=2.0, help="outage_deadlines: caller timeout (= deadline) s")
    ap.add_argument("--retries", type=int, default=1, help="outage_deadlines: retries after a timeout")
    ap.add_argument("--outage-start", type=float, default=7.5, help="outage_deadlines: billing stops at (s)")
    ap.add_argument("--outage", type=float, default=20.0, help="outage_deadlines: billing stays down for (s)")
    ap.add_argument("--drain", type=float, default=15.0, help="outage_deadlines: longest wait for the backlog (s)")
    ap.add_argument("--margin", type=float, default=0.25,
                    help="outage_deadlines: billing charges only while the deadline is this many seconds away")
    # recurring
    ap.add_argument("--schedules", type=int, default=100, help="recurring: schedules (spread over the tenants)")
    ap.add_argument("--tenants", type=int, default=4, help="recurring: tenants (needs --jwt-secret with --url)")
    ap.add_argument("--mode", choices=("second", "minute"), default="second",
                    help="recurring: every second (* * * * * *) or every minute (* * * * *: give --duration >= 180)")
    ap.add_argument("--jwt-secret", default=None,
                    help="recurring: the broker's QUEEN_JWT_SECRET, to mint one token per tenant (a local broker "
                         "gets one of its own)")
    # failover
    ap.add_argument("--fault-cmd", default="", help="failover: shell command that injects the fault (required)")
    ap.add_argument("--rounds", type=int, default=1, help="failover: faults injected, one after the other")
    ap.add_argument("--fault-at", type=float, default=5.0, help="failover: seconds of steady load before each fault")
    ap.add_argument("--settle", type=float, default=5.0,
                    help="failover: seconds of successful writes after a fault before the next round")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    passthrough: list[str] = []
    if "--" in argv:  # everything after `--` goes to Locust / the scenario's own options
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1:]
    args = build_parser().parse_args(argv)
    args.locust_args = passthrough
    args.duration_given = args.duration is not None
    args.load_start = os.getloadavg()
    if args.scenario == "failover" and not (args.url and args.fault_cmd):
        print("loadtest failover: needs --url (a broker on the database that fails over) and --fault-cmd "
              "(the shell command that injects the fault, e.g. \"queen cluster kill-primary\")", file=sys.stderr)
        return 2
    spec = LOCUST_SCENARIOS.get(args.scenario, {"users": 2 if args.scenario == "failover" else 4, "duration": 30})
    args.users = args.users or spec["users"]
    args.duration = float(args.duration or spec["duration"])
    out = Path(args.out or f"loadtest-out/{args.scenario}-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.scenario == "cells_move":
        from loadtest import cells_move

        if args.url:
            print("loadtest: cells_move starts its own two cells and proxy; it takes no --url", file=sys.stderr)
            return 2
        return cells_move.main([*args.locust_args, "--json", str(out / "summary.json")])
    env = None
    if args.scenario == "recurring" and not args.url and not args.jwt_secret:
        args.jwt_secret = uuid.uuid4().hex + uuid.uuid4().hex  # the local broker authenticates: one tenant per token
    if args.scenario == "recurring" and not args.url:
        env = {"QUEEN_JWT_SECRET": args.jwt_secret}
    server: list[str] = []
    with target(args.url, args.broker_workers, out, env, server) as url:
        missing = missing_features(args.scenario, url)
        for feature, evidence in missing.items():
            # one line, then what can run: a scenario that is nothing but this feature cannot
            print(f"loadtest: the broker at {url} offers no {feature} ({evidence}): "
                  + (f"{args.scenario} cannot run" if feature in NEEDS.get(args.scenario, ())
                     else f"{args.scenario} does not need them, running it"),
                  flush=True)
        if any(f in NEEDS.get(args.scenario, ()) for f in missing):
            return 2
        if args.scenario == "recurring":
            result = run_recurring(args, url, out)
            return 0 if result["missed"] == 0 and result["doubles"] == 0 else 1
        if args.scenario == "capacity":
            result = capacity(args, url, out, server[0] if server else None)
            return 0 if result["steps"] else 1
        if args.scenario == "failover":
            result = run_failover(args, url, out)
            return 0 if result["verdict"] == "PASS" else 1
        if args.scenario == "outage_deadlines":
            result = run_outage(args, url, out)
            return 1 if result["with"]["guarantee"] else 0  # the deadline guarantee is asserted, not just shown
        extra = list(args.locust_args)
        if args.scenario == "timers_lag":
            extra = [*timers_lag_args(args.rate, args.window_ms, args.users, args.duration), *extra]
        rc = run_locust(args.scenario, url, args.users, args.duration, out, extra, args.distributed)
        summary = write_locust_report(args.scenario, out, args, url, rc)
        if not summary["requests"]:
            print(f"loadtest: Locust wrote no statistics (exit code {rc}); see {out}/locust.log", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""bench/bench_shapes.py: its message-by-message loss/duplicate check, the group spread, and a quick run
through ``queen bench shapes`` against our broker only (a few seconds of load)."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from array import array
from pathlib import Path

import pytest
from conftest import uniq

from bench.bench_shapes import (
    BY_NAME,
    SHAPES,
    Meter,
    Row,
    Target,
    _sweep,
    check_ids,
    connections,
    median_run,
    report,
    spread_p99,
    table,
)
from bench.httpconn import host_port

ROOT = Path(__file__).resolve().parents[1]


def test_check_ids_counts_lost_duplicated_unconfirmed_and_phantom_per_group() -> None:
    # ids 0..5: 0-3 confirmed, 4 failed (unconfirmed), 5 never sent (status 0)
    status = bytes([1, 1, 1, 1, 2, 0])
    counts = {
        "g0": bytes([1, 1, 1, 1, 0, 0]),  # all confirmed delivered once
        "g1": bytes([1, 0, 2, 1, 1, 1, 1]),  # 1 lost, 2 duplicated, 4 (failed push) delivered: fine,
        # 5 (never sent) and 6 (beyond what was sent) delivered: phantoms
    }
    assert check_ids(status, counts) == (1, 1, 1, 2)
    assert check_ids(status, {"g": bytes([1, 1])}) == (2, 0, 1, 0)  # a short count array: the rest lost


def test_spread_is_latest_minus_earliest_group_over_messages_every_group_got() -> None:
    a = array("d", [10.0, 20.0, 30.0])
    b = array("d", [10.002, 20.0, 0.0])  # message 2 never reached g1: not in the spread
    assert spread_p99({"g0": a.tobytes(), "g1": b.tobytes()}) == pytest.approx(2.0, abs=1e-6)
    assert spread_p99({"g0": a.tobytes()}) != spread_p99({"g0": a.tobytes()})  # one group: nan


def test_cpu_used_is_each_process_own_growth_never_negative_when_one_exits() -> None:
    """A process that had used a lot before the phase and exits during it (an autovacuum worker) must not
    subtract its past from the phase: each process counts what it used since the start, or since it
    started; one that exited counts what it had used when last seen."""
    start = {(10, 1.0): 30.0, (11, 1.0): 5.0, (12, 1.0): 2.0}
    seen = {**start}
    seen.update({(11, 1.0): 5.5, (12, 1.0): 3.0, (13, 2.0): 1.0})  # a sample: 10 has exited, 13 is new
    seen.update({(11, 1.0): 6.0, (12, 1.0): 3.5})  # the last look: 13 has exited too
    assert Meter.used(start, seen) == 0.0 + 1.0 + 1.5 + 1.0
    assert Meter.used(start, {(10, 3.0): 0.5}) == 0.5  # pid 10 reused by a new process: counted whole


@pytest.mark.timeout(240)
def test_quick_run_against_our_broker_prints_every_row_with_its_id_checks(pg) -> None:  # type: ignore[no-untyped-def]
    rows = ("part_11", "groups_5", "long", "ack_single")
    env = {k: v for k, v in os.environ.items() if k != "QUEEN_BENCH_CPP_BIN"}
    env["QUEEN_BENCH_DATABASE_URL"] = pg.admin_dsn
    out = subprocess.run(
        [sys.executable, "-m", "broker", "bench", "shapes", "--quick", "--seconds", "1", "--long-seconds", "1.5",
         "--drain", "3", "--producers", "4", "--consumers", "2", "--group-consumers", "1", "--only", *rows],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=220)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "C++ Queen: not given" in text and "synchronous_commit" in text, text[:2000]
    for row in rows:
        line = next((ln for ln in text.splitlines() if ln.strip().startswith(f"{row} ") and " ours " in ln), None)
        assert line is not None, text[-3000:]
        m = re.search(r"lost (\d+) dup (\d+) \(checked ([\d,]+) ids", line)
        assert m, line
        assert (m[1], m[2]) == ("0", "0"), line
        assert int(m[3].replace(",", "")) > 0, line  # some messages went through and were checked
        assert re.search(r"gen \d+\.\d\d cores", line), line
        assert f"{row:11s} verdict: " in text
    assert "group spread p99" in text and "p99 first/last third" in text and "ack p50/p99" in text
    table = [ln for ln in text.splitlines() if ln.startswith("| ")]
    assert table[0].startswith("| row | push msg/s"), table
    assert [t.split(" | ")[0][2:] for t in table[1:]] == list(rows), table


async def test_closing_sweep_says_whether_it_finished_so_an_unreached_message_is_not_called_lost(broker, http) -> None:  # type: ignore[no-untyped-def]
    """The closing sweep pops until every queue answers empty twice. Stopped before that (out of time, or a
    pop failed), it says so: what it did not reach may still be queued, and the row marks its lost count
    unverified instead of calling those messages lost."""
    q = uniq("sweep")
    items = [{"queue": q, "partition": "p", "payload": {"id": i, "t": 0.0}} for i in range(3)]
    assert http.post("/api/v1/push", json={"items": items}).status_code in (200, 201)
    host, port = host_port(broker.url)
    counts = {None: bytearray()}
    assert await _sweep(host, port, [q], [None], counts, time.monotonic() - 1) == (0, False)  # out of time
    assert await _sweep(host, port, [q], [None], counts, time.monotonic() + 20) == (3, True)
    got = bytes(counts[None])  # grown in chunks: ids 0..2 once each, nothing else
    assert got[:3] == bytes([1, 1, 1]) and not any(got[3:])


def test_a_lost_count_the_sweep_did_not_finish_checking_is_printed_marked() -> None:
    row = Row(shape=SHAPES[0], broker="cpp")
    assert row.lost_text == "0"
    row.lost = 600
    assert row.lost_text == "600"
    row.sweep_cut = True
    assert row.lost_text == "600?"
    row.lost = 0
    assert row.lost_text == "0"  # nothing counted lost: nothing to mark


def test_rows_run_the_reference_suites_connection_counts_unless_told_otherwise() -> None:
    ref = argparse.Namespace(producers=None, consumers=None, group_consumers=None)
    # the partition axis: 5 x 100 producers and 2 x 50 consumers; every other axis 50 and 50, each group 50
    for n in (2, 11, 101, 1001, 10001):
        assert connections(BY_NAME[f"part_{n}"], ref) == (500, 100)
    for name in ("batch_1", "batch_10", "batch_100", "queues_1", "queues_10", "long", "groups_1", "groups_10"):
        assert connections(BY_NAME[name], ref) == (50, 50), name
    given = argparse.Namespace(producers=20, consumers=10, group_consumers=4)
    assert connections(BY_NAME["part_11"], given) == (20, 10)
    assert connections(BY_NAME["groups_5"], given) == (20, 4)  # a group's count is --group-consumers
    few = argparse.Namespace(producers=None, consumers=3, group_consumers=None)
    assert connections(BY_NAME["queues_10"], few) == (50, 10)  # at least one consumer on each queue
    assert connections(BY_NAME["groups_5"], few) == (50, 50)


def _runs(target: Target, shape_name: str, rates: list[float]) -> None:
    """Runs of a row with these push rates; every other figure ours' better (lower) than the C++ Queen's."""
    cost = 1.0 if target.name == "ours" else 2.0
    target.runs[shape_name] = [Row(shape=BY_NAME[shape_name], broker=target.name, push_rate=r, pop_rate=r, push_p99=cost,
                                   e2e_p99=cost, cpu_broker=cost, cpu_pg=cost) for r in rates]


def test_repeated_rows_show_their_median_run_the_lower_middle_of_an_even_count() -> None:
    assert median_run([3.0, 1.0, 2.0]) == 2
    assert median_run([2.0, 1.0]) == 1  # of two, the worse: never an average no run produced
    assert median_run([5.0]) == 0
    ours, cpp = Target("ours", "", Meter(None, "", None)), Target("cpp", "", Meter(None, "", None))
    _runs(ours, "batch_1", [3000.0, 2000.0, 2400.0])
    _runs(cpp, "batch_1", [1500.0, 1000.0, 2000.0])  # ratios 2.0, 2.0, 1.2: the median is a 2.0 run
    report([ours, cpp], BY_NAME["batch_1"], None)
    picked = ours.rows["batch_1"]
    assert picked.push_rate / cpp.rows["batch_1"].push_rate == 2.0
    assert cpp.rows["batch_1"] is cpp.runs["batch_1"][ours.runs["batch_1"].index(picked)]  # the same run's pair
    line = table([ours, cpp], [BY_NAME["batch_1"]])[2]
    assert "3 runs, push ours/C++: 2.00x, 2.00x, 1.20x" in line and line.endswith("| MEETS targets |"), line


def test_a_loss_in_any_repeat_fails_the_row_even_when_the_median_run_lost_nothing() -> None:
    ours, cpp = Target("ours", "", Meter(None, "", None)), Target("cpp", "", Meter(None, "", None))
    _runs(ours, "batch_10", [3000.0, 3000.0, 3000.0])
    ours.runs["batch_10"][0].lost = 2  # the first run (not the median) lost two confirmed messages
    _runs(cpp, "batch_10", [1000.0, 1500.0, 1200.0])
    report([ours, cpp], BY_NAME["batch_10"], None)
    assert ours.rows["batch_10"] is ours.runs["batch_10"][2]
    assert ours.rows["batch_10"].verdict == "MISSES: run 1 lost 2 dup 0", ours.rows["batch_10"].verdict

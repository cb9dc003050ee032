"""The streams cycle: what one ``POST /streams/v1/cycle`` costs, against the same ``queen_streams_cycle``
statement sent straight over asyncpg (the bare-SQL baseline), in one run.

    .venv/bin/python bench/bench_streams.py [--rounds 200] [--batch 10] [--repeats 3]

Starts an embedded PostgreSQL (or uses QUEEN_BENCH_DATABASE_URL / QUEEN_TEST_DATABASE_URL, a server DSN),
a fresh database and a ``queen serve`` with 2 workers. Each round pushes ``--batch`` messages into one
partition of a source queue and pops them under a lease (not timed), then times the one cycle that
upserts a state row, pushes one sink item and acks the batch: over HTTP, or as the bare statement. The
two kinds alternate round by round so machine noise hits both alike; each repeat prints the median and
p90 of each and their ratio, and the last line the median of the repeats' ratios. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.db import new_migrated_db, run_on_a_server  # noqa: E402
from broker.ids import uuid7  # noqa: E402
from broker.log.calls import Push  # noqa: E402
from broker.process.localserver import LocalBroker  # noqa: E402
from broker.store.queries import Q  # noqa: E402
from broker.streams.calls import StreamsCycle  # noqa: E402

TENANT = "default"


async def _leased_batch(http: httpx.AsyncClient, src: str, n: int) -> dict:
    items = [{"queue": src, "partition": "p", "payload": {"i": i}} for i in range(n)]
    assert (await http.post("/api/v1/push", json={"items": items})).status_code == 201
    r = await http.get(f"/api/v1/pop/queue/{src}", params={"batch": str(n), "wait": "false", "consumerGroup": "g"})
    assert r.status_code == 200, r.text
    return r.json()


async def _via_http(http: httpx.AsyncClient, qid: str, batch: dict, sink: str, rnd: int) -> float:
    last = batch["messages"][-1]
    body = {"query_id": qid, "partition_id": batch["partitionId"], "consumer_group": "g",
            "state_ops": [{"type": "upsert", "key": f"k{rnd % 50}", "value": {"acc": rnd, "windowEnd": rnd}}],
            "push_items": [{"queue": sink, "partition": "p", "payload": {"sum": rnd}}],
            "ack": {"transactionId": last["transactionId"], "leaseId": batch["leaseId"], "status": "completed",
                    "count": len(batch["messages"])}, "release_lease": True}
    t0 = time.perf_counter()
    r = await http.post("/streams/v1/cycle", json=body)
    took = time.perf_counter() - t0
    assert r.status_code == 200 and r.json()["success"] is True, r.text
    return took


async def _via_sql(conn: asyncpg.Connection, qid: str, batch: dict, sink: str, rnd: int) -> float:
    last = batch["messages"][-1]
    mid = uuid7()
    t0 = time.perf_counter()
    push = Push(tenant=TENANT, plain=[sink], queues=[sink], partitions=["p"], ids=[mid], txns=[str(mid)],
                traces=[None], payloads=[f'{{"sum": {rnd}}}'.encode()], codecs=[0], key_ids=[None], subs=["bench"],
                deadline_ms=[None], meter_period_s=3600)
    call = StreamsCycle(query_id=uuid.UUID(qid), partition_id=uuid.UUID(batch["partitionId"]), group="g",
                        op_keys=[f"k{rnd % 50}"], op_values=[f'{{"acc": {rnd}, "windowEnd": {rnd}}}'],
                        ack_txn=last["transactionId"], ack_lease=uuid.UUID(batch["leaseId"]),
                        ack_count=len(batch["messages"]), release=True, push=push)
    rows = await conn.fetch(Q.streams_cycle, *call.args())
    took = time.perf_counter() - t0
    assert not [r for r in rows if r["kind"] == "refused"], rows
    return took


async def run(args: argparse.Namespace, server: str) -> None:
    dsn = await new_migrated_db(server, "bench_streams")
    b = LocalBroker(dsn=dsn, workers=2, env={"QUEEN_LOG_LEVEL": "WARNING"},
                    log_path=Path(tempfile.gettempdir()) / "bench_streams_broker.log")
    b.start()
    conn = await asyncpg.connect(dsn)
    try:
        async with httpx.AsyncClient(base_url=b.url, timeout=30) as http:
            ratios = []
            for rep in range(args.repeats):
                src, sink = f"bs-src-{rep}-{uuid.uuid4().hex[:6]}", f"bs-sink-{rep}"
                r = await http.post("/streams/v1/queries", json={"name": src, "source_queue": src,
                                                                 "sink_queue": sink, "config_hash": "h"})
                qid = r.json()["query_id"]
                times: dict[str, list[float]] = {"http": [], "sql": []}
                for rnd in range(args.rounds):
                    batch = await _leased_batch(http, src, args.batch)
                    if rnd % 2:
                        times["http"].append(await _via_http(http, qid, batch, sink, rnd))
                    else:
                        times["sql"].append(await _via_sql(conn, qid, batch, sink, rnd))
                med = {k: statistics.median(v) * 1000 for k, v in times.items()}
                p90 = {k: statistics.quantiles(v, n=10)[-1] * 1000 for k, v in times.items()}
                ratios.append(med["http"] / med["sql"])
                print(f"repeat {rep}: cycle over HTTP p50 {med['http']:.2f} ms p90 {p90['http']:.2f} ms; "
                      f"bare SQL p50 {med['sql']:.2f} ms p90 {p90['sql']:.2f} ms; ratio {ratios[-1]:.2f}", flush=True)
            print(f"median ratio HTTP/SQL over {args.repeats} repeats: {statistics.median(ratios):.2f} "
                  f"(batch {args.batch}, 1 state op, 1 sink item per cycle; load {os.getloadavg()[0]:.2f})")
    finally:
        await conn.close()
        b.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    run_on_a_server(lambda server: run(args, server), "bench-streams-")


if __name__ == "__main__":
    main()

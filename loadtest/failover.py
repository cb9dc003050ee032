"""Scenario ``failover``: does a deployment keep every acknowledged write when its PostgreSQL fails over?

Producers push messages, schedulers schedule timers (due 0.3-2.5 s later), KV writers write keys and
consumers long-poll both queues and acknowledge what they get, all at a steady pace against ``--url``.
Each round, ``--fault-at`` seconds in, the harness runs ``--fault-cmd`` (a shell command: ``queen cluster
kill-primary``, a ``patronictl switchover``, a cloud CLI, whatever injects the fault in the user's
environment), then keeps the load on until the broker has answered writes again for ``--settle`` s.
After the last round it stops the writers, drains the queues and checks every write the broker
acknowledged against what it answered afterwards:

- a push acknowledged (2xx ``queued``/``duplicate``) must be delivered: otherwise **lost**; delivered
  again after a consumer's acknowledgement of it was itself acknowledged: **duplicated**;
- a timer acknowledged (``scheduled``/``rescheduled``) must fire once: delivered on its queue, else
  **pending** if the broker still holds it (``GET /api/v1/timers/:queue/:key``) or **lost**; delivered
  again after an acknowledged ack: **fired twice**;
- a KV write acknowledged must read back with its value: otherwise **lost**.

Writers retry a failed call with the same identity (the push's ``transactionId``, the timer's ``txn``
and key, the KV key and value), as a client should: an answer lost in the failover must not turn into a
second write. Every answer is timed and classed (2xx, 4xx, 500, 503, other 5xx, no answer); a round's
**unavailability window** runs from the start of the first write that failed after the fault to the
end of the last one that failed before writes succeeded again, and the classes of the answers inside it
are reported. The verdict (first line, JSON ``verdict``) is ``PASS`` when nothing acknowledged was lost,
duplicated or fired twice, no timer is still pending and no answer in any window was a 500.

    queen loadtest failover --url http://127.0.0.1:6632 --rounds 3 \\
        --fault-cmd "queen cluster kill-primary --dir /tmp/queen-cluster"
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import statistics
import subprocess
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

CLASSES = ("2xx", "4xx", "500", "503", "5xx", "no answer")


@dataclass
class Params:
    url: str
    fault_cmd: str
    rounds: int = 1
    fault_at: float = 5.0  # seconds of steady load before each fault
    settle: float = 5.0  # seconds of writes succeeding again before the next round (or the end)
    round_timeout: float = 90.0  # longest a round waits for the broker to serve writes again
    producers: int = 2
    schedulers: int = 2
    kv_writers: int = 2
    consumers: int = 2
    pace: float = 0.02  # seconds between one actor's calls
    drain: float = 30.0  # longest wait for the last deliveries
    token: str = ""
    request_timeout: float = 10.0


@dataclass
class Answer:
    kind: str  # push, timer, kv, pop, ack
    start: float
    end: float
    klass: str
    status: int | None = None


@dataclass
class Round:
    index: int
    fault_started: float = 0.0
    fault_rc: int | None = None
    fault_output: str = ""
    window_s: float = 0.0
    window: tuple[float, float] | None = None
    classes: dict[str, int] = field(default_factory=dict)


def klass(status: int | None) -> str:
    if status is None:
        return "no answer"
    if 200 <= status < 300:
        return "2xx"
    if 400 <= status < 500:
        return "4xx"
    if status in (500, 503):
        return str(status)
    return "5xx"


class Run:
    def __init__(self, p: Params) -> None:
        self.p = p
        self.tag = uuid.uuid4().hex[:8]
        self.queue = f"failover-{self.tag}"
        self.tqueue = f"failover-timers-{self.tag}"
        self.ns = f"failover-{self.tag}"
        self.t0 = time.monotonic()
        self.answers: list[Answer] = []
        self.pushed: set[str] = set()  # acknowledged pushes (transactionId)
        self.timers: set[str] = set()  # acknowledged timers (key = txn)
        self.kv: dict[str, str] = {}  # acknowledged KV writes: key -> value
        # Deliveries per id: each an (acked, at) pair; "acked" means the consumer's ack was answered 2xx.
        self.delivered: dict[str, list[bool]] = defaultdict(list)
        self.writing = True
        self.consuming = True
        self.last_write_ok = 0.0
        self.seq = 0
        self.refused = 0  # writes answered 4xx (a harness or auth problem, never retried)
        headers = {"Authorization": f"Bearer {p.token}"} if p.token else {}
        self.client = httpx.AsyncClient(base_url=p.url, timeout=p.request_timeout, headers=headers,
                                        limits=httpx.Limits(max_connections=64))

    def now(self) -> float:
        return time.monotonic() - self.t0

    def next_id(self, prefix: str) -> str:
        self.seq += 1
        return f"{prefix}-{self.tag}-{self.seq}"

    @staticmethod
    def outcome(r: httpx.Response | None, acked: bool) -> str:
        if acked:
            return "acked"
        if r is not None and 400 <= r.status_code < 500 and r.status_code != 429:
            return "refused"
        return "retry"

    async def call(self, kind: str, method: str, path: str, **kw: Any) -> httpx.Response | None:
        start = self.now()
        resp: httpx.Response | None = None
        try:
            resp = await self.client.request(method, path, **kw)
        except httpx.HTTPError:
            resp = None
        end = self.now()
        c = klass(resp.status_code if resp is not None else None)
        self.answers.append(Answer(kind, start, end, c, resp.status_code if resp is not None else None))
        if kind in ("push", "timer", "kv") and c == "2xx":
            self.last_write_ok = end
        return resp

    # ------------------------------------------------------------ actors
    async def _until_acked(self, attempt: Any) -> None:
        """Call ``attempt()`` (True once acknowledged) again after each failure, while writing lasts. A 4xx
        other than 429 is a refusal, not an outage: counted (``refused``) and not retried."""
        while True:
            outcome = await attempt()
            if outcome == "acked":
                return
            if outcome == "refused":
                self.refused += 1
                return
            if not self.writing:
                return
            await asyncio.sleep(self.p.pace * 5)

    async def producer(self) -> None:
        while self.writing:
            tid = self.next_id("p")
            item = {"queue": self.queue, "transactionId": tid, "payload": {"id": tid}}

            async def push(item: dict[str, Any] = item, tid: str = tid) -> str:
                r = await self.call("push", "POST", "/api/v1/push", json={"items": [item]})
                if r is not None and r.status_code in (200, 201):
                    if r.json()[0].get("status") in ("queued", "duplicate"):
                        self.pushed.add(tid)
                        return "acked"
                return self.outcome(r, False)

            await self._until_acked(push)
            await asyncio.sleep(self.p.pace)

    async def scheduler(self) -> None:
        while self.writing:
            key = self.next_id("t")
            op = {"op": "schedule", "queue": self.tqueue, "timerKey": key, "txn": key,
                  "delayMs": random.randint(300, 2500),
                  "payload": base64.b64encode(json.dumps({"id": key}).encode()).decode()}

            async def schedule(op: dict[str, Any] = op, key: str = key) -> str:
                r = await self.call("timer", "POST", "/api/v1/timers", json={"operations": [op]})
                if r is not None and r.status_code in (200, 201):
                    results = r.json()
                    results = results.get("results", results) if isinstance(results, dict) else results
                    if results and results[0].get("status") in ("scheduled", "rescheduled"):
                        self.timers.add(key)
                        return "acked"
                return self.outcome(r, False)

            await self._until_acked(schedule)
            await asyncio.sleep(self.p.pace)

    async def kv_writer(self) -> None:
        while self.writing:
            key = self.next_id("k")
            value = uuid.uuid4().hex

            async def put(key: str = key, value: str = value) -> str:
                r = await self.call("kv", "PUT", f"/api/v1/kv/{self.ns}/{key}", json={"v": value},
                                    params={"forever": "true"})
                if r is not None and 200 <= r.status_code < 300:
                    self.kv[key] = value
                    return "acked"
                return self.outcome(r, False)

            await self._until_acked(put)
            await asyncio.sleep(self.p.pace)

    async def consumer(self, queue: str) -> None:
        while self.consuming:
            r = await self.call("pop", "GET", f"/api/v1/pop/queue/{queue}", params={"wait": "true", "timeout": "1000", "batch": "50"})
            if r is None or r.status_code != 200:
                if r is None or r.status_code != 204:
                    await asyncio.sleep(0.1)
                continue
            msgs = [m for m in (r.json() or {}).get("messages") or [] if m]
            if not msgs:
                continue
            acks = [{"transactionId": m["transactionId"], "partitionId": m["partitionId"], "status": "completed",
                     "error": None, "leaseId": m.get("leaseId")} for m in msgs]
            a = await self.call("ack", "POST", "/api/v1/ack/batch", json={"acknowledgments": acks, "consumerGroup": None})
            ok: dict[str, bool] = {}
            if a is not None and a.status_code == 200:
                for ack, res in zip(acks, a.json(), strict=False):
                    ok[ack["transactionId"]] = bool(res.get("success"))
            for m in msgs:
                self.delivered[m["transactionId"]].append(ok.get(m["transactionId"], False))

    # ------------------------------------------------------------ the run
    async def setup(self) -> None:
        # A short lease, so a delivery whose ack failed in the outage comes back soon (and is not counted
        # as a duplicate: only a delivery after an acknowledged ack is); retries enough to never DLQ.
        for q in (self.queue, self.tqueue):
            deadline = time.monotonic() + 60
            while True:
                r = await self.call("setup", "POST", "/api/v1/configure",
                                    json={"queue": q, "options": {"leaseTime": 3, "retryLimit": 1000}})
                if r is not None and r.status_code in (200, 201):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"could not configure {q}: {r.status_code if r is not None else 'no answer'} "
                                       f"{r.text[:300] if r is not None else ''}")
                await asyncio.sleep(0.5)

    async def fault(self, rnd: Round) -> None:
        rnd.fault_started = self.now()
        proc = await asyncio.create_subprocess_shell(self.p.fault_cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out, _ = await proc.communicate()
        rnd.fault_rc = proc.returncode
        rnd.fault_output = out.decode(errors="replace")[-2000:]

    async def one_round(self, rnd: Round) -> None:
        await asyncio.sleep(self.p.fault_at)
        await self.fault(rnd)
        deadline = self.now() + self.p.round_timeout
        # Back when writes have succeeded for --settle s in a row since the fault.
        while self.now() < deadline:
            failed_after = [a.end for a in self.answers if a.kind in ("push", "timer", "kv") and a.klass != "2xx"
                            and a.start >= rnd.fault_started]
            last_fail = max(failed_after, default=rnd.fault_started)
            if self.last_write_ok > last_fail and self.now() - last_fail >= self.p.settle:
                break
            await asyncio.sleep(0.2)

    async def run(self) -> dict[str, Any]:
        await self.setup()
        writers = [*(self.producer() for _ in range(self.p.producers)), *(self.scheduler() for _ in range(self.p.schedulers)),
                   *(self.kv_writer() for _ in range(self.p.kv_writers))]
        consumers = [*(self.consumer(self.queue) for _ in range(self.p.consumers)),
                     *(self.consumer(self.tqueue) for _ in range(self.p.consumers))]
        w_tasks = [asyncio.ensure_future(w) for w in writers]
        c_tasks = [asyncio.ensure_future(c) for c in consumers]
        rounds = [Round(i + 1) for i in range(self.p.rounds)]
        try:
            for rnd in rounds:
                await self.one_round(rnd)
            self.writing = False
            await asyncio.gather(*w_tasks)
            writes_end = self.now()
            # Drain: every acknowledged push and timer delivered and acked, or --drain spent.
            deadline = self.now() + self.p.drain
            while self.now() < deadline:
                if all(any(self.delivered.get(i, [])) for i in self.pushed | self.timers):
                    break
                await asyncio.sleep(0.5)
            await asyncio.sleep(1.0)  # a last look for late duplicates
        finally:
            self.writing = False
            self.consuming = False
            for t in w_tasks + c_tasks:
                if not t.done():
                    await asyncio.wait([t], timeout=self.p.request_timeout + 2)
                    t.cancel()
        checks = await self.check()
        await self.client.aclose()
        for i, rnd in enumerate(rounds):
            self.window_of(rnd, rounds[i + 1].fault_started if i + 1 < len(rounds) else float("inf"))
        return self.result(rounds, checks, writes_end)

    def window_of(self, rnd: Round, until: float) -> None:
        """The round's window: from the start of the first write that failed after the fault to the end of
        the last one that failed; the classes of every answer that started inside it."""
        failed = [a for a in self.answers if a.kind in ("push", "timer", "kv") and a.klass != "2xx"
                  and a.end >= rnd.fault_started and a.start < until]
        if not failed:
            rnd.window, rnd.window_s, rnd.classes = None, 0.0, {}
            return
        lo, hi = min(f.start for f in failed), max(f.end for f in failed)
        rnd.window, rnd.window_s = (round(lo, 3), round(hi, 3)), round(hi - lo, 3)
        rnd.classes = dict(Counter(a.klass for a in self.answers if lo <= a.start <= hi))

    async def check(self) -> dict[str, Any]:
        lost_push = sorted(i for i in self.pushed if not self.delivered.get(i))
        dup_push = sorted(i for i in self.pushed if _twice(self.delivered.get(i, [])))
        undelivered_timers = [k for k in self.timers if not self.delivered.get(k)]
        pending, lost_timers = [], []
        async with httpx.AsyncClient(base_url=self.p.url, timeout=self.p.request_timeout,
                                     headers=self.client.headers) as c:
            for key in undelivered_timers:
                r = await c.get(f"/api/v1/timers/{self.tqueue}/{key}")
                found = r.status_code == 200 and r.json().get("found")
                (pending if found else lost_timers).append(key)
            fired_twice = sorted(k for k in self.timers if _twice(self.delivered.get(k, [])))
            lost_kv = []
            for key, value in self.kv.items():
                r = await c.get(f"/api/v1/kv/{self.ns}/{key}")
                if r.status_code != 200 or (r.json().get("value") or {}).get("v") != value:
                    lost_kv.append(key)
        return {
            "pushes": {"acknowledged": len(self.pushed), "lost": len(lost_push), "duplicated": len(dup_push),
                       "examples": (lost_push + dup_push)[:10]},
            "timers": {"acknowledged": len(self.timers), "lost": len(lost_timers), "fired_twice": len(fired_twice),
                       "pending": len(pending), "examples": (lost_timers + fired_twice + pending)[:10]},
            "kv": {"acknowledged": len(self.kv), "lost": len(lost_kv), "examples": lost_kv[:10]},
        }

    def result(self, rounds: list[Round], checks: dict[str, Any], writes_end: float) -> dict[str, Any]:
        windows = [r.window_s for r in rounds]
        in_windows: Counter[str] = Counter()
        for r in rounds:
            in_windows.update(r.classes)
        checked = checks["pushes"]["acknowledged"] + checks["timers"]["acknowledged"] + checks["kv"]["acknowledged"]
        lost = checks["pushes"]["lost"] + checks["timers"]["lost"] + checks["kv"]["lost"]
        dup, twice, pending = checks["pushes"]["duplicated"], checks["timers"]["fired_twice"], checks["timers"]["pending"]
        problems = []
        if lost:
            problems.append(f"{lost} acknowledged writes lost")
        if dup:
            problems.append(f"{dup} pushes duplicated")
        if twice:
            problems.append(f"{twice} timers fired twice")
        if pending:
            problems.append(f"{pending} timers still pending")
        if self.refused:
            problems.append(f"{self.refused} writes refused with a 4xx (see classes_all)")
        if in_windows.get("500"):
            problems.append(f"{in_windows['500']} answers were 500")
        failed_faults = [r.index for r in rounds if r.fault_rc != 0]
        if failed_faults:
            problems.append(f"the fault command failed in round(s) {failed_faults}")
        verdict = "PASS" if not problems else "FAIL"
        return {
            "verdict": verdict,
            "verdict_line": f"{verdict}: " + ("; ".join(problems) if problems else
                                              f"{checked} acknowledged writes checked, none lost, duplicated or fired twice"),
            "rounds": len(rounds),
            "window_s": {"p50": round(statistics.median(windows), 3) if windows else None,
                         "max": round(max(windows), 3) if windows else None, "each": windows},
            "classes_in_windows": dict(in_windows),
            "classes_all": dict(Counter(a.klass for a in self.answers)),
            "refused": self.refused, "checked": checked, "lost": lost, "duplicated": dup, "fired_twice": twice, "pending": pending,
            "checks": checks,
            "round_details": [asdict(r) for r in rounds],
            "writes_s": round(writes_end, 1),
            "params": {k: v for k, v in asdict(self.p).items() if k != "token"},
        }


def _twice(deliveries: list[bool]) -> bool:
    """Delivered again after a delivery whose ack the broker acknowledged."""
    return True in deliveries and len(deliveries) > deliveries.index(True) + 1


def run(p: Params) -> dict[str, Any]:
    return asyncio.run(Run(p).run())


def table(result: dict[str, Any]) -> str:
    w = result["window_s"]
    head = ["rounds", "window p50 s", "window max s", "ack'd writes checked", "lost", "duplicated", "fired twice", "pending"]
    row = [result["rounds"], w["p50"], w["max"], result["checked"], result["lost"], result["duplicated"],
           result["fired_twice"], result["pending"]]
    widths = [max(len(str(h)), len(str(v))) for h, v in zip(head, row, strict=True)]
    lines = ["  ".join(str(h).rjust(n) for h, n in zip(head, widths, strict=True)),
             "  ".join(str(v).rjust(n) for v, n in zip(row, widths, strict=True))]
    classes = ", ".join(f"{k} {v}" for k, v in sorted(result["classes_in_windows"].items())) or "none (no failed write)"
    return "\n".join([result["verdict_line"], "", *lines, "", f"answers inside the windows: {classes}"])


def html_verdict(result: dict[str, Any], esc: Any, html_table: Any) -> str:
    cls = "good" if result["verdict"] == "PASS" else "bad"
    w = result["window_s"]
    c = result["checks"]
    text = (f"<b>{esc(result['verdict_line'])}</b>. {result['rounds']} fault round(s); unavailability window p50 "
            f"{esc(w['p50'])} s, max {esc(w['max'])} s.")
    rows = [["pushes", c["pushes"]["acknowledged"], c["pushes"]["lost"], c["pushes"]["duplicated"], "", ""],
            ["timers", c["timers"]["acknowledged"], c["timers"]["lost"], "", c["timers"]["fired_twice"], c["timers"]["pending"]],
            ["KV writes", c["kv"]["acknowledged"], c["kv"]["lost"], "", "", ""]]
    rounds = [[r["index"], r["fault_rc"], r["window_s"], ", ".join(f"{k} {v}" for k, v in sorted(r["classes"].items()))]
              for r in result["round_details"]]
    return (f'<div class="verdict {cls}" id="verdict">{text}</div>'
            + html_table(["acknowledged", "checked", "lost", "duplicated", "fired twice", "still pending"], rows)
            + "<h3>Rounds</h3>" + html_table(["round", "fault exit code", "window s", "answers in the window"], rounds))

"""The five-minute tour (docs/getting-started/tour.md) runs as written.

The page's own code blocks are extracted from the Markdown, so the page cannot drift from what works:
its ``queen serve`` block is run as given (the venv's ``queen``, in an empty working directory, so the
broker initialises its embedded PostgreSQL under ``./.queen`` as a reader's does; only the port is
chosen by the test), its Python blocks run in order in one namespace with top-level ``await``, as in the
``python -m asyncio`` REPL the page opens, against that broker, and its ``curl`` block's URLs are read
the way the console reads them. The README's ten-line example runs against the same broker. The checks are the page's claims: the reminder fired and was consumed,
the expiry was cancelled (``absent`` after), no timer is pending, the queue holds one message and
nothing is pending for its queue-mode group.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from helpers import wait_for

from broker.process.localserver import free_port, http_get

ROOT = Path(__file__).resolve().parent.parent
TOUR = ROOT / "docs" / "getting-started" / "tour.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.M | re.S)

pytestmark = pytest.mark.slow


def blocks(lang: str) -> list[str]:
    return [body for kind, body in BLOCK.findall(TOUR.read_text()) if kind == lang]


def test_the_page_has_the_steps_the_test_runs():
    sh = blocks("sh")
    assert sh[0].strip() == ".venv/bin/queen serve"
    assert sh[1].strip() == ".venv/bin/python -m asyncio"
    assert all(line.startswith("curl -s http://127.0.0.1:6632/") for line in sh[2].strip().splitlines())
    python = "\n".join(blocks("python"))
    for call in ("Queen(URL)", "client.timers.schedule(", ".pop()", "client.ack(", "client.timers.cancel("):
        assert call in python, call


@pytest.fixture(scope="module")
def tour_broker(tmp_path_factory: pytest.TempPathFactory):
    """The page's `queen serve`, run from an empty directory with only the port chosen here."""
    argv = shlex.split(blocks("sh")[0].strip())
    assert argv[0] == ".venv/bin/queen"
    argv[0] = str(Path(sys.executable).with_name("queen"))
    tmp_path = tmp_path_factory.mktemp("tour")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_") and k != "PROMETHEUS_MULTIPROC_DIR"}
    env.update({"QUEEN_PORT": str(port), "QUEEN_WORKERS": "2"})
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        def healthy() -> bool:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                return http_get(f"{url}/health")[0] == 200
            except OSError:  # not listening yet
                return False

        wait_for(healthy, timeout=240, what="the tour's queen serve to answer /health", interval=0.5)
        assert (tmp_path / ".queen").is_dir(), "the embedded PostgreSQL was not put under ./.queen"
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


async def test_the_tour_runs_as_written(tour_broker, monkeypatch, capsys):
    monkeypatch.setenv("QUEEN_URL", tour_broker)
    source = "\n".join(blocks("python"))
    code = compile(source, str(TOUR), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    namespace: dict[str, object] = {"__name__": "__tour__"}
    result = eval(code, namespace)  # noqa: S307 - the page's own code, run as the page says
    if result is not None:
        await result
    out = capsys.readouterr().out

    # What the page's comments promise.
    assert "scheduled scheduled" in out
    assert "{'order': 1, 'say': 'please pay'}" in out
    assert "{'success': True" in out
    assert re.search(r"^cancelled$", out, re.M) and re.search(r"^absent$", out, re.M), out
    messages = namespace["messages"]
    assert [m["data"] for m in messages] == [{"order": 1, "say": "please pay"}]  # type: ignore[attr-defined]
    assert messages[0]["transactionId"] == "order-1-reminder"  # type: ignore[index]
    assert messages[0]["id"] == namespace["reminder"]["messageId"]  # type: ignore[index]

    # What the console shows: the same routes its Timers and Queues views call, from the page's curl block.
    urls = [line.split()[2].replace("http://127.0.0.1:6632", tour_broker) for line in blocks("sh")[2].strip().splitlines()]
    async with httpx.AsyncClient(timeout=30) as http:
        overview, peek, queue = [(await http.get(u)).json() for u in urls]
        assert overview["pending"] == 0
        assert all(q["queue"] != "tour-orders" or q["pending"] == 0 for q in overview["queues"]), overview
        assert peek["found"] is False
        listed = (await http.get(f"{tour_broker}/api/v1/timers/tour-orders")).json()
        assert listed["rows"] == []
        assert sum(p["messages"] for p in queue["partitions"]) == 1, queue
        assert queue["consumerGroups"] and all(g["pending"] == 0 for g in queue["consumerGroups"]), queue
        fired = (await http.get(f"{tour_broker}/api/v1/messages/lookup",
                                params={"queue": "tour-orders", "txn": "order-1-reminder"})).json()
        assert fired["found"] is True and fired["messageId"] == namespace["reminder"]["messageId"]  # type: ignore[index]
        never = (await http.get(f"{tour_broker}/api/v1/messages/lookup",
                                params={"queue": "tour-orders", "txn": "order-2-expiry"})).json()
        assert never["found"] is False
        # A cancel from the console's row, after the tour: still absent.
        again = (await http.delete(f"{tour_broker}/api/v1/timers/tour-orders/order-2/expiry")).json()
        assert again["status"] == "absent"


def test_the_readme_example_runs_as_written(tour_broker):
    """README's "Ten lines with the official client", as a script in its own process (its URL pointed at
    the test's broker): it schedules, waits for the fire, prints the payload and acks."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Ten lines with the official client")[1]
    example = BLOCK.findall(section)[0]
    assert example[0] == "python"
    code = example[1]
    assert len([line for line in code.splitlines() if line.strip()]) <= 12
    assert code.count("http://127.0.0.1:6632") == 1
    proc = subprocess.run([sys.executable, "-c", code.replace("http://127.0.0.1:6632", tour_broker)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "{'order': 42}" in proc.stdout.splitlines(), proc.stdout
    queue = httpx.get(f"{tour_broker}/api/v1/resources/queues/orders", timeout=30).json()
    assert sum(p["messages"] for p in queue["partitions"]) >= 1
    assert all(g["pending"] == 0 for g in queue["consumerGroups"]), queue

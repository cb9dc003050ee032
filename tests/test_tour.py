"""The five-minute tour (docs/getting-started/tour.md) runs as written.

The page's own code blocks are extracted from the Markdown, so the page cannot drift from what works:
its ``queen serve`` block is run as given (the venv's ``queen``, in an empty working directory, so the
broker initialises its embedded PostgreSQL under ``./.queen`` as a reader's does; only the port and the
worker count are chosen by the test), its Python blocks run in order in one namespace with top-level
``await``, as in the ``python -m asyncio`` REPL the page opens, against that broker, and its ``curl``
block's URLs are read the way the console reads them; then the console itself is opened in headless
Chromium (the ``browser`` marker) and section 6's claims are read off the page. The checks are the page's claims: the
reminder fired and was consumed, the expiry was cancelled (``absent`` after), no timer is pending, the
queue holds one message and nothing is pending for its queue-mode group. The README's ten-line example
runs against the same broker.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import io
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


@pytest.fixture(scope="module")
def toured(tour_broker):
    """The page's Python blocks, run once in order in one namespace, with top-level await as in the
    ``python -m asyncio`` REPL the page opens, and ``QUEEN_URL`` naming the test's broker: what they
    printed and the names they left."""
    source = "\n".join(blocks("python"))
    code = compile(source, str(TOUR), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    namespace: dict[str, object] = {"__name__": "__tour__"}

    async def run() -> None:
        result = eval(code, namespace)  # noqa: S307 - the page's own code, run as the page says
        if result is not None:
            await result

    out = io.StringIO()
    old = os.environ.get("QUEEN_URL")
    os.environ["QUEEN_URL"] = tour_broker
    try:
        with contextlib.redirect_stdout(out):
            asyncio.run(run())
    finally:
        if old is None:
            del os.environ["QUEEN_URL"]
        else:
            os.environ["QUEEN_URL"] = old
    return namespace, out.getvalue()


def test_the_tour_runs_as_written(tour_broker, toured):
    namespace, out = toured

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
    with httpx.Client(timeout=30) as http:
        overview, peek, queue = [http.get(u).json() for u in urls]
        assert overview["pending"] == 0
        assert all(q["queue"] != "tour-orders" or q["pending"] == 0 for q in overview["queues"]), overview
        assert peek["found"] is False
        assert http.get(f"{tour_broker}/api/v1/timers/tour-orders").json()["rows"] == []
        assert sum(p["messages"] for p in queue["partitions"]) == 1, queue
        assert queue["consumerGroups"] and all(g["pending"] == 0 for g in queue["consumerGroups"]), queue
        fired = http.get(f"{tour_broker}/api/v1/messages/lookup", params={"queue": "tour-orders", "txn": "order-1-reminder"}).json()
        assert fired["found"] is True and fired["messageId"] == namespace["reminder"]["messageId"]  # type: ignore[index]
        never = http.get(f"{tour_broker}/api/v1/messages/lookup", params={"queue": "tour-orders", "txn": "order-2-expiry"}).json()
        assert never["found"] is False


@pytest.mark.browser
def test_the_console_shows_what_the_tour_says(tour_broker, toured):
    """Section 6 of the page, in headless Chromium: the Queues view shows tour-orders with its one
    message and nothing pending for its group; the Timers view shows no pending timer in it, a peek of
    the cancelled expiry says it is not pending, and cancelling it again shows absent."""
    from browser import launched, shot_on_failure
    from playwright.sync_api import expect

    with launched() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.set_default_timeout(15_000)
        with shot_on_failure(page, "tour-console"):
            page.goto(f"{tour_broker}/console#queues")
            expect(page.locator("#who")).to_contain_text("tenant default")
            row = page.locator("#queues-table tr", has_text="tour-orders")
            row.wait_for()
            cells = row.locator("td").all_inner_texts()
            assert cells[2:5] == ["1", "1", "0"], cells  # partitions, messages stored, in DLQ
            row.locator("a").first.click()
            page.wait_for_selector("#groups-table")
            groups = page.locator("#groups-table tbody tr")
            assert groups.count() >= 1
            assert all(groups.nth(i).locator("td").nth(1).inner_text() == "0" for i in range(groups.count()))

            page.goto(f"{tour_broker}/console#timers/tour-orders")
            expect(page.locator("#timers-list")).to_contain_text("no pending timers in this queue")
            expect(page.locator("#timers-overview")).not_to_contain_text("tour-orders")
            page.fill("#timer-key", "order-2/expiry")
            page.click("#peek-key")
            expect(page.locator("#timer-peek")).to_contain_text("not pending")
            page.click("#cancel-key")
            expect(page.locator("#cancel-result")).to_contain_text("absent")
        assert not errors, f"JavaScript errors on the page: {errors}"


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

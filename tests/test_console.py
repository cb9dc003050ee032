"""The operator console (/console) in a real headless Chromium against a real broker with auth on.

One broker for the module (auth on, test hooks on, a sweeper that gives up after 2 fast attempts), one
tenant with an admin token and a produce+consume token. The page is driven as an operator would: type
the token, click through the views, cancel a timer, replay dead letters, and meet a 403 as a message.
"""

from __future__ import annotations

import time

import httpx
import pytest
from browser import chromium, save_view, shot_on_failure  # noqa: F401  (chromium is a fixture)
from conftest import uniq
from helpers import authed, dedicated_broker, timer_op, wait_for
from playwright.sync_api import expect

from broker.auth import mint
from broker.process.localserver import LocalBroker

pytestmark = pytest.mark.browser

SECRET = "console-test-secret"
TENANT = "console-acme"


@pytest.fixture(scope="module")
def cbroker(pg, tmp_path_factory) -> LocalBroker:  # type: ignore[no-untyped-def]
    env = {"QUEEN_JWT_SECRET": SECRET, "QUEEN_TEST_HOOKS": "1", "QUEEN_SWEEPER_MAX_SLEEP_MS": "200",
           "QUEEN_SWEEPER_MAX_ATTEMPTS": "2", "QUEEN_SWEEPER_BACKOFF_BASE_MS": "20"}
    with dedicated_broker(pg, tmp_path_factory, "console", env, workers=1) as b:
        yield b


ADMIN = mint(tenant=TENANT, sub="ops", grants=["admin"], secret=SECRET)
USER = mint(tenant=TENANT, sub="app", grants=["produce", "consume"], secret=SECRET)


@pytest.fixture(scope="module")
def seeded(cbroker: LocalBroker) -> dict[str, str]:
    """A queue with a consumer group and a dead letter, pending timers, and a timer that exhausted its
    attempts (a synthetic dead letter)."""
    q, tq, fq = uniq("cq"), uniq("ctq"), uniq("cfq")
    with authed(SECRET, cbroker, TENANT, "ops", ["admin"]) as c:
        items = [{"queue": q, "partition": "p1", "payload": {"n": i}} for i in range(3)]
        assert c.post("/api/v1/push", json={"items": items}).status_code == 201
        popped = c.get(f"/api/v1/pop/queue/{q}", params={"batch": 1, "consumerGroup": "billing"}).json()
        m = popped["messages"][0]
        ack = c.post("/api/v1/ack", json={"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                                          "leaseId": popped["leaseId"], "status": "dlq", "consumerGroup": "billing",
                                          "error": "console test: poison message"})
        assert ack.status_code == 200, ack.text
        ops = [timer_op(tq, f"k{i:02}", delay=600_000 + i * 1000, payload=b'{"hello": "console"}') for i in range(25)]
        assert all(r["ok"] for r in c.timer_results(*ops))
        assert c.post("/api/v1/test/timers/fail", json={"queue": fq, "count": 10, "class": "permanent"}).status_code == 200
        assert c.timer_results(timer_op(fq, "doomed", delay=10))[0]["ok"]
        wait_for(lambda: c.get("/api/v1/dlq", params={"queue": fq}).json()["total"] >= 1, 20, "the failing timer in the DLQ")
        c.post("/api/v1/test/timers/release", json={"queue": fq})
    return {"queue": q, "timers": tq, "failing": fq}


@pytest.fixture
def page(chromium, cbroker):  # type: ignore[no-untyped-def]  # noqa: F811
    ctx = chromium.new_context(viewport={"width": 1280, "height": 900})
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.set_default_timeout(10_000)
    yield pg
    ctx.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def sign_in(page, url: str, token: str, view: str = "queues") -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{url}/console#{view}")
    page.fill("#token", token)
    page.click("#auth button[type=submit]")
    expect(page.locator("#who")).to_contain_text("tenant")


def test_queues_view_shows_partitions_groups_lag_and_dlq(page, cbroker, seeded):
    with shot_on_failure(page, "console-queues"):
        sign_in(page, cbroker.url, ADMIN)
        assert "tenant console-acme" in page.inner_text("#who")
        row = page.locator("#queues-table tr", has_text=seeded["queue"])
        row.wait_for()
        cells = row.locator("td").all_inner_texts()
        assert cells[2:5] == ["1", "3", "1"], cells  # partitions, messages stored, in DLQ
        save_view(page, "queues")
        row.locator("a").first.click()
        page.wait_for_selector("#groups-table")
        page.locator("#groups-table tr", has_text="billing").wait_for()
        group = page.locator("#groups-table tr", has_text="billing").locator("td").all_inner_texts()
        assert group[1] == "2", group  # the poison message is settled (DLQ); two wait
        assert "ago" in group[3], group  # oldest unacked message, with its age
        assert page.locator("#partitions-table tr", has_text="p1").locator("td").nth(1).inner_text() == "3"
        save_view(page, "queue-detail")


def test_timers_view_lists_pages_peeks_and_cancels(page, cbroker, seeded):
    tq = seeded["timers"]
    with shot_on_failure(page, "console-timers"):
        sign_in(page, cbroker.url, USER, f"timers/{tq}")
        page.locator("#timers-queues tr", has_text=tq).wait_for()
        overview = page.locator("#timers-queues tr", has_text=tq).locator("td").all_inner_texts()
        assert overview[1] == "25", overview
        page.wait_for_selector("#timers-table")
        keys = page.locator("#timers-table tbody tr td:first-child").all_inner_texts()
        assert keys == [f"k{i:02}" for i in range(20)]
        page.click("#timers-next-page")
        expect(page.locator("#timers-table tbody td").first).to_have_text("k20")
        assert page.locator("#timers-table tbody tr").count() == 5
        page.click("#timers-prev")
        expect(page.locator("#timers-table tbody td").first).to_have_text("k00")
        page.locator("#timers-table tr", has_text="k03").locator("[data-peek]").click()
        page.wait_for_selector("#peek-json")
        assert '"timerKey": "k03"' in page.inner_text("#peek-json")
        assert '{"hello": "console"}' in page.inner_text("#timer-peek")
        page.locator("#timers-table tr", has_text="k02").locator("[data-cancel]").click()
        page.wait_for_selector("#cancel-result")
        assert "cancelled" in page.inner_text("#cancel-result")
        expect(page.locator("#timers-table")).not_to_contain_text("k02")
        # cancel by key from the form: now absent
        page.fill("#timer-key", "k02")
        page.click("#cancel-key")
        expect(page.locator("#cancel-result")).to_contain_text("absent")
        # the live panel: timers fire while the page samples /api/v1/status/live; quantiles and a rate appear
        page.wait_for_selector("#lag-p99", timeout=8_000)
        with authed(SECRET, cbroker, TENANT, "app") as c:
            fire_now = [timer_op(uniq("cnow"), f"n{i}", delay=100 + 20 * i, payload=b"{}") for i in range(40)]
            assert c.timers(*fire_now).status_code == 200
        expect(page.locator("#lag-p99")).to_contain_text("ms", timeout=10_000)
        expect(page.locator("#lag-p50")).to_contain_text("ms")
        assert float(page.inner_text("#lag-p99").split()[0]) > 0
    with authed(SECRET, cbroker, TENANT, "app") as c:
        assert c.peek(tq, "k02").json()["found"] is False
        assert c.peek(tq, "k03").json()["found"] is True
    with shot_on_failure(page, "console-timers"):
        page.wait_for_selector("svg.spark", timeout=8_000)
        save_view(page, "timers")


def _chart(page, name: str) -> dict:  # type: ignore[no-untyped-def]
    """What the live chart ``name`` holds: its point count and the series that ever left zero."""
    el = page.locator(f"#chart-{name}")
    return {"points": int(el.get_attribute("data-points") or 0), "moved": (el.get_attribute("data-moved") or "").split(",")}


def test_live_view_charts_move_under_load(page, cbroker, seeded):
    """Live view: uPlot charts fed every 2 s from /api/v1/status/live. With nothing happening they draw
    flat lines; under pushes, pops, acks and firing timers every chart's series leave zero."""
    with shot_on_failure(page, "console-live"):
        sign_in(page, cbroker.url, ADMIN, "live")
        expect(page.locator("#live-push")).to_be_visible(timeout=10_000)  # two samples taken
        page.wait_for_selector("#chart-rates .uplot")
        before = _chart(page, "rates")["points"]
        assert page.evaluate("() => Object.keys(window.queenCharts).sort()") == ["backlog", "dlq", "fired", "lag", "rates"]
        q, tq = uniq("clive"), uniq("clive-t")
        with authed(SECRET, cbroker, TENANT, "ops", ["admin"]) as c:
            deadline = time.monotonic() + 14
            i = 0
            while time.monotonic() < deadline:
                items = [{"queue": q, "partition": f"p{j % 4}", "payload": {"n": j}} for j in range(60)]
                assert c.post("/api/v1/push", json={"items": items}).status_code == 201
                popped = c.get(f"/api/v1/pop/queue/{q}", params={"batch": 40, "wait": "false"})
                if popped.status_code == 200:
                    body = popped.json()
                    acks = [{"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                             "leaseId": body["leaseId"], "status": "completed"} for m in body["messages"]]
                    assert c.post("/api/v1/ack/batch", json={"acknowledgments": acks}).status_code == 200
                ops = [timer_op(tq, f"t{i}-{k}", delay=150 + 25 * k, payload=b"{}") for k in range(30)]
                assert all(r["ok"] for r in c.timer_results(*ops))
                i += 1
                time.sleep(0.4)
            wait_for(lambda: _chart(page, "fired")["moved"] == ["fired/s"], 10, "the fired/s series to move")
        rates = _chart(page, "rates")
        assert rates["points"] >= before + 5, (before, rates)
        assert set(rates["moved"]) == {"pushed/s", "popped/s", "acked/s"}, rates
        lag = _chart(page, "lag")
        assert "p99" in lag["moved"] and "p50" in lag["moved"], lag
        assert q in _chart(page, "backlog")["moved"]  # 60 pushed, 40 acked per round: the backlog grows
        assert _chart(page, "dlq")["moved"] == ["dead letters"]  # the seeded dead letters
        # the uPlot instance itself holds the same points
        pushed = page.evaluate("() => window.queenCharts.rates.data[1]")
        assert len(pushed) == rates["points"] and max(pushed) > 0
        assert float(page.inner_text("#live-backlog").replace(",", "")) > 0
        save_view(page, "live")


def test_live_view_with_no_data_draws_flat_charts(page, cbroker):
    """A tenant with nothing stored: the Live view still draws (flat broker charts, 'no queues yet'), and
    without a token its error is a message, not a blank page."""
    page.goto(f"{cbroker.url}/console#live")
    expect(page.locator("#live-stats .error")).to_contain_text("401")
    empty = mint(tenant="console-empty", sub="nobody", grants=["consume"], secret=SECRET)
    sign_in(page, cbroker.url, empty, "live")
    expect(page.locator("#live-backlog")).to_have_text("0", timeout=10_000)
    expect(page.locator("#live-dlq")).to_have_text("0")
    expect(page.locator("#chart-backlog")).to_contain_text("no queues yet")
    page.wait_for_selector("#chart-dlq .uplot")
    assert _chart(page, "dlq")["moved"] == [""]  # drawn, and flat at zero
    assert _chart(page, "rates")["points"] >= 1


def test_dlq_view_filters_shows_and_replays(page, cbroker, seeded):
    q, fq = seeded["queue"], seeded["failing"]
    with shot_on_failure(page, "console-dlq"):
        sign_in(page, cbroker.url, ADMIN, f"dlq/{fq}")
        page.wait_for_selector("#dlq-table")
        row = page.locator("#dlq-table tr", has_text="__timers__")
        assert "(timer)" in row.inner_text()
        row.locator("[data-replay]").click()
        page.wait_for_selector(".error[data-status='409']")
        refusal = page.inner_text(".error[data-status='409']")
        assert "dlq_replay_refused" in refusal and "synthetic_consumer_group" in refusal, refusal
        save_view(page, "dlq-refused")
        # filter on the message queue instead, view the dead letter, replay it
        page.fill("input[name=queue]", q)
        page.click("#dlq-form button[type=submit]")
        expect(page.locator("#dlq-table")).to_contain_text(q)
        row = page.locator("#dlq-table tbody tr").first
        assert "console test: poison message" in row.inner_text()
        row.locator("[data-show]").click()
        assert '"n": 0' in page.inner_text("#dlq-json")
        row.locator("[data-replay]").click()
        page.wait_for_selector("#replay-result")
        assert q in page.inner_text("#replay-result")
        expect(page.locator("#dlq-list")).to_contain_text("0 dead letters match")
        save_view(page, "dlq")
    with authed(SECRET, cbroker, TENANT, "ops", ["admin"]) as c:
        assert c.get("/api/v1/dlq", params={"queue": q}).json()["total"] == 0
        assert c.get("/api/v1/dlq", params={"queue": fq}).json()["total"] == 1  # the refused one stays


def test_tenants_view_for_an_admin(page, cbroker, seeded):
    with shot_on_failure(page, "console-tenants-admin"):
        sign_in(page, cbroker.url, ADMIN, "tenants")
        page.wait_for_selector("#switches-table")
        assert "cluster suspended" in page.inner_text("#switches-table")
        page.wait_for_selector("#own-limits")
        page.locator("#tenants-table [data-tenant='console-acme']").click()
        page.wait_for_selector("#plan-limits")
        assert "pending timers" in page.inner_text("#plan-limits")
        save_view(page, "tenants-admin")


def test_admin_panels_show_403_to_a_tenant_without_admin(page, cbroker, seeded):
    with shot_on_failure(page, "console-tenants-user"):
        sign_in(page, cbroker.url, USER, "tenants")
        page.wait_for_selector("#own-limits")  # the tenant's own usage still shows
        page.wait_for_selector("#switches .error[data-status='403']")
        for panel in ("#switches", "#all-tenants"):
            text = page.inner_text(panel)
            assert "403 forbidden" in text and "missing_grant" in text and "admin" in text, text
        save_view(page, "tenants-403")


def test_a_bad_token_is_a_message_not_a_blank_page(page, cbroker, seeded):
    with shot_on_failure(page, "console-401"):
        page.goto(f"{cbroker.url}/console#queues")
        page.fill("#token", "not-a-token")
        page.click("#auth button[type=submit]")
        # The view renders twice (before and after the token is sent), each time "Loading…" first: an
        # assertion that retries, not a one-shot read, so the second render cannot be caught half way.
        expect(page.locator("#queues-list .error[data-status='401']")).to_contain_text("401")
        expect(page.locator("#queues-list")).to_contain_text("unauthenticated")
        expect(page.locator("#flash")).to_contain_text("refused")


def test_console_can_be_switched_off(start_broker):
    b = start_broker(env={"QUEEN_CONSOLE": "0"}, workers=1)
    for path in ("/console", "/console/console.js"):
        r = httpx.get(b.url + path)
        assert r.status_code == 404
        assert r.json()["error"] == "console_disabled"


def test_assets_are_served_with_a_strict_policy(cbroker):
    r = httpx.get(cbroker.url + "/console")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert httpx.get(cbroker.url + "/console/console.js").headers["content-type"].startswith("text/javascript")
    r = httpx.get(cbroker.url + "/console/../broker/config.py")
    assert r.status_code == 404
    r = httpx.get(cbroker.url + "/console/secrets.txt")
    assert r.status_code == 404 and r.json()["reason"] == "no_such_asset"
    # the vendored chart library and its licence ship with the page; nothing else under vendor/ is served
    js = httpx.get(cbroker.url + "/console/vendor/uplot/uPlot.iife.min.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript") and b"uPlot" in js.content
    assert "MIT" in httpx.get(cbroker.url + "/console/vendor/uplot/LICENSE").text
    assert httpx.get(cbroker.url + "/console/vendor/uplot/SOURCE").json()["reason"] == "no_such_asset"
    page = httpx.get(cbroker.url + "/console").text
    assert "/console/vendor/uplot/uPlot.iife.min.js" in page and "//" not in page.replace("http://", "")

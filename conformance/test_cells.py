"""Cells (docs/guides/cells.md): a deployment of several cells behind a proxy that routes each tenant to
its own cell. With ``--url`` the proxy, tenant A's and B's tokens (``--token``, ``--token-b``) for tenants
that live in different cells, and each one's cell URL (``--cell-url-a``, ``--cell-url-b``), these check that
a tenant's data is in its cell and nowhere else. NOT VERIFIED without them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from conformance.client import Api, Target, expect, not_verified

contract = pytest.mark.contract


@pytest.fixture
def cells(api: Api, api_b: Api, pytestconfig: pytest.Config) -> Iterator[dict[str, Any]]:
    url_a, url_b = pytestconfig.getoption("--queen-cell-url-a"), pytestconfig.getoption("--queen-cell-url-b")
    if not (url_a and url_b):
        not_verified("needs each tenant's cell URL behind the proxy (--cell-url-a, --cell-url-b)")
    if url_a.rstrip("/") == url_b.rstrip("/"):
        not_verified("--cell-url-a and --cell-url-b name the same cell: the tenants must live in different cells")
    targets = [Target(url_a), Target(url_b)]
    try:
        yield {
            "A": {"proxy": api, "home": targets[0].api(api.token, label="A@cellA"), "away": targets[1].api(api.token, label="A@cellB")},
            "B": {"proxy": api_b, "home": targets[1].api(api_b.token, label="B@cellB"), "away": targets[0].api(api_b.token, label="B@cellA")},
        }
    finally:
        for t in targets:
            t.close()


def _lookup(api: Api, queue: str, txn: str) -> bool:
    r = api.http.get("/api/v1/messages/lookup", params={"queue": queue, "txn": txn})
    if r.status_code == 404:  # a cell that has never seen the queue may say so
        return False
    data = expect(r, 200)
    return bool(data["found"])


def _peek(api: Api, queue: str, key: str) -> bool:
    r = api.peek(queue, key)
    if r.status_code == 404:
        return False
    return bool(expect(r, 200)["found"])


def _kv(api: Api, ns: str, key: str) -> bool:
    return bool(api.kv_ok([{"op": "get", "ns": ns, "key": key}])[0]["found"])


@contract("CELL-HOME", "CELL-ISOLATED")
@pytest.mark.parametrize("who", ["A", "B"])
def test_a_tenants_data_lives_in_its_own_cell_only(cells: dict[str, Any], who: str) -> None:
    via, home, away = cells[who]["proxy"], cells[who]["home"], cells[who]["away"]
    queue, key, ns, txn = f"cell-{uuid.uuid4().hex[:8]}", "k1", f"cell-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    expect(via.http.post("/api/v1/push", json={"items": [{"queue": queue, "payload": {"who": who}, "transactionId": txn}]}),
           (200, 201))
    via.schedule(queue, key, delay_ms=3_600_000)
    via.kv_ok([{"op": "put", "ns": ns, "key": "k", "value": who, "forever": True}])
    assert _lookup(home, queue, txn), f"tenant {who}'s message is not in its cell"
    assert _peek(home, queue, key), f"tenant {who}'s timer is not in its cell"
    assert _kv(home, ns, "k"), f"tenant {who}'s KV entry is not in its cell"
    assert not _lookup(away, queue, txn), f"tenant {who}'s message is visible from the other cell"
    assert not _peek(away, queue, key), f"tenant {who}'s timer is visible from the other cell"
    assert not _kv(away, ns, "k"), f"tenant {who}'s KV entry is visible from the other cell"
    expect(via.cancel(queue, key), (200, 204))

"""KV tenant isolation: another tenant's key reads as not found, cannot be written, deleted, checked or
listed; the same (ns, key) in two tenants are two rows with their own versions. Grants: writes need
``produce``, reads ``consume`` or ``produce``."""

from __future__ import annotations

import httpx
import pytest
from helpers import authed, dedicated_broker

SECRET = "kv-tenancy-secret"


@pytest.fixture(scope="module")
def b(pg, tmp_path_factory):
    with dedicated_broker(pg, tmp_path_factory, "kvt", {"QUEEN_JWT_SECRET": SECRET}) as lb:
        yield lb


def test_tenants_never_see_each_others_keys(b):
    with authed(SECRET, b, "acme") as a, authed(SECRET, b, "globex") as g:
        v = a.kv_results({"op": "put", "ns": "shared", "key": "k", "value": "acme's", "forever": True})[0]["version"]
        res = g.kv_results(
                 {"op": "get", "ns": "shared", "key": "k"},
                 {"op": "getMany", "ns": "shared", "keys": ["k"]},
                 {"op": "getPrefix", "ns": "shared", "prefix": "k"},
                 {"op": "check", "ns": "shared", "key": "k", "expect": v},
                 {"op": "delete", "ns": "shared", "key": "other"})
        assert res[0]["found"] is False
        assert res[1]["rows"] == [] and res[1]["missing"] == ["k"]
        assert res[2]["rows"] == []
        assert res[3]["applied"] is False and res[3]["reason"] == "absent"
        # a fenced write at acme's version finds nothing; a delete of it is absent
        assert g.kv_results({"op": "put", "ns": "shared", "key": "k", "value": 1, "forever": True, "expect": v})[0]["reason"] == "absent"
        assert g.kv_results({"op": "delete", "ns": "shared", "key": "k"})[0]["reason"] == "absent"
        # globex's own row under the same name is a different row
        mine = g.kv_results({"op": "put", "ns": "shared", "key": "k", "value": "globex's", "forever": True})[0]
        assert mine["applied"] and mine["version"] != v
        assert a.kv_results({"op": "get", "ns": "shared", "key": "k"})[0]["value"] == "acme's"
        assert g.get("/api/v1/kv/shared/k").json()["value"] == "globex's"
        # the tenant is never an input
        r = g.post("/api/v1/kv", json={"operations": [{"op": "get", "ns": "shared", "key": "k", "tenant": "acme"}]})
        assert r.status_code == 400 and r.json()["reason"] == "kv_tenant_not_an_input"
    with httpx.Client(base_url=b.url, timeout=30) as anon:
        r = anon.post("/api/v1/kv", json={"operations": [{"op": "get", "ns": "shared", "key": "k"}]})
        assert r.status_code == 401


def test_grants(b):
    put = {"op": "put", "ns": "n", "key": "k", "value": 1, "forever": True}
    get = {"op": "get", "ns": "n", "key": "k"}
    with authed(SECRET, b, "t", grants=("consume",)) as reader, authed(SECRET, b, "t", grants=("produce",)) as writer:
        r = reader.post("/api/v1/kv", json={"operations": [put]})
        assert r.status_code == 403 and r.json()["reason"] == "missing_grant"
        assert reader.put("/api/v1/kv/n/k?forever=true", content=b"1").status_code == 403
        assert writer.post("/api/v1/kv", json={"operations": [put, get]}).status_code == 200
        assert reader.post("/api/v1/kv", json={"operations": [get]}).json()["results"][0]["found"] is True
        assert reader.get("/api/v1/kv/n/k").status_code == 200
        r = reader.post("/api/v1/transaction", json={"operations": [], "kv": [put]})
        assert r.status_code == 403

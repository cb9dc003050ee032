"""Tenant isolation and grants on the log routes, with JWT authentication on: another tenant's queue,
messages, DLQ and leases are invisible; producerSub is the token's sub, never the body's."""

from __future__ import annotations

import httpx
from conftest import uniq
from helpers import authed

SECRET = "log-tenancy-secret"


def test_tenants_are_isolated_and_grants_enforced(start_broker):
    b = start_broker(env={"QUEEN_JWT_SECRET": SECRET}, workers=1)
    q = uniq("iso")
    with authed(SECRET, b, "acme", "billing-svc", ["produce", "consume"]) as a, \
            authed(SECRET, b, "globex", "intruder", ["produce", "consume", "admin"]) as g, \
            authed(SECRET, b, "acme", "reader", ["consume"]) as reader:
        r = a.post("/api/v1/push", json={"items": [{"queue": q, "payload": {"x": 1}, "transactionId": "t1"}]})
        assert r.status_code == 201
        pid = r.json()[0]["partition_id"]
        assert a.get("/api/v1/messages/lookup", params={"queue": q, "txn": "t1"}).json()["producerSub"] == "billing-svc"
        # the other tenant sees nothing of it
        assert g.get("/api/v1/messages/lookup", params={"queue": q, "txn": "t1"}).json()["found"] is False
        assert g.get(f"/api/v1/messages/{pid}/t1").status_code == 404
        # nor can delete it, admin grant or not: the address is not in its log (docs/decisions.md §9)
        assert g.delete(f"/api/v1/messages/{pid}/t1").json()["error"] == "message_not_found"
        assert g.get(f"/api/v1/pop/queue/{q}", params={"wait": "false"}).status_code == 204
        # another tenant's delete finds no such queue (deleted: false, as for any missing queue) and
        # removes nothing: tenant a's message is still delivered below
        r = g.delete(f"/api/v1/resources/queues/{q}")
        assert r.status_code == 200 and r.json()["deleted"] is False
        assert q not in [x["name"] for x in g.get("/api/v1/resources/queues").json()["queues"]]
        # the same queue name in another tenant is another queue
        assert g.post("/api/v1/push", json={"items": [{"queue": q, "payload": 2, "transactionId": "t1"}]}).json()[0]["status"] == "queued"
        msg = a.get(f"/api/v1/pop/queue/{q}", params={"wait": "false"}).json()["messages"][0]
        assert msg["data"] == {"x": 1}
        # a lease of one tenant means nothing to another
        assert g.post(f"/api/v1/lease/{msg['leaseId']}/extend").json()["success"] is False
        forged = g.post("/api/v1/ack", json={"transactionId": "t1", "partitionId": pid, "leaseId": msg["leaseId"],
                                             "status": "completed"}).json()
        assert forged[0]["success"] is False
        # grants: a consume-only credential cannot push or configure, an unauthenticated call is 401
        assert reader.post("/api/v1/push", json={"items": [{"queue": q, "payload": 1}]}).status_code == 403
        assert reader.post("/api/v1/configure", json={"queue": q}).status_code == 403
        assert a.delete(f"/api/v1/resources/queues/{q}").status_code == 403
        assert httpx.get(f"{b.url}/api/v1/pop/queue/{q}?wait=false").status_code == 401

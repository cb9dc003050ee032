def test_health_ok(http):
    r = http.get("/health")
    assert r.status_code == 200
    assert r.json()["status"] == "healthy"


def test_unknown_route_envelope(http):
    r = http.get("/api/v1/definitely-not-a-route")
    assert r.status_code == 404
    assert r.json() == {"error": "no_such_route", "reason": "no_such_route", "detail": "no route matches this path"}

"""The pytest plugin of the conformance suite: options, the NOT VERIFIED outcome, the per-contract
summary, the JSON report and the fixtures that reach the target broker (over HTTP only).

Outcomes per test: passed, failed, NOT VERIFIED (the test needs something the run was not given: a
credential, an opt-in, the fault-injection hooks; or one of its setup steps failed), or NOT IMPLEMENTED
(the target does not offer a feature the contract needs: its probe in conformance/features.py answered
404/405/501 or the documented sign of an omitted feature). NOT VERIFIED and NOT IMPLEMENTED are reported
with their reason, never as passed and never as a plain skip; NOT IMPLEMENTED is reported once per
feature. Per contract: failed if any of its tests failed, else not verified, else not implemented, else
passed.

Profiles (catalogue.PROFILES): ``--queen-profile core,timers`` runs only the tests of those profiles; the
summary and the reports count per profile.

Exit status: non-zero when any contract failed. NOT VERIFIED does not fail the gate by default
(``--queen-strict`` turns it into a failure); NOT IMPLEMENTED does not either, unless its profile is named
by ``--queen-require``.
"""

from __future__ import annotations

import base64
import importlib
import json
import os
import pkgutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conformance.catalogue import (
    BY_ID,
    CONTRACTS,
    FEATURES,
    PROFILES,
    REFERENCE_DEVIATIONS,
    family_of,
    feature_of,
    profile_of,
)
from conformance.client import Api, NotImplementedFeature, NotVerified, Target, not_verified
from conformance.outcomes import LABELS, STATUSES, cell

REPORT_KEY = pytest.StashKey[dict[str, Any]]()


def cluster_wide(fn: Any) -> Any:
    """Mark a test that flips a cluster-wide operator switch (sweeper pause, scheduling switch, cluster
    suspension): it must never run beside another run of the suite against the same broker."""
    fn.queen_cluster_wide = True
    return fn


# ------------------------------------------------------------------------------------------ options


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("queen", "queen conformance")
    g.addoption("--queen-url", action="append", default=[],
                help="base URL of a broker under test; repeat it for several brokers of one deployment (one "
                     "database): calls are then spread over them and the cross-broker contracts run "
                     "(default $QUEEN_URL, comma-separated)")
    g.addoption("--queen-token", default=os.environ.get("QUEEN_TOKEN"), help="bearer token of tenant A")
    g.addoption("--queen-token-b", default=os.environ.get("QUEEN_TOKEN_B"),
                help="bearer token of a second tenant B (isolation contracts)")
    g.addoption("--queen-admin-token", default=os.environ.get("QUEEN_ADMIN_TOKEN"),
                help="bearer token with the admin grant (operator switches, plans)")
    g.addoption("--queen-token-produce-only", default=os.environ.get("QUEEN_TOKEN_PRODUCE_ONLY"),
                help="tenant A token with only the produce grant")
    g.addoption("--queen-token-consume-only", default=os.environ.get("QUEEN_TOKEN_CONSUME_ONLY"),
                help="tenant A token without the produce grant")
    g.addoption("--queen-cell-url-a", default=os.environ.get("QUEEN_CELL_URL_A"),
                help="direct URL of tenant A's cell, when --queen-url is a proxy in front of cells (CELL contracts)")
    g.addoption("--queen-cell-url-b", default=os.environ.get("QUEEN_CELL_URL_B"),
                help="direct URL of tenant B's cell (another cell than A's)")
    g.addoption("--queen-strict", action="store_true", default=False, help="NOT VERIFIED fails the run")
    g.addoption("--queen-report", default=None, help="write a JSON report (per test and per contract) here")
    g.addoption("--queen-contract", action="append", default=[],
                help="run only the tests tagged with this contract id (repeatable)")
    g.addoption("--queen-shuffle", type=int, default=None, metavar="SEED",
                help="run the tests in a random order (seeded): the tests are independent")
    g.addoption("--queen-fire-timeout", type=float, default=20.0,
                help="seconds to wait for a timer to fire / land in the DLQ (default 20)")
    g.addoption("--queen-lag-budget-ms", type=float, default=1000.0,
                help="fire lag accepted for TMR-FIRE-LAG (default 1000 ms: loose, shared machines)")
    g.addoption("--queen-allow-cluster-changes", action="store_true", default=False,
                help="run the contracts that change operator state (cluster suspension, sweeper pause, the "
                     "scheduling switch, tenant plans and pauses); without it they are NOT VERIFIED, so a run "
                     "against a shared staging cell cannot disturb its other tenants")
    g.addoption("--queen-pop-default-batch", type=int, default=200,
                help="the target's QUEEN_POP_DEFAULT_BATCH, for LOG-POP-BATCH-DEFAULT (default 200)")
    g.addoption("--queen-lease-extend-s", type=float, default=60.0,
                help="the target's QUEEN_LEASE_EXTEND_S, for the lease extend contracts (default 60)")
    g.addoption("--queen-profile", action="append", default=[],
                help=f"run only the contracts of these profiles (comma-separated, repeatable; {', '.join(PROFILES)}); "
                     "default all")
    g.addoption("--queen-require", action="append", default=[],
                help="profiles whose NOT IMPLEMENTED contracts fail the gate (comma-separated, repeatable)")
    g.addoption("--queen-html", default=None, help="write an HTML report (per profile, family and contract) here")
    g.addoption("--queen-broker-name", default=None, help="the target's name in the reports (default: its URL)")


def _csv(values: list[str]) -> list[str]:
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


def selected_profiles(config: pytest.Config) -> list[str]:
    return _csv(config.getoption("--queen-profile") or []) or list(PROFILES)


def required_profiles(config: pytest.Config) -> set[str]:
    return set(_csv(config.getoption("--queen-require") or []))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "contract(*ids): contract ids of the conformance catalogue a test checks")
    config.stash[REPORT_KEY] = {"tests": {}, "contracts_of": {}, "measurements": {}, "features": {}}
    for opt in ("--queen-profile", "--queen-require"):
        unknown = sorted(set(_csv(config.getoption(opt) or [])) - set(PROFILES))
        if unknown:
            raise pytest.UsageError(f"{opt} names unknown profile(s) {unknown}; the profiles are {', '.join(PROFILES)}")


# ------------------------------------------------------------------------------------------ collection


def contracts_of(item: pytest.Item) -> list[str]:
    ids: list[str] = []
    for mark in item.iter_markers("contract"):
        ids.extend(mark.args)
    return ids


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wanted = set(config.getoption("--queen-contract") or [])
    unknown = sorted(wanted - set(BY_ID))
    if unknown:
        raise pytest.UsageError(f"--queen-contract names unknown contract id(s): {unknown}")
    state = config.stash[REPORT_KEY]
    profiles = set(selected_profiles(config))
    keep, drop = [], []
    for item in items:
        ids = contracts_of(item)
        state["contracts_of"][item.nodeid] = ids
        if (wanted and not (set(ids) & wanted)) or (ids and not {profile_of(c) for c in ids if c in BY_ID} & profiles):
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    seed = config.getoption("--queen-shuffle")
    if seed is not None:
        import random

        random.Random(seed).shuffle(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config
    if not target_urls(config) and not config.getoption("--collect-only") and any(
            "target" in getattr(item, "fixturenames", ()) for item in session.items):
        raise pytest.UsageError(
            "the conformance suite needs --queen-url URL (or run `queen conformance`, which can start a broker)")


def target_urls(config: pytest.Config) -> list[str]:
    """The brokers under test: every --queen-url, else $QUEEN_URL (comma-separated)."""
    urls = list(config.getoption("--queen-url") or [])
    if not urls and os.environ.get("QUEEN_URL"):
        urls = [u for u in os.environ["QUEEN_URL"].split(",") if u.strip()]
    return [u.strip().rstrip("/") for u in urls]


def _test_functions() -> Iterator[tuple[str, str, Any]]:
    import conformance

    for mod in pkgutil.iter_modules(conformance.__path__):
        if not mod.name.startswith("test_"):
            continue
        module = importlib.import_module(f"conformance.{mod.name}")
        for name, fn in vars(module).items():
            if name.startswith("test_") and callable(fn):
                yield mod.name, name, fn


def contract_index() -> dict[str, list[str]]:
    """contract id -> test names, by importing the suite's test modules (no broker needed). Unknown ids
    named by a test are listed under their own key, so the meta-test can catch them."""
    index: dict[str, list[str]] = {c.id: [] for c in CONTRACTS}
    for mod, name, fn in _test_functions():
        for mark in getattr(fn, "pytestmark", []):
            if mark.name == "contract":
                for cid in mark.args:
                    index.setdefault(cid, []).append(f"{mod}.py::{name}")
    return index


def cluster_wide_contracts() -> set[str]:
    """Contract ids with at least one test marked ``cluster_wide`` (it flips a cluster-wide switch)."""
    out: set[str] = set()
    for _mod, _name, fn in _test_functions():
        marks = getattr(fn, "pytestmark", [])
        if getattr(fn, "queen_cluster_wide", False):
            for m in marks:
                if m.name == "contract":
                    out.update(m.args)
    return out


# ------------------------------------------------------------------------------------------ outcomes


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    excinfo = call.excinfo
    if excinfo is not None and excinfo.errisinstance(NotImplementedFeature):
        exc = excinfo.value
        rep.queen_not_implemented = exc.feature
        path, lineno, _ = item.reportinfo()
        required = {profile_of(c) for c in contracts_of(item) if c in BY_ID} & required_profiles(item.config)
        if required:
            rep.outcome = "failed"
            rep.longrepr = (f"NOT IMPLEMENTED in a required profile ({', '.join(sorted(required))}): "
                            f"{FEATURES[exc.feature]}: {exc.evidence}")
        else:
            rep.outcome = "skipped"
            rep.longrepr = (str(path), (lineno or 0) + 1, f"NOT IMPLEMENTED: {FEATURES[exc.feature]}")
    elif excinfo is not None and excinfo.errisinstance(NotVerified):
        reason = str(excinfo.value.reason)
        rep.queen_not_verified = reason
        path, lineno, _ = item.reportinfo()
        if item.config.getoption("--queen-strict"):
            rep.outcome = "failed"
            rep.longrepr = f"NOT VERIFIED (--queen-strict): {reason}"
        else:
            rep.outcome = "skipped"
            rep.longrepr = (str(path), (lineno or 0) + 1, f"NOT VERIFIED: {reason}")
    elif rep.skipped and not hasattr(rep, "wasxfail"):
        # A plain skip would hide a contract: the suite never skips silently.
        rep.outcome = "failed"
        rep.longrepr = f"skipped without a NOT VERIFIED reason: {rep.longrepr}"


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> Any:
    if getattr(report, "queen_not_verified", None) is not None and report.skipped:
        return "not verified", "N", ("NOT VERIFIED", {"yellow": True})
    if getattr(report, "queen_not_implemented", None) is not None and report.skipped:
        return "not implemented", "I", ("NOT IMPLEMENTED", {"yellow": True})
    return None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Recorded per test; folded per contract at the end.
    state = _STATE.get("state")
    if state is None:
        return
    t = state["tests"].setdefault(report.nodeid, {"outcome": "passed", "reason": None, "detail": None})
    if report.failed:
        t["outcome"] = "failed"
        crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", None)
        t["detail"] = _short(crash or report.longreprtext)
    elif getattr(report, "queen_not_verified", None) is not None and t["outcome"] != "failed":
        t["outcome"] = "not_verified"
        t["reason"] = report.queen_not_verified
    elif getattr(report, "queen_not_implemented", None) is not None and t["outcome"] == "passed":
        t["outcome"] = "not_implemented"
        t["reason"] = f"not implemented: {FEATURES[report.queen_not_implemented]}"
        t["feature"] = report.queen_not_implemented


_STATE: dict[str, dict[str, Any]] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    _STATE["state"] = session.config.stash[REPORT_KEY]


def _short(text: str, limit: int = 1500) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    tail = "\n".join(lines[-15:])
    return tail[-limit:]


@dataclass
class ContractResult:
    status: str = "not_run"
    tests: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)



def fold(state: dict[str, Any]) -> dict[str, ContractResult]:
    results = {c.id: ContractResult() for c in CONTRACTS}
    rank = {"not_run": 0, "passed": 1, "not_implemented": 2, "not_verified": 3, "failed": 4}
    for nodeid, t in state["tests"].items():
        for cid in state["contracts_of"].get(nodeid, []):
            r = results.setdefault(cid, ContractResult())
            r.tests.append(nodeid)
            if t["outcome"] in ("not_verified", "not_implemented") and t["reason"]:
                r.reasons.append(t["reason"])
            if t["outcome"] == "failed" and t["detail"]:
                r.reasons.append(f"{nodeid}: {' '.join(t['detail'].split())}")
            if rank[t["outcome"]] > rank[r.status]:
                r.status = t["outcome"]
    return results


def summarize(results: dict[str, ContractResult]) -> dict[str, Any]:
    """Counts per profile and per family (the row of the compatibility matrix) of the contracts that ran."""
    per_profile: dict[str, dict[str, int]] = {p: dict.fromkeys(STATUSES, 0) for p in PROFILES}
    per_family: dict[str, dict[str, int]] = {}
    for cid, r in results.items():
        if r.status == "not_run" or cid not in BY_ID:
            continue
        per_profile[profile_of(cid)][r.status] += 1
        per_family.setdefault(family_of(cid), dict.fromkeys(STATUSES, 0))[r.status] += 1
    return {"profiles": per_profile, "families": per_family}



def build_report(config: pytest.Config) -> dict[str, Any]:
    state = config.stash[REPORT_KEY]
    results = fold(state)
    chosen = set(selected_profiles(config))
    for cid in list(results):  # a test may also name contracts of a profile that was not asked for
        if cid in BY_ID and profile_of(cid) not in chosen:
            results[cid] = ContractResult()
    urls = target_urls(config)
    return {
        "broker": config.getoption("--queen-broker-name") or (urls[0] if urls else None),
        "urls": urls,
        "profiles_run": selected_profiles(config),
        "required": sorted(required_profiles(config)),
        "contracts": {cid: {"status": r.status, "tests": r.tests, "reasons": r.reasons,
                            "profile": profile_of(cid) if cid in BY_ID else None,
                            "family": family_of(cid), "feature": feature_of(cid) if cid in BY_ID else None,
                            **({"deviation": vars(REFERENCE_DEVIATIONS[cid])} if cid in REFERENCE_DEVIATIONS else {})}
                      for cid, r in results.items()},
        "summary": summarize(results),
        "features": state["features"],
        "tests": state["tests"],
        "measurements": state["measurements"],
        "strict": bool(config.getoption("--queen-strict")),
    }


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = config.stash[REPORT_KEY]
    if not any(state["contracts_of"].get(nodeid) for nodeid in state["tests"]):
        return
    report = build_report(config)
    tr = terminalreporter
    tr.section("queen conformance: contracts")
    missing = {f: v for f, v in state["features"].items() if v["missing"]}
    for cid, r in report["contracts"].items():
        if r["status"] in ("not_run", "not_implemented"):
            continue
        line = f"{LABELS[r['status']]:<13} {cid}"
        if r["status"] != "passed" and r["reasons"]:
            line += f"  -- {r['reasons'][0][:160]}"
        if r["status"] == "failed" and cid in REFERENCE_DEVIATIONS:
            line += f"  [recorded deviation of {REFERENCE_DEVIATIONS[cid].broker}]"
        tr.write_line(line, red=r["status"] == "failed", yellow=r["status"] == "not_verified",
                      green=r["status"] == "passed")
    for feature, v in sorted(missing.items()):
        n = sum(1 for r in report["contracts"].values() if r["status"] == "not_implemented" and r["feature"] == feature)
        tr.write_line(f"NOT IMPLEMENTED {FEATURES[feature]}: {n} contract(s) -- {v['evidence'][:160]}", yellow=True)
    for name, value in state["measurements"].items():
        tr.write_line(f"measured: {name} = {value}")
    tr.write_line("per profile:")
    for prof, counts in report["summary"]["profiles"].items():
        if any(counts.values()):
            tr.write_line(f"  {prof:<11} {cell(counts)}")
    strict = config.getoption("--queen-strict")
    totals = {k: sum(c[k] for c in report["summary"]["profiles"].values()) for k in STATUSES}
    req = report["required"]
    tr.write_line(
        f"contracts: {totals['passed']} passed, {totals['failed']} failed, {totals['not_verified']} not verified, "
        f"{totals['not_implemented']} not implemented"
        f" (NOT VERIFIED {'fails' if strict else 'does not fail'} the gate; NOT IMPLEMENTED "
        + (f"fails it only in the required profiles: {', '.join(req)})" if req else "does not fail it; --require PROFILE makes it fail)")
    )
    path = config.getoption("--queen-report")
    if path:
        Path(path).write_text(json.dumps(report, indent=1, sort_keys=True))
    html_path = config.getoption("--queen-html")
    if html_path:
        from conformance.report import write_html

        write_html(Path(html_path), [report])


# ------------------------------------------------------------------------------------------ features


@pytest.fixture(autouse=True)
def _queen_features(request: pytest.FixtureRequest) -> None:
    """A contract needing a feature the target does not offer is NOT IMPLEMENTED before its test runs
    (one probe per feature per run: conformance/features.py)."""
    ids = contracts_of(request.node)
    needed = sorted({f for f in (feature_of(c) for c in ids if c in BY_ID) if f})
    if not needed:
        return
    from conformance.features import probe

    seen = request.config.stash[REPORT_KEY]["features"]
    for feature in needed:
        if feature not in seen:
            api = request.getfixturevalue("api")
            http = api.target.raw()  # no 5xx check: a probe only looks
            http.headers.update({k: v for k, v in api.http.headers.items() if k.lower() == "authorization"})
            got = probe(feature, http)
            seen[feature] = {"missing": got.missing, "evidence": got.evidence}
        if seen[feature]["missing"]:
            raise NotImplementedFeature(feature, seen[feature]["evidence"])


# ------------------------------------------------------------------------------------------ fixtures


def _claims(token: str | None) -> dict[str, Any]:
    """The (unverified) claims of a JWT, to learn its tenant and sub; {} when not a JWT."""
    if not token:
        return {}
    parts = token.split(".")
    if len(parts) != 3:
        return {}
    try:
        raw = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4))
        claims = json.loads(raw)
    except (ValueError, json.JSONDecodeError):
        return {}
    return claims if isinstance(claims, dict) else {}


@pytest.fixture(scope="session")
def target(pytestconfig: pytest.Config) -> Iterator[Target]:
    urls = target_urls(pytestconfig)
    if not urls:
        raise pytest.UsageError("the conformance suite needs --queen-url (or run `queen conformance`, which starts a broker)")
    targets = [Target(url=u, fire_timeout=pytestconfig.getoption("--queen-fire-timeout"),
                      lag_budget_ms=pytestconfig.getoption("--queen-lag-budget-ms")) for u in urls]
    _OTHERS[:] = targets[1:]
    yield targets[0]
    for t in targets:
        t.close()


# The other brokers of the deployment (--queen-url given more than once), set by the target fixture.
_OTHERS: list[Target] = []


@pytest.fixture(scope="session")
def api_other(target: Target, pytestconfig: pytest.Config) -> Api:
    """Tenant A on a second broker of the same deployment. NOT VERIFIED when only one URL was given."""
    if not _OTHERS:
        not_verified("a cross-broker contract: needs a second broker of the same deployment (--url A --url B)")
    return _api(_OTHERS[0], pytestconfig.getoption("--queen-token"), "A@2")


@pytest.fixture(scope="session")
def plan(api: Api) -> dict[str, Any]:
    """Tenant A's effective plan as the target states it (GET /api/v1/usage -> plan), or the documented
    defaults when the target does not say: the edges are read from the target, not assumed."""
    defaults = {"timersHorizonMs": 90 * 86_400_000, "maxPayloadBytes": 1024 * 1024}
    resp = api.http.get("/api/v1/usage")
    data = resp.json() if resp.status_code == 200 and "json" in resp.headers.get("content-type", "") else {}
    got = data.get("plan") if isinstance(data, dict) and isinstance(data.get("plan"), dict) else {}
    return {k: got.get(k) if isinstance(got.get(k), int) and got.get(k) > 0 else v for k, v in defaults.items()}


def _api(target: Target, token: str | None, label: str) -> Api:
    claims = _claims(token)
    return target.api(token, label=label, tenant=claims.get("tenant"), sub=claims.get("sub"))


@pytest.fixture(scope="session")
def api(target: Target, pytestconfig: pytest.Config) -> Api:
    """Tenant A, with the grants to produce and consume."""
    return _api(target, pytestconfig.getoption("--queen-token"), "A")


@pytest.fixture
def api_b(target: Target, pytestconfig: pytest.Config) -> Api:
    token = pytestconfig.getoption("--queen-token-b")
    if not token:
        not_verified("needs a second tenant's credential (--queen-token-b)")
    b = _api(target, token, "B")
    a_tenant = _claims(pytestconfig.getoption("--queen-token")).get("tenant")
    if a_tenant is not None and a_tenant == b.tenant:
        not_verified("--queen-token-b names the same tenant as --queen-token")
    return b


@pytest.fixture
def api_produce_only(target: Target, pytestconfig: pytest.Config) -> Api:
    token = pytestconfig.getoption("--queen-token-produce-only")
    if not token:
        not_verified("needs a tenant A credential with only the produce grant (--queen-token-produce-only)")
    return _api(target, token, "A-produce-only")


@pytest.fixture
def api_consume_only(target: Target, pytestconfig: pytest.Config) -> Api:
    token = pytestconfig.getoption("--queen-token-consume-only")
    if not token:
        not_verified("needs a tenant A credential without the produce grant (--queen-token-consume-only)")
    return _api(target, token, "A-consume-only")


@pytest.fixture
def admin(target: Target, api: Api, pytestconfig: pytest.Config) -> Any:
    from conformance.client import Admin

    if not pytestconfig.getoption("--queen-allow-cluster-changes"):
        not_verified("changes operator state (plans, pauses, switches, suspension) that other tenants of the target "
                     "may feel: opt in with --allow-cluster-changes")
    token = pytestconfig.getoption("--queen-admin-token")
    if not token and api.token:
        not_verified("needs an operator credential (--queen-admin-token)")
    adm = Admin(_api(target, token, "admin"))
    adm.probe()
    return adm


@pytest.fixture
def operator(target: Target, api: Api, pytestconfig: pytest.Config) -> Api:
    """The operator credential on the wire every Queen broker has (no probe of this broker's /api/v1/admin
    routes): for core contracts that need the admin grant, such as deleting a queue. Same opt-in as admin."""
    if not pytestconfig.getoption("--queen-allow-cluster-changes"):
        not_verified("uses the operator credential, which the run may use only with --allow-cluster-changes")
    token = pytestconfig.getoption("--queen-admin-token")
    if not token and api.token:
        not_verified("needs an operator credential (--queen-admin-token)")
    return _api(target, token, "operator")


@pytest.fixture
def hooks(target: Target, api: Api) -> Any:
    from conformance.client import Hooks

    h = Hooks(api)
    h.probe()
    return h


@pytest.fixture
def measure(pytestconfig: pytest.Config) -> Any:
    """``measure(name, value)``: a number worth reading (e.g. fire lag), printed in the summary and kept
    in the JSON report. Never a verdict by itself."""
    def record(name: str, value: Any) -> None:
        pytestconfig.stash[REPORT_KEY]["measurements"][name] = value

    return record


@pytest.fixture
def tenant_a(api: Api) -> str:
    if not api.tenant:
        # not a JWT with a tenant claim (or no token at all): ask the broker, if it answers whoami
        resp = api.http.get("/api/v1/whoami")
        data = resp.json() if resp.status_code == 200 and "json" in resp.headers.get("content-type", "") else {}
        if isinstance(data, dict) and isinstance(data.get("tenant"), str):
            api.tenant = data["tenant"]
            api.sub = api.sub or data.get("sub")
    if not api.tenant:
        not_verified("cannot tell tenant A's id (the token is not a JWT with a tenant claim and GET /api/v1/whoami "
                     "does not say)")
    return api.tenant

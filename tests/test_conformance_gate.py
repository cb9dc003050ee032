"""The conformance gate: (1) the whole suite against our broker (two `queen serve` on one database, so the
cross-broker contracts run too; operator-state contracts opted in) passes (every contract passed, or NOT
VERIFIED with a reason; none failed), and so does our broker in its default configuration (one `queen
serve` with nothing set: authentication off, no encryption keys, no hooks); (2) the suite catches every mutant of conformance/mutants.py, each
run through the proxy with only the tests of the contracts that mutant breaks (side by side, with fresh
tenants per run, except runs that flip cluster-wide switches, which go one at a time).

The suite runs in a subprocess (``python -m conformance.runner``), exactly as a user's CI runs it.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.process.localserver import LocalBroker
from conformance.mutants import MUTANTS
from conformance.plugin import cluster_wide_contracts
from conformance.runner import local_env, mint_tokens

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def conf_broker(pg, tmp_path_factory) -> Iterator[tuple[list[LocalBroker], dict[str, str], str]]:
    """Two `queen serve` on ONE database (a deployment): the suite spreads its calls over both, so the
    cross-broker contracts run. They share the secret and the key ring, as brokers of one cell do."""
    secret = secrets.token_urlsafe(24)
    env, dsn, logs = local_env(secret), pg.new_db(), tmp_path_factory.mktemp("conformance")
    brokers = [LocalBroker(dsn=dsn, workers=2, env=env, log_path=logs / f"broker-{i}.log") for i in range(2)]
    try:
        for b in brokers:
            b.start()
        yield brokers, mint_tokens(secret), secret
    finally:
        for b in brokers:
            b.stop()


def suite_args(tokens: dict[str, str], report: Path) -> list[str]:
    argv = ["--report", str(report), "-q", "--allow-cluster-changes"]
    for opt, key in (("--token", "token"), ("--token-b", "token_b"), ("--admin-token", "admin_token"),
                     ("--token-produce-only", "token_produce_only"), ("--token-consume-only", "token_consume_only")):
        argv += [opt, tokens[key]]
    return argv


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_")}


def _report(report: Path) -> dict[str, Any]:
    return json.loads(report.read_text()) if report.exists() else {"contracts": {}, "tests": {}}


def run_suite(urls: list[str], tokens: dict[str, str], report: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    argv = [sys.executable, "-m", "conformance.runner", *suite_args(tokens, report)]
    for url in urls:
        argv += ["--url", url]
    proc = subprocess.run(argv + list(extra), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    return proc.returncode, _report(report), proc.stdout[-6000:] + proc.stderr[-2000:]


@pytest.fixture(scope="module")
def baseline(conf_broker, tmp_path_factory) -> tuple[int, dict[str, Any], str]:
    brokers, tokens, _secret = conf_broker
    return run_suite([b.url for b in brokers], tokens, tmp_path_factory.mktemp("baseline") / "report.json")


def test_suite_passes_against_our_broker(baseline):
    code, report, out = baseline
    contracts = report["contracts"]
    assert contracts, f"the suite produced no report:\n{out}"
    failed = {cid: r["reasons"] for cid, r in contracts.items() if r["status"] == "failed"}
    assert not failed, "contracts failing against our broker:\n" + "\n".join(
        f"{cid}: {reasons[:1]}" for cid, reasons in sorted(failed.items()))
    not_run = [cid for cid, r in contracts.items() if r["status"] == "not_run"]
    assert not not_run, f"contracts with no test run: {not_run}"
    silent = [cid for cid, r in contracts.items() if r["status"] == "not_verified" and not all(r["reasons"])]
    assert not silent, f"NOT VERIFIED without a reason: {silent}"
    missing = [cid for cid, r in contracts.items() if r["status"] == "not_implemented"]
    assert not missing, f"our broker reported NOT IMPLEMENTED: {missing}"
    assert code == 0, out


def test_suite_passes_against_the_default_configuration(pg, tmp_path):
    """`queen serve` as installed, nothing configured (auth off, no key ring, no hooks): every contract
    passes or is NOT VERIFIED with a reason (no credential, no hooks...), and our broker offers every
    feature (nothing NOT IMPLEMENTED)."""
    b = LocalBroker(dsn=pg.new_db(), workers=2, env={}, log_path=tmp_path / "default-broker.log")
    b.start()
    try:
        argv = [sys.executable, "-m", "conformance.runner", "--url", b.url, "--allow-cluster-changes", "-q",
                "--report", str(tmp_path / "report.json")]
        proc = subprocess.run(argv, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    finally:
        b.stop()
    out = proc.stdout[-6000:] + proc.stderr[-2000:]
    contracts = _report(tmp_path / "report.json")["contracts"]
    failed = {cid: r["reasons"][:1] for cid, r in contracts.items() if r["status"] in ("failed", "not_implemented")}
    assert contracts and not failed, f"the default configuration fails: {failed}\n{out}"
    assert proc.returncode == 0, out


def test_two_brokers_pass_the_cross_broker_contracts(baseline):
    """Our CI runs the suite against a deployment of two brokers on one database: every cross-broker
    contract (XB-*) is verified there, not just NOT VERIFIED for want of a second URL."""
    contracts = baseline[1]["contracts"]
    xb = {cid: r["status"] for cid, r in contracts.items() if cid.startswith("XB-")}
    assert xb and all(st == "passed" for st in xb.values()), xb


@pytest.fixture(scope="module")
def mutant_runs(conf_broker, baseline, tmp_path_factory) -> dict[str, tuple[int, dict[str, Any], str]]:
    """Every mutant's run, after the baseline, through ``python -m conformance.gate``: one process that
    imports the suite once and forks a run per mutant, four side by side; runs whose tests flip a
    cluster-wide switch (sweeper pause, scheduling switch, suspension) go one at a time, after the others.
    Fresh tenants per run: runs side by side never share a plan, a switch or a meter. A mutant of the
    second broker of the pair (``second_only``) gets the first broker directly and the proxy second."""
    brokers, _tokens, secret = conf_broker
    workdir = tmp_path_factory.mktemp("mutants")
    wide = cluster_wide_contracts()
    jobs = []
    for name in sorted(MUTANTS):
        m = MUTANTS[name]
        selection = [a for cid in m.breaks for a in ("--contract", cid)] + list(m.suite_args)
        jobs.append({
            "name": name, "mutant": name, "serial": bool(set(m.breaks) & wide),
            "behind": (brokers[1] if m.second_only else brokers[0]).url,
            "first": brokers[0].url if m.second_only else None,
            "args": suite_args(mint_tokens(secret), workdir / f"{name}.json") + selection,
            "log": str(workdir / f"{name}.log"),
        })
    spec, out = workdir / "jobs.json", workdir / "codes.json"
    spec.write_text(json.dumps({"parallel": 4, "jobs": jobs}))
    proc = subprocess.run([sys.executable, "-m", "conformance.gate", "--jobs", str(spec), "--out", str(out)],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    codes = json.loads(out.read_text())
    runs: dict[str, tuple[int, dict[str, Any], str]] = {}
    for job in jobs:
        log = Path(job["log"])
        text = log.read_text(errors="replace") if log.exists() else ""
        runs[job["name"]] = (codes.get(job["name"], -1), _report(workdir / f"{job['name']}.json"), text[-6000:])
    return runs


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_suite_catches_mutant(name, baseline, mutant_runs):
    mutant = MUTANTS[name]
    base = baseline[1]["contracts"]
    not_passing = [cid for cid in mutant.breaks if base.get(cid, {}).get("status") != "passed"]
    assert not not_passing, (
        f"mutant {name} proves nothing: against the unmutated broker {not_passing} do not pass "
        f"({[base.get(c, {}).get('status') for c in not_passing]})")
    code, report, out = mutant_runs[name]
    statuses = {cid: report["contracts"].get(cid, {}).get("status") for cid in mutant.breaks}
    assert code != 0, f"mutant {name} ({mutant.bug}) went unnoticed: exit 0\n{out}"
    missed = [cid for cid, st in statuses.items() if st != "failed"]
    assert not missed, f"mutant {name} ({mutant.bug}): contracts not reported FAILED: {statuses}\n{out}"

"""The conformance runner and plugin as a user meets them: --list, a local broker started by the runner,
JUnit output, the NOT VERIFIED outcome and --strict, and the catalogue meta-test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from conformance import runner
from conformance.catalogue import CONTRACTS

ROOT = Path(__file__).resolve().parent.parent


def _run(args: list[str], env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_")}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "conformance.runner", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)


def test_list_prints_every_contract_with_its_tests(capsys):
    assert runner.main(["--list"]) == 0
    out = capsys.readouterr().out
    for c in CONTRACTS:
        assert f"{c.id}  [" in out
    assert "(no test!)" not in out
    assert "test: test_timers_routes.py::test_delete_cancels" in out
    assert f"{len(CONTRACTS)} contracts" in out


def test_catalogue_meta_test():
    from conformance.test_catalogue import test_every_contract_has_a_test_and_every_test_a_known_contract

    test_every_contract_has_a_test_and_every_test_a_known_contract()


def test_runner_starts_its_own_broker_and_writes_junit(pg, tmp_path):
    junit, report = tmp_path / "junit.xml", tmp_path / "report.json"
    proc = _run(["--contract", "ENV-NO-SUCH-ROUTE", "--contract", "TMR-PEEK-MISS", "--junitxml", str(junit),
                 "--report", str(report), "-q"], {"QUEEN_DATABASE_URL": pg.new_db()})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    suite = ET.parse(junit).getroot()
    cases = suite.iter("testcase")
    assert sum(1 for _ in cases) >= 2
    data = json.loads(report.read_text())
    assert data["contracts"]["ENV-NO-SUCH-ROUTE"]["status"] == "passed"
    assert data["contracts"]["TMR-PEEK-MISS"]["status"] == "passed"
    assert "queen conformance: contracts" in proc.stdout


def test_not_verified_is_reported_and_strict_fails(broker, tmp_path):
    # the shared test broker runs without authentication: no second tenant can exist
    junit, report = tmp_path / "junit.xml", tmp_path / "report.json"
    proc = _run(["--url", broker.url, "--contract", "TMR-ABSENT-OTHER-TENANT", "--junitxml", str(junit),
                 "--report", str(report), "-q"])
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "NOT VERIFIED" in proc.stdout
    c = json.loads(report.read_text())["contracts"]["TMR-ABSENT-OTHER-TENANT"]
    assert c["status"] == "not_verified" and any("--queen-token-b" in r for r in c["reasons"]), c
    skipped = [s for s in ET.parse(junit).getroot().iter("skipped")]
    assert skipped and "NOT VERIFIED" in (skipped[0].get("message") or ""), "JUnit shows the reason"

    strict = _run(["--url", broker.url, "--contract", "TMR-ABSENT-OTHER-TENANT", "--strict",
                   "--report", str(report), "-q"])
    assert strict.returncode == 1, strict.stdout[-3000:]
    assert json.loads(report.read_text())["contracts"]["TMR-ABSENT-OTHER-TENANT"]["status"] == "failed"


def test_staging_safe_and_single_url_are_not_verified_with_reasons(broker, tmp_path):
    """Against one URL without --allow-cluster-changes: the cross-broker contracts and the contracts that
    change operator state are NOT VERIFIED, each with the reason that says how to run them."""
    report = tmp_path / "report.json"
    proc = _run(["--url", broker.url, "--contract", "XB-PUSH-POP", "--contract", "LIM-CLUSTER-SUSPENDED",
                 "--report", str(report), "-q"])
    assert proc.returncode == 0, proc.stdout[-3000:]
    contracts = json.loads(report.read_text())["contracts"]
    xb, lim = contracts["XB-PUSH-POP"], contracts["LIM-CLUSTER-SUSPENDED"]
    assert xb["status"] == "not_verified" and any("--url A --url B" in r for r in xb["reasons"]), xb
    assert lim["status"] == "not_verified" and any("--allow-cluster-changes" in r for r in lim["reasons"]), lim


def test_list_shows_the_families():
    proc = _run(["--list"])
    assert proc.returncode == 0
    for family in ("LOG ", "EDGE ", "XB "):
        assert family in proc.stdout.split("by family:")[1].splitlines()[0], proc.stdout[-500:]
    assert "Sentences of the README's Message log section without an id" in proc.stdout

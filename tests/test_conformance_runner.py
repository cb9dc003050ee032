"""The conformance runner and plugin as a user meets them: --list, a local broker started by the runner,
JUnit output, the NOT VERIFIED outcome and --strict, and the catalogue meta-test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

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


# ------------------------------------------------------------------ profiles, outcomes, the reference run


def _proxied(broker_url: str, mutant: Any) -> Any:
    from conformance.mutants import MutantProxy

    return MutantProxy(broker_url, mutant)


def _push_answers_200(req: Any, resp: Any, st: dict[str, Any]) -> Any:
    """A broker that answers a push 200 instead of 201 (the C++ Queen does): allowed by the protocol."""
    if req.method == "POST" and req.path == "/api/v1/push" and resp.status == 201:
        resp.status = 200
    return resp


def _configure_refused(req: Any, st: dict[str, Any]) -> Any:
    from conformance.mutants import Resp

    if req.method == "POST" and req.path == "/api/v1/configure":
        return Resp(400, {"Content-Type": "application/json"}, b'{"error": "configure is down here"}')
    return req


def test_profile_picks_contracts_and_the_report_counts_per_profile(broker, tmp_path):
    report = tmp_path / "report.json"
    proc = _run(["--url", broker.url, "--profile", "strict", "--contract", "LOG-POP-204", "--contract", "LOG-POP-EMPTY",
                 "--report", str(report), "-q"])
    assert proc.returncode == 0, proc.stdout[-3000:]
    data = json.loads(report.read_text())
    assert data["profiles_run"] == ["strict"]
    assert data["contracts"]["LOG-POP-204"]["status"] == "passed"
    assert data["contracts"]["LOG-POP-EMPTY"]["status"] == "not_run", "a core contract ran under --profile strict"
    assert data["summary"]["profiles"]["strict"]["passed"] == 1
    assert "  strict      1 passed" in proc.stdout
    bad = _run(["--url", broker.url, "--profile", "core,nonsense", "-q"])
    assert bad.returncode != 0 and "unknown profile" in (bad.stdout + bad.stderr)


def test_core_accepts_any_2xx_and_strict_pins_201(broker, tmp_path):
    from conformance.mutants import Mutant

    report = tmp_path / "report.json"
    with _proxied(broker.url, Mutant("push-200", (), "push answers 200", on_response=_push_answers_200)) as url:
        proc = _run(["--url", url, "--contract", "LOG-PUSH-ARRAY", "--contract", "LOG-PUSH-201",
                     "--contract", "LOG-POP-FIFO", "--report", str(report), "-q"])
    contracts = json.loads(report.read_text())["contracts"]
    assert contracts["LOG-PUSH-ARRAY"]["status"] == "passed", contracts["LOG-PUSH-ARRAY"]
    assert contracts["LOG-POP-FIFO"]["status"] == "passed", "a 200 push is a fine setup step"
    assert contracts["LOG-PUSH-201"]["status"] == "failed"
    assert proc.returncode == 1


def test_a_failed_setup_step_is_not_verified_with_its_reason(broker, tmp_path):
    from conformance.mutants import Mutant

    report = tmp_path / "report.json"
    with _proxied(broker.url, Mutant("configure-down", (), "configure refused", on_request=_configure_refused)) as url:
        proc = _run(["--url", url, "--contract", "LOG-LEASE-EXPIRY", "--report", str(report), "-q"])
    c = json.loads(report.read_text())["contracts"]["LOG-LEASE-EXPIRY"]
    assert c["status"] == "not_verified", c
    assert any("setup step failed (configure)" in r for r in c["reasons"]), c
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_not_implemented_is_reported_once_per_feature_and_fails_only_when_required(broker, tmp_path):
    report = tmp_path / "report.json"
    args = ["--contract", "LOG-PUSH-BINARY", "--contract", "LOG-TX-BINARY", "--contract", "LOG-PUSH-BINARY-FRAMES",
            "--report", str(report), "-q"]
    with _proxied(broker.url, "binary-body-refused") as url:
        proc = _run(["--url", url, *args])
        required = _run(["--url", url, *args[:-3], "--require", "extensions", "--report", str(tmp_path / "r.json"), "-q"])
    assert proc.returncode == 0, proc.stdout[-3000:]
    data = json.loads(report.read_text())
    assert {data["contracts"][c]["status"] for c in ("LOG-PUSH-BINARY", "LOG-TX-BINARY", "LOG-PUSH-BINARY-FRAMES")} \
        == {"not_implemented"}
    assert proc.stdout.count("NOT IMPLEMENTED the binary push and transaction bodies") == 1, proc.stdout[-2000:]
    assert data["features"]["binary"]["missing"] is True
    assert data["summary"]["families"]["LOG"]["not_implemented"] == 3
    assert required.returncode == 1, required.stdout[-3000:]
    assert json.loads((tmp_path / "r.json").read_text())["contracts"]["LOG-PUSH-BINARY"]["status"] == "failed"


def test_reference_run_prints_the_matrix_and_writes_both_reports(broker, tmp_path):
    from conformance.mutants import Mutant

    report, page = tmp_path / "compat.json", tmp_path / "compat.html"
    with _proxied(broker.url, Mutant("push-200", (), "push answers 200", on_response=_push_answers_200)) as ref:
        proc = _run(["--url", broker.url, "--url-reference", ref, "--reference-name", "ref-200", "--name", "ours",
                     "--contract", "LOG-PUSH-ARRAY", "--contract", "LOG-PUSH-201", "--report", str(report),
                     "--html", str(page), "-q"])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "compatibility matrix (families)" in proc.stdout
    doc = json.loads(report.read_text())
    assert doc["brokers"] == ["ours", "ref-200"]
    header, rows = doc["matrix"]["profiles"]
    assert header == ["profile", "ours", "ref-200"]
    assert ["core", "2 passed", "2 passed"] in rows and ["strict", "1 passed", "1 failed"] in rows, rows
    assert "ref-200" in page.read_text()


def _no_lookup(req: Any, st: dict[str, Any]) -> Any:
    from conformance.mutants import Resp

    if req.path == "/api/v1/messages/lookup":
        return Resp(404, {"Content-Type": "text/plain"}, b"Not found")
    return req


def test_core_contracts_do_not_need_the_lookup_extension(broker, tmp_path):
    """Core contracts check what is stored through the lookup route where a broker offers it, else through
    what a new consumer group reads: a broker without the lookup route passes them, and LOG-LOOKUP alone
    reads NOT IMPLEMENTED."""
    from conformance.mutants import Mutant

    report = tmp_path / "report.json"
    with _proxied(broker.url, Mutant("no-lookup", (), "no lookup route", on_request=_no_lookup)) as url:
        proc = _run(["--url", url, "--contract", "LOG-PUSH-TXN-MINTED", "--contract", "LOG-TXN-MALFORMED-400",
                     "--contract", "LOG-LOOKUP", "--report", str(report), "-q"])
    assert proc.returncode == 0, proc.stdout[-3000:]
    contracts = json.loads(report.read_text())["contracts"]
    assert contracts["LOG-PUSH-TXN-MINTED"]["status"] == "passed", contracts["LOG-PUSH-TXN-MINTED"]
    assert contracts["LOG-TXN-MALFORMED-400"]["status"] == "passed", contracts["LOG-TXN-MALFORMED-400"]
    assert contracts["LOG-LOOKUP"]["status"] == "not_implemented"

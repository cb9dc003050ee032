"""Schemathesis against a live broker, in the default test run (bounded: a few examples per operation).

Every operation of broker/openapi.yaml is called with generated requests, valid and invalid, on a broker
of its own (test hooks on, auth off: the fuzzer may flip the cluster's switches without disturbing the
shared broker). Each answer must not be a 5xx and must conform to the document: a documented status, the
documented content type, headers and body schema; a request the document calls invalid must be refused
(4xx). Then the stateful phase follows the document's links (schedule -> peek -> cancel; push -> pop ->
ack; pop -> lease extend; ...).

Three things are tamed before a call, not in the document (which says the truth): a long poll waits at
most 200 ms instead of up to 300 s, the sleep hook sleeps at most 50 ms, and the operator switches of the
KV surface and of timer scheduling are only switched on (off, every later call of that surface answers a
legitimate 503, which the no-5xx check would count against the broker).

``QUEEN_FUZZ_EXAMPLES`` (default 6) sets the examples per operation.
"""

from __future__ import annotations

import copy
import os
import re
from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig

from broker.http.openapi import document
from broker.process.localserver import LocalBroker

METHODS = ("get", "put", "post", "delete", "patch")
EXAMPLES = int(os.environ.get("QUEEN_FUZZ_EXAMPLES", "6"))
CALLS: Counter[str] = Counter()
STATEFUL: Counter[str] = Counter()
CHECKS = """
[checks]
enabled = false
not_a_server_error.enabled = true
status_code_conformance.enabled = true
content_type_conformance.enabled = true
response_headers_conformance.enabled = true
response_schema_conformance.enabled = true
negative_data_rejection.enabled = true
"""


@pytest.fixture(scope="module")
def fuzz_broker(pg, tmp_path_factory):  # type: ignore[no-untyped-def]
    b = LocalBroker(
        dsn=pg.new_db(),
        workers=1,
        env={"QUEEN_TEST_HOOKS": "1", "QUEEN_SWEEPER_MAX_SLEEP_MS": "500"},
        log_path=tmp_path_factory.mktemp("fuzz") / "broker.log",
    )
    b.start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def fuzz_schema(fuzz_broker):  # type: ignore[no-untyped-def]
    config = SchemathesisConfig.from_str(
        f'base-url = "{fuzz_broker.url}"\n'
        # The broker ignores query parameters it does not know (the official client sends some it has no
        # use for); only the KV routes refuse them. So an unknown parameter is not "invalid data" here.
        f"[generation]\nmax-examples = {EXAMPLES}\nallow-extra-parameters = false\n"
        "[phases.coverage]\nenabled = false\n" + CHECKS
    )
    return schemathesis.openapi.from_dict(copy.deepcopy(document()), config=config)  # it edits what it is given


SURFACE_SWITCHES = ("/api/v1/admin/kv", "/api/v1/admin/timers/scheduling")


def _tame(case) -> None:  # type: ignore[no-untyped-def]
    if case.path in SURFACE_SWITCHES and isinstance(case.body, dict) and case.body.get("enabled") is False:
        case.body["enabled"] = True  # off, every KV (or schedule) call is a legitimate 503 for the rest of the run
    query = case.query if isinstance(case.query, dict) else None
    if query is None:
        return
    # only numbers over the cap are lowered: an invalid value must still reach the broker (and be refused)
    if "wait" in query and ("timeout" not in query or _over(query["timeout"], 200)):
        query["timeout"] = "200"
    if case.path == "/api/v1/test/sleep" and ("ms" not in query or _over(query["ms"], 50)):
        query["ms"] = "50"


def _over(value: object, cap: int) -> bool:
    """Would the broker wait longer than ``cap``? An empty value means the default (30 s, 1 s), which is;
    a value that is not a number is refused before any wait, so it is left for the broker to refuse."""
    if isinstance(value, list):  # a repeated parameter: the broker reads the first
        value = value[0] if value else ""
    if value in ("", None):
        return True
    try:
        return int(value) > cap  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return False


def _run_operation(op, mode: GenerationMode) -> None:  # type: ignore[no-untyped-def]
    @given(case=op.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(case) -> None:  # type: ignore[no-untyped-def]
        _tame(case)
        CALLS[f"{mode.value} {op.label}"] += 1
        case.call_and_validate(timeout=30)

    try:
        run()
    except Unsatisfiable:
        # Negative mode on an operation with nothing to break (no parameters, no body, or only free-form
        # strings): hypothesis finds no invalid input at all, which is not a failure of the broker.
        if mode is not GenerationMode.NEGATIVE:
            raise
        CALLS[f"{mode.value} {op.label}"] += 0


def _summary(exc: BaseException) -> str:
    """One failure per line: schemathesis's titles and its curl reproduction."""
    text = str(exc)
    if isinstance(exc, BaseExceptionGroup):
        text += "".join(f"\n  - {type(e).__name__}: {str(e)[:600]}" for e in exc.exceptions)
    return f"[{'/'.join(c.__name__ for c in type(exc).__mro__[:3])}] " + text[:8000]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
def test_every_operation_conforms(fuzz_schema, mode):  # type: ignore[no-untyped-def]
    """One hypothesis run per operation (so one operation's failure does not hide the others')."""
    failures = []
    operations = [r.ok() for r in fuzz_schema.get_all_operations()]
    assert len(operations) == sum(1 for item in document()["paths"].values() for m in item if m in METHODS)
    only = os.environ.get("QUEEN_FUZZ_ONLY")  # a regex on "METHOD /path", to chase one failure
    if only:
        operations = [op for op in operations if re.search(only, op.label)]
    for op in operations:
        try:
            _run_operation(op, mode)
        except (Exception, BaseExceptionGroup) as exc:  # collected, reported together below
            failures.append(f"{op.label}: {_summary(exc)}")
    assert not failures, f"{len(failures)} of {len(operations)} operations fail:\n" + "\n\n".join(failures)


def test_stateful_links(fuzz_schema):  # type: ignore[no-untyped-def]
    machine = fuzz_schema.as_state_machine()

    class Tamed(machine):  # type: ignore[misc,valid-type]
        def before_call(self, case) -> None:  # type: ignore[no-untyped-def]
            _tame(case)
            CALLS["stateful"] += 1
            STATEFUL[f"{case.method} {case.operation.path}"] += 1

    Tamed.run(
        settings=settings(
            max_examples=3 * EXAMPLES, stateful_step_count=10, deadline=None, database=None,
            suppress_health_check=list(HealthCheck),
        )
    )


def test_zz_the_broker_logged_no_unhandled_error(fuzz_broker):  # type: ignore[no-untyped-def]
    log = fuzz_broker.log_path.read_text(errors="replace") if fuzz_broker.log_path.exists() else ""
    assert "unhandled error" not in log, log[log.index("unhandled error") - 200:][:4000]


def test_zz_figures(capsys):  # type: ignore[no-untyped-def]
    """Prints what the fuzzer did (operations and calls) for the log; every documented operation was
    called in both modes when the conformance tests ran in this session."""
    ran = {k.split(" ", 1)[1] for k in CALLS if k != "stateful"}
    with capsys.disabled():
        print(f"\nschemathesis: {len(ran)} operations, "
              f"{sum(v for k, v in CALLS.items() if k.startswith('positive'))} positive and "
              f"{sum(v for k, v in CALLS.items() if k.startswith('negative'))} negative generated calls, "
              f"{CALLS['stateful']} stateful calls: {dict(STATEFUL.most_common())}")
    if any(k.startswith("positive") for k in CALLS):
        documented = {f"{m.upper()} {p}" for p, item in document()["paths"].items() for m in item if m in METHODS}
        assert {k.split(" ", 1)[1] for k in CALLS if k.startswith("positive")} == documented

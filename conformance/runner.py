"""``queen conformance``: run the conformance suite against a broker and gate on the result.

    queen conformance --url URL [--url URL2 ...] [--allow-cluster-changes] [--token T] [--token-b T2] [--admin-token A]
                      [--token-produce-only P] [--token-consume-only C] [--profile core,timers] [--require PROFILE]
                      [--junitxml FILE] [--report FILE] [--html FILE] [--strict] [--contract ID ...] [pytest args]
    queen conformance [--url URL] --url-reference URL_B [--reference-token T] [--reference-name NAME] ...
    queen conformance --list

With no ``--url`` the runner starts a broker of its own (``queen serve`` through
``broker.process.localserver.LocalBroker``) on an embedded PostgreSQL in a temporary directory, or on
``QUEEN_DATABASE_URL`` when set, with authentication on (a random ``QUEEN_JWT_SECRET``), the
fault-injection hooks on and short sweeper timings; it mints the tokens for two tenants, an operator
and the two single-grant credentials, and stops everything afterwards.

Profiles (conformance/catalogue.py): ``--profile`` picks some of core, timers, deadlines, strict and
extensions; the default runs all and reports per profile. Outcomes: passed, failed, NOT VERIFIED (a
credential or an opt-in is missing, or a setup step failed: with the reason) and NOT IMPLEMENTED (the
target does not offer a feature: reported once per feature).

``--url-reference URL_B`` runs the suite twice, against the broker under test (``--url``, or a local one)
and against a reference broker (auth off unless ``--reference-token``), and prints the compatibility
matrix (family x broker); ``--report`` then holds both reports and the matrix, ``--html`` the same as a page.
The gate is the broker under test's: the reference's failures are information.

Exit status: 0 when no contract failed; 1 when any failed (and, with ``--strict``, when any could not be
verified; with ``--require P``, when a contract of profile P is not implemented); other pytest codes for
usage errors.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import secrets
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

SUITE_DIR = Path(__file__).resolve().parent

# Settings of the broker the runner starts itself: short sweeper timings so failure paths (backoff,
# DLQ after the attempt budget) finish in about a second while a row in backoff stays observable from
# outside for at least 150 ms, a short limits cache so operator switches show quickly, and a retention pass every 200 ms.
LOCAL_ENV = {
    "QUEEN_TEST_HOOKS": "1",
    "QUEEN_SWEEPER_MAX_SLEEP_MS": "200",
    "QUEEN_SWEEPER_MAX_ATTEMPTS": "3",
    "QUEEN_SWEEPER_BACKOFF_BASE_MS": "150",
    "QUEEN_SWEEPER_BACKOFF_CAP_MS": "600",
    "QUEEN_LIMITS_REFRESH_MS": "50",
    "QUEEN_LOG_RETENTION_INTERVAL_MS": "200",
    "QUEEN_LOG_LEVEL": "WARNING",
}


def local_env(secret: str) -> dict[str, str]:
    key = base64.b64encode(secrets.token_bytes(32)).decode()
    return {**LOCAL_ENV, "QUEEN_JWT_SECRET": secret, "QUEEN_ENCRYPTION_KEYS": f"conf1:{key}"}


def mint_tokens(secret: str) -> dict[str, str]:
    """Tokens for the suite's principals: tenant A (produce+consume), tenant B, an operator, and tenant A
    credentials with only one grant each."""
    from broker.auth import mint

    run = secrets.token_hex(4)
    a, b = f"conf-a-{run}", f"conf-b-{run}"
    return {
        "token": mint(tenant=a, sub="conformance-a", grants=["produce", "consume"], secret=secret),
        "token_b": mint(tenant=b, sub="conformance-b", grants=["produce", "consume"], secret=secret),
        "admin_token": mint(tenant=f"conf-ops-{run}", sub="conformance-operator", grants=["admin"], secret=secret),
        "token_produce_only": mint(tenant=a, sub="conformance-a-producer", grants=["produce"], secret=secret),
        "token_consume_only": mint(tenant=a, sub="conformance-a-consumer", grants=["consume"], secret=secret),
    }


@contextlib.contextmanager
def local_broker(workers: int = 2) -> Iterator[tuple[str, dict[str, str]]]:
    """Start a broker (embedded PostgreSQL or QUEEN_DATABASE_URL), yield (url, tokens), stop it."""
    from broker.process.localserver import LocalBroker

    secret = secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory(prefix="queen-conformance-") as tmp:
        pg = None
        dsn = os.environ.get("QUEEN_DATABASE_URL")
        if not dsn:
            from broker.store import embedded

            print("queen conformance: starting an embedded PostgreSQL ...", file=sys.stderr, flush=True)
            pg = embedded.start(Path(tmp))
            dsn = pg.dsn()
        broker = LocalBroker(dsn=dsn, workers=workers, env=local_env(secret), log_path=Path(tmp) / "broker.log")
        try:
            print("queen conformance: starting a local broker ...", file=sys.stderr, flush=True)
            broker.start()
            yield broker.url, mint_tokens(secret)
        finally:
            broker.stop()
            if pg is not None:
                pg.stop()


def print_catalogue(out=None) -> None:
    from conformance.catalogue import CONTRACTS, INFORMATIVE, INFORMATIVE_LOG, feature_of, profile_of
    from conformance.plugin import contract_index

    out = out or sys.stdout
    index = contract_index()
    for c in CONTRACTS:
        feat = feature_of(c.id)
        print(f"{c.id}  [{c.source}]  profile: {profile_of(c.id)}" + (f", needs: {feat}" if feat else ""), file=out)
        print(textwrap.fill(c.sentence, 100, initial_indent="    ", subsequent_indent="    "), file=out)
        for t in index.get(c.id, []) or ["(no test!)"]:
            print(f"    test: {t}", file=out)
    families: dict[str, int] = {}
    for c in CONTRACTS:
        fam = c.id.split("-")[0]
        families[fam] = families.get(fam, 0) + 1
    print(f"\n{len(CONTRACTS)} contracts", file=out)
    print("by family: " + ", ".join(f"{k} {v}" for k, v in families.items()), file=out)
    profiles: dict[str, int] = {}
    for c in CONTRACTS:
        profiles[profile_of(c.id)] = profiles.get(profile_of(c.id), 0) + 1
    print("by profile: " + ", ".join(f"{k} {v}" for k, v in profiles.items()), file=out)
    print("\nSentences of the timer spec (docs/timer-routes.md) without an id, and why:", file=out)
    for sentence, why in INFORMATIVE:
        print(textwrap.fill(f"- {sentence}  [{why}]", 100, subsequent_indent="  "), file=out)
    print("\nSentences of the README's Message log section without an id, and why:", file=out)
    for sentence, why in INFORMATIVE_LOG:
        print(textwrap.fill(f"- {sentence}  [{why}]", 100, subsequent_indent="  "), file=out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="queen conformance",
        description="Run the Queen conformance suite against a broker (or a local one) and gate on it.",
        epilog="Any other argument is passed to pytest (e.g. -x, -k EXPR, -q).",
    )
    env = os.environ.get
    p.add_argument("--url", action="append", default=[],
                   help="broker base URL (default $QUEEN_URL, comma-separated); repeat it for several brokers of "
                        "one deployment (same database): calls are spread over them and the cross-broker "
                        "contracts run (NOT VERIFIED with one URL); omitted = start a local broker")
    p.add_argument("--token", default=env("QUEEN_TOKEN"), help="bearer token of tenant A, produce + consume ($QUEEN_TOKEN)")
    p.add_argument("--token-b", default=env("QUEEN_TOKEN_B"),
                   help="bearer token of a second tenant B, for isolation contracts ($QUEEN_TOKEN_B)")
    p.add_argument("--admin-token", default=env("QUEEN_ADMIN_TOKEN"),
                   help="operator token (admin grant): switches, plans ($QUEEN_ADMIN_TOKEN)")
    p.add_argument("--cell-url-a", default=env("QUEEN_CELL_URL_A"),
                   help="with --url a proxy in front of cells: direct URL of tenant A's cell (CELL contracts)")
    p.add_argument("--cell-url-b", default=env("QUEEN_CELL_URL_B"), help="direct URL of tenant B's cell")
    p.add_argument("--token-produce-only", help="tenant A token with only the produce grant")
    p.add_argument("--token-consume-only", help="tenant A token without the produce grant")
    p.add_argument("--junitxml", help="write JUnit XML here (NOT VERIFIED shows as skipped with its reason)")
    p.add_argument("--report", help="write a JSON report (per contract and per test) here")
    p.add_argument("--strict", action="store_true", help="NOT VERIFIED fails the gate")
    p.add_argument("--contract", action="append", default=[], help="only the tests of this contract id (repeatable)")
    p.add_argument("--fire-timeout", type=float, help="seconds to wait for a timer to fire (default 20)")
    p.add_argument("--allow-cluster-changes", action="store_true",
                   help="also run the contracts that change operator state (suspend the cluster, pause the "
                        "sweeper, switch scheduling off, set tenant plans); without it they are NOT VERIFIED, so "
                        "a gate against a shared staging cell disturbs nobody (implied for the local broker)")
    p.add_argument("--profile", action="append", default=[],
                   help="run only these profiles (comma-separated, repeatable): core, timers, deadlines, strict, "
                        "extensions; default all, reported per profile")
    p.add_argument("--require", action="append", default=[],
                   help="profiles whose NOT IMPLEMENTED contracts fail the gate (comma-separated, repeatable)")
    p.add_argument("--html", help="write an HTML report (matrix, per contract) here")
    p.add_argument("--name", help="the broker's name in the reports and the matrix (default its URL)")
    p.add_argument("--url-reference", help="also run the suite against this reference broker and print the "
                                           "compatibility matrix of both")
    p.add_argument("--reference-token", help="bearer token for the reference broker (default none: auth off)")
    p.add_argument("--reference-name", default="reference", help="the reference broker's name in the matrix")
    p.add_argument("--reference-allow-cluster-changes", action="store_true",
                   help="--allow-cluster-changes for the reference too (a reference nobody else uses)")
    p.add_argument("--list", action="store_true", help="print the contract catalogue with its tests and exit")
    return p


def pytest_args(args: argparse.Namespace, urls: list[str], tokens: dict[str, str | None], extra: list[str],
                allow_cluster_changes: bool = False) -> list[str]:
    # Hermetic: the suite's own (empty) configuration, whatever directory the user runs it from.
    argv = [str(SUITE_DIR), "-c", os.devnull, "--rootdir", str(SUITE_DIR.parent), "-p", "no:cacheprovider"]
    for url in urls:
        argv += ["--queen-url", url]
    if args.allow_cluster_changes or allow_cluster_changes:
        argv.append("--queen-allow-cluster-changes")
    for opt, key in (("--queen-token", "token"), ("--queen-token-b", "token_b"), ("--queen-admin-token", "admin_token"),
                     ("--queen-token-produce-only", "token_produce_only"),
                     ("--queen-token-consume-only", "token_consume_only")):
        if tokens.get(key):
            argv += [opt, str(tokens[key])]
    for opt, value in (("--queen-cell-url-a", getattr(args, "cell_url_a", None)),
                       ("--queen-cell-url-b", getattr(args, "cell_url_b", None))):
        if value:
            argv += [opt, value]
    if args.junitxml:
        argv += ["--junitxml", args.junitxml]
    if args.report:
        argv += ["--queen-report", args.report]
    if args.strict:
        argv.append("--queen-strict")
    for cid in args.contract:
        argv += ["--queen-contract", cid]
    if args.fire_timeout:
        argv += ["--queen-fire-timeout", str(args.fire_timeout)]
    for prof in args.profile:
        argv += ["--queen-profile", prof]
    for prof in args.require:
        argv += ["--queen-require", prof]
    if args.html:
        argv += ["--queen-html", args.html]
    if args.name:
        argv += ["--queen-broker-name", args.name]
    return argv + extra


_REFERENCE_OPTS = ("--url-reference", "--reference-token", "--reference-name", "--report", "--html", "--name")
_REFERENCE_FLAGS = ("--reference-allow-cluster-changes",)


def _strip(argv: list[str], options: tuple[str, ...], flags: tuple[str, ...] = ()) -> list[str]:
    """argv without these options and their values (``--opt V`` and ``--opt=V``) and these flags."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in flags:
            continue
        if a in options:
            skip = True
            continue
        if a.split("=", 1)[0] in options:
            continue
        out.append(a)
    return out


def reference_run(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    """The suite against the broker under test, then against the reference, each in its own process (as a
    user's CI runs it); prints the compatibility matrix and writes the combined reports."""
    import json
    import subprocess

    from conformance import report as rep

    common = _strip(argv, _REFERENCE_OPTS, flags=_REFERENCE_FLAGS)
    ours_name = args.name or (", ".join(args.url) if args.url else "queen-broker (local)")
    with tempfile.TemporaryDirectory(prefix="queen-conformance-ref-") as tmp:
        runs = []
        ours_argv = [*common, "--report", f"{tmp}/ours.json", "--name", ours_name]
        # the reference: same selection and pytest arguments, its own URL and credential, no operator opt-in
        # unless asked for (its other tenants are not ours to disturb)
        base = _strip(common, ("--url", "--token", "--token-b", "--admin-token", "--token-produce-only",
                               "--token-consume-only"), flags=("--allow-cluster-changes",))
        ref_argv = [*base, "--url", args.url_reference, "--report", f"{tmp}/ref.json", "--name", args.reference_name]
        if args.reference_token:
            ref_argv += ["--token", args.reference_token]
        if args.reference_allow_cluster_changes:
            ref_argv.append("--allow-cluster-changes")
        codes = []
        for label, run_argv, path in (("under test", ours_argv, f"{tmp}/ours.json"),
                                      ("reference", ref_argv, f"{tmp}/ref.json")):
            print(f"queen conformance: the broker {label} ...", file=sys.stderr, flush=True)
            codes.append(subprocess.run([sys.executable, "-m", "conformance.runner", *run_argv]).returncode)
            if Path(path).exists():
                runs.append(json.loads(Path(path).read_text()))
        if len(runs) != 2:
            print("queen conformance: a run wrote no report (see its output above)", file=sys.stderr)
            return codes[0] or 2
        doc = rep.compare(runs)
        print("\ncompatibility matrix (profiles):\n" + rep.text(*doc["matrix"]["profiles"]))
        print("\ncompatibility matrix (families):\n" + rep.text(*doc["matrix"]["families"]))
        for name, failed in doc["core_failed"].items():
            if failed:
                print(f"\ncore contracts failed by {name}:")
                from conformance.catalogue import REFERENCE_DEVIATIONS

                for cid in failed:
                    d = REFERENCE_DEVIATIONS.get(cid)
                    print(f"  {cid}" + (f"  [recorded deviation: {d.what}]" if d else ""))
        if args.report:
            Path(args.report).write_text(json.dumps(doc, indent=1, sort_keys=True))
        if args.html:
            rep.write_html(Path(args.html), runs)
    return codes[0]


def main(argv: list[str] | None = None) -> int:
    # Third-party pytest plugins installed next to the suite (reorderers, xdist, asyncio...) stay out of a
    # gate run unless asked for with -p NAME; this also halves the start-up cost.
    os.environ.setdefault("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    import pytest

    args, extra = build_parser().parse_known_args(argv)
    if args.url_reference:
        return reference_run(args, extra, list(sys.argv[1:] if argv is None else argv))
    if args.list:
        try:
            print_catalogue()
        except BrokenPipeError:  # `queen conformance --list | head`
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the interpreter's flush at exit
        return 0
    tokens: dict[str, str | None] = {
        "token": args.token, "token_b": args.token_b, "admin_token": args.admin_token,
        "token_produce_only": args.token_produce_only, "token_consume_only": args.token_consume_only,
    }
    urls = list(args.url) or [u for u in (os.environ.get("QUEEN_URL") or "").split(",") if u.strip()]
    if urls:
        return int(pytest.main(pytest_args(args, urls, tokens, extra)))
    with local_broker() as (url, minted):
        # our own throw-away broker: nobody else to disturb
        return int(pytest.main(pytest_args(args, [url], {**minted}, extra, allow_cluster_changes=True)))


if __name__ == "__main__":
    raise SystemExit(main())

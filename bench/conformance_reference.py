"""The conformance suite against our broker and a locally built C++ Queen in one run: the compatibility matrix.

    .venv/bin/python bench/conformance_reference.py --cpp-bin D/server/bin/queen-server [--out DIR]
                                                    [--profile core] [-- pytest args]

It starts, on one PostgreSQL server (QUEEN_BENCH_DATABASE_URL / QUEEN_TEST_DATABASE_URL, else an embedded
one in a temporary directory), each broker on a fresh database of its own: ours as ``queen conformance``
starts its local broker (auth on, a key ring, the fault-injection hooks, short sweeper timings, every
token minted; operator contracts opted in), and the C++ Queen through bench/cpp_queen.py (its defaults:
authentication off). Then it runs ``queen conformance --url OURS --url-reference CPP`` (conformance/
runner.py: the suite twice, each in its own process) and writes DIR/compatibility.json (both reports, the
matrices, the core contracts each broker failed, the recorded deviations) and DIR/compatibility.html.

The C++ Queen is built outside this repository, never vendored into it: how, in the docstring of
bench/bench_log_shape.py. The CI of this repository cannot build it; this is run by hand, and what it
printed goes to docs/reference/compatibility.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cpp_queen import CppQueen  # noqa: E402
from bench.db import new_db  # noqa: E402
from broker.process.localserver import LocalBroker  # noqa: E402
from conformance import runner  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(prog="bench/conformance_reference.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--cpp-bin", default=os.environ.get("QUEEN_BENCH_CPP_BIN"), required=not os.environ.get("QUEEN_BENCH_CPP_BIN"),
                   help="the built C++ Queen: D/server/bin/queen-server ($QUEEN_BENCH_CPP_BIN)")
    p.add_argument("--cpp-name", default="C++ Queen 0.15.1", help="its name in the matrix")
    p.add_argument("--out", default="conformance-reference", help="directory for compatibility.json/.html")
    p.add_argument("--profile", action="append", default=[], help="only these profiles (comma-separated)")
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    server = os.environ.get("QUEEN_BENCH_DATABASE_URL") or os.environ.get("QUEEN_TEST_DATABASE_URL")
    emb = None
    with tempfile.TemporaryDirectory(prefix="queen-conformance-reference-") as tmp:
        if not server:
            from broker.store import embedded

            emb = embedded.start_scratch("queen-conformance-reference-pg-")
            server = emb.dsn()
        ours_db = asyncio.run(new_db(server, "conf_ours"))
        cpp_db = asyncio.run(new_db(server, "conf_cpp"))
        secret = secrets.token_urlsafe(24)
        ours = LocalBroker(dsn=ours_db, workers=2, env=runner.local_env(secret), log_path=Path(tmp) / "ours.log")
        cpp = CppQueen(args.cpp_bin, cpp_db, log_path=out / "cpp_queen.log")
        try:
            ours.start()
            cpp.start()
            tokens = runner.mint_tokens(secret)
            suite = ["--url", ours.url, "--name", "queen-broker", "--allow-cluster-changes",
                     "--url-reference", cpp.url, "--reference-name", args.cpp_name,
                     "--reference-allow-cluster-changes",  # a C++ Queen of our own, on its own database
                     "--report", str(out / "compatibility.json"), "--html", str(out / "compatibility.html")]
            for opt, key in (("--token", "token"), ("--token-b", "token_b"), ("--admin-token", "admin_token"),
                             ("--token-produce-only", "token_produce_only"),
                             ("--token-consume-only", "token_consume_only")):
                suite += [opt, tokens[key]]
            for prof in args.profile:
                suite += ["--profile", prof]
            code = runner.main([*suite, *extra])
            print(f"\nwritten: {out}/compatibility.json, compatibility.html (C++ Queen log: {out}/cpp_queen.log)")
            return code
        finally:
            cpp.stop()
            ours.stop()
            if emb is not None:
                emb.stop()


if __name__ == "__main__":
    raise SystemExit(main())

"""``queen bench``: run the pytest-benchmark benches under bench/ and keep their JSON.

    queen bench [--json PATH] [-k EXPR] [extra pytest args...]
    queen bench -- -k crypto        (through the ``queen`` CLI, options go after ``--``)
    queen bench shapes [--quick] [--cpp-bin PATH] ...   (the reference broker's axes, bench/bench_shapes.py)

Runs ``pytest -n 0 bench --benchmark-json=PATH`` (default ``.benchmarks/bench-<time>.json``) in a child
process with this interpreter; the terminal report ends with each bench's ratio against the baseline
measured in the same run (see bench/conftest.py). ``queen bench shapes`` runs instead the side-by-side
bench of bench/bench_shapes.py (its own options; ``queen bench shapes --help``) in this process.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def build_command(json_path: Path, k: str | None, extra: list[str]) -> list[str]:
    # -n 0: one process. The checkout's pytest options spread the TESTS over two processes (pyproject's
    # addopts), and pytest-benchmark switches itself off under pytest-xdist: benches must time alone.
    cmd = [sys.executable, "-m", "pytest", str(HERE), "-q", "-p", "no:cacheprovider", "-n", "0",
           f"--benchmark-json={json_path}", "--benchmark-columns=min,mean,median,max,ops,rounds",
           "--benchmark-sort=name", "-o", "testpaths=bench"]
    if k:
        cmd += ["-k", k]
    return cmd + extra


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="queen bench", description="run the pytest-benchmark benches "
                                 "(or `queen bench shapes ...`: bench/bench_shapes.py, see its --help)")
    ap.add_argument("--json", help="where to write the pytest-benchmark JSON")
    ap.add_argument("-k", help="only benches matching this pytest -k expression")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:  # `queen bench -- -k x`: the CLI hands over everything after its own `--`
        argv = argv[1:]
    if argv[:1] == ["shapes"]:  # not a pytest bench: a broker-against-broker run with its own options
        from bench import bench_shapes

        return bench_shapes.main(argv[1:])
    args, extra = ap.parse_known_args(argv)
    json_path = Path(args.json or f".benchmarks/bench-{time.strftime('%Y%m%d-%H%M%S')}.json").resolve()
    json_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = build_command(json_path, args.k, extra)
    print("queen bench:", " ".join(cmd), flush=True)
    rc = subprocess.call(cmd, cwd=HERE.parent)
    if json_path.exists():
        print(f"queen bench: results in {json_path}")
    return rc


if __name__ == "__main__":
    sys.exit(main())

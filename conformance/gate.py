"""Run many mutant runs of the suite cheaply: ``python -m conformance.gate --jobs JOBS.json``.

Each mutant run is the suite (``conformance.runner``) pointed at a mutant proxy, with only the tests of
the contracts that mutant breaks. Started as one process each, most of a run's time went into starting
Python, importing pytest, httpx, aiohttp and collecting the suite (seconds apiece on a busy machine,
times fifty mutants). Here one process imports all of that once and forks a child per run: the child
starts its own proxy, runs the suite in-process and exits with the runner's status. At most
``parallel`` children run at a time; jobs marked ``serial`` (their tests flip a cluster-wide switch) run
alone, after the others.

JOBS.json: ``{"parallel": 4, "jobs": [{"name", "mutant", "behind", "first" (URL or null), "args": [...],
"log", "serial"}]}``; ``behind`` is the broker the proxy forwards to, ``first`` the URL given before the
proxy's (for a mutant of the second broker of a deployment). Writes ``{"<name>": <exit status>}`` to
``--out``. Linux/macOS only (fork); elsewhere the runs go one process each.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import subprocess
import sys
from typing import Any


def _preload() -> None:
    """Everything a run imports, once, in the parent (inherited by every child)."""
    import aiohttp  # noqa: F401
    import httpx  # noqa: F401
    import pytest  # noqa: F401

    import conformance
    from conformance import mutants, plugin, runner  # noqa: F401

    for mod in pkgutil.iter_modules(conformance.__path__):
        if mod.name.startswith("test_") or mod.name == "conftest":
            importlib.import_module(f"conformance.{mod.name}")


def _child(job: dict[str, Any]) -> int:
    from conformance import runner
    from conformance.mutants import MutantProxy

    fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    with MutantProxy(job["behind"], job["mutant"]) as proxy_url:
        urls = [job["first"], proxy_url] if job.get("first") else [proxy_url]
        argv = [a for u in urls for a in ("--url", u)] + list(job["args"])
        try:
            return int(runner.main(argv))
        finally:
            sys.stdout.flush()
            sys.stderr.flush()


def _run_forked(jobs: list[dict[str, Any]], parallel: int) -> dict[str, int]:
    codes: dict[str, int] = {}
    running: dict[int, str] = {}

    def reap() -> None:
        pid, status = os.waitpid(-1, 0)
        name = running.pop(pid, None)
        if name is not None:
            codes[name] = os.waitstatus_to_exitcode(status)

    for group, width in (([j for j in jobs if not j.get("serial")], parallel), ([j for j in jobs if j.get("serial")], 1)):
        for job in group:
            while len(running) >= width:
                reap()
            pid = os.fork()
            if pid == 0:  # the child: never returns into the parent's loop
                code = 70
                try:
                    code = _child(job)
                finally:
                    os._exit(code)
            running[pid] = job["name"]
        while running:
            reap()
    return codes


def _run_processes(jobs: list[dict[str, Any]]) -> dict[str, int]:
    codes: dict[str, int] = {}
    for job in jobs:
        argv = [sys.executable, "-c", "import json,sys; from conformance.gate import _child; "
                "sys.exit(_child(json.loads(sys.argv[1])))", json.dumps(job)]
        codes[job["name"]] = subprocess.run(argv).returncode
    return codes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m conformance.gate", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", required=True, help="the JSON job file")
    p.add_argument("--out", required=True, help="write {name: exit status} here")
    args = p.parse_args(argv)
    spec = json.loads(open(args.jobs).read())
    jobs, parallel = spec["jobs"], max(1, int(spec.get("parallel", 4)))
    if hasattr(os, "fork"):
        _preload()
        codes = _run_forked(jobs, parallel)
    else:
        codes = _run_processes(jobs)
    with open(args.out, "w") as f:
        json.dump(codes, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

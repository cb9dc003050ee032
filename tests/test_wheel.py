"""The package is the product: a wheel built from this checkout, installed non-editable into a fresh
virtual environment and run from a directory outside the checkout, serves a working broker.

Every other test imports ``broker`` from the checkout, so a file missing from the wheel (SQL, console,
OpenAPI document) or a path computed from the source tree would pass them all and break every user.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
import venv
import zipfile
from pathlib import Path

import httpx
import pytest
from helpers import Api, timer_op

from broker.process.localserver import LocalBroker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parent.parent


def _clean_env(**extra: str) -> dict[str, str]:
    """The caller's environment without anything that would let the checkout leak into the install."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("QUEEN_") and k not in ("PYTHONPATH", "VIRTUAL_ENV", "PROMETHEUS_MULTIPROC_DIR")}
    env.update(extra)
    return env


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the built wheel, the ``bin`` directory of a fresh venv it is installed in with ``[conformance]``)."""
    base = tmp_path_factory.mktemp("wheel")
    dist = base / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(ROOT)], base, _clean_env())
    (wheel,) = dist.glob("queen_broker-*.whl")
    env_dir = base / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    bin_dir = env_dir / "bin"
    _run([str(bin_dir / "python"), "-m", "pip", "install", "-q", f"{wheel}[conformance]"], base, _clean_env())
    return wheel, bin_dir


def test_the_wheel_carries_every_file_the_broker_reads(installed: tuple[Path, Path]) -> None:
    wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {"broker/openapi.yaml"}
    for folder in ("broker/sql", "broker/console"):
        wanted |= {p.relative_to(ROOT).as_posix() for p in (ROOT / folder).rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts}
    assert any(n.startswith("broker/sql/functions/") for n in wanted)  # the walk above saw the tree
    assert wanted - names == set()


def test_the_installed_broker_serves_fires_and_migrates(installed: tuple[Path, Path],
                                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    _, bin_dir = installed
    outside = tmp_path_factory.mktemp("user")  # the cwd: nothing of the checkout is importable from here
    data = outside / "data"
    env = _clean_env(QUEEN_DATA_DIR=str(data), QUEEN_WORKERS="1")

    where = _run([str(bin_dir / "python"), "-c", "import broker; print(broker.__file__)"], outside, env).stdout
    assert Path(where.strip()).is_relative_to(bin_dir.parent), where

    broker = LocalBroker(data_dir=data, workers=1, log_path=outside / "serve.log")
    proc_env = broker.env()
    proc_env.pop("PYTHONPATH", None)
    log = open(broker.log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
    broker.proc = subprocess.Popen([str(bin_dir / "queen"), "serve"], cwd=outside, env=proc_env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    try:
        broker.wait_ready(180)
        with Api(httpx.Client(base_url=broker.url, timeout=10)) as api:
            q = f"wheel-{uuid.uuid4().hex[:8]}"
            api.push(q, [{"n": 1}])
            (m,) = api.delivered(q)
            assert m["data"] == {"n": 1}
            api.ack(m)

            fired = f"{q}-fired"
            txn = uuid.uuid4().hex
            (res,) = api.timer_results(timer_op(fired, "k1", txn, delay=200))
            assert res["ok"] is True and res["status"] == "scheduled", res
            api.wait_fired(fired, txn, timeout=30)
            (t,) = api.delivered(fired)
            assert t["transactionId"] == txn and t["data"] == {"k": 1}
            api.ack(t)

            page = api.get("/console")
            assert page.status_code == 200 and "console.js" in page.text
            for asset, kind in (("console.js", "javascript"), ("console.css", "css")):
                r = api.get(f"/console/{asset}")
                assert r.status_code == 200 and kind in r.headers["content-type"] and r.content, asset
            assert api.get("/openapi.json").json()["openapi"].startswith("3.1")
    finally:
        code = broker.stop()
    assert code == 0, broker.tail()
    assert "boot attempt" not in broker.log_path.read_text(errors="replace")

    out = _run([str(bin_dir / "queen"), "migrate"], outside, env)
    assert "schema is up to date" in out.stdout, out.stdout + out.stderr  # serve applied everything, from the wheel
    help_text = _run([str(bin_dir / "queen"), "conformance", "--help"], outside, env).stdout
    assert "--url" in help_text

"""bench/: the same-run ratio report, the runner's command line, and collection of bench_*.py files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import runner
from bench.conftest import ratios

ROOT = Path(__file__).resolve().parents[1]


def _bm(group: str, name: str, role: str | None, median: float) -> SimpleNamespace:
    return SimpleNamespace(group=group, name=name, extra_info={"role": role} if role else {},
                           stats=SimpleNamespace(median=median))


def test_ratios_pair_baseline_and_ours_per_group() -> None:
    rows = ratios([
        _bm("zstd", "raw", "baseline", 2.0), _bm("zstd", "codec", "ours", 3.0),
        _bm("aes", "keyring", "ours", 1.0),  # no baseline: no ratio
        _bm("misc", "x", None, 1.0),
    ])
    assert rows == [("zstd", "raw", 2.0, "codec", 3.0, 1.5)]


def test_runner_command_writes_json_and_passes_options(tmp_path: Path) -> None:
    cmd = runner.build_command(tmp_path / "b.json", "crypto", ["-x"])
    assert cmd[:3] == [sys.executable, "-m", "pytest"]
    assert cmd[cmd.index("-n") + 1] == "0"  # benches time in one process (pytest-benchmark is off under xdist)
    assert f"--benchmark-json={tmp_path / 'b.json'}" in cmd
    assert cmd[cmd.index("-k") + 1] == "crypto" and cmd[-1] == "-x"


@pytest.mark.timeout(60)
def test_bench_files_are_collected_but_not_by_the_default_run() -> None:
    # a pytest of its own: none of this session's PYTEST_* variables (xdist's worker id among them)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "bench", "-n", "0", "--collect-only", "-q", "-p",
                           "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    out = proc.stdout
    for name in ("bench_codec.py::test_zstd_roundtrip_codec", "bench_crypto.py::test_aesgcm_roundtrip_keyring",
                 "bench_render.py::test_render_broker_wire", "bench_sweep.py::test_fire_sweeper_cycle",
                 "bench_validation.py::test_validation_parse_ops"):
        assert name in out, f"exit {proc.returncode}\n{out[-2000:]}\n{proc.stderr[-3000:]}"
    import tomllib

    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["testpaths"] == ["tests"]

"""Installing a Debian package the project needs (HAProxy, Chromium for the browser tests, the cluster's
etcd and PostgreSQL 15) on a machine where it is missing: the one place that runs ``apt-get``.

Only as root with apt-get present (CI's clean machine); anywhere else ``may_install()`` is false and the
caller says what to install. Installs are serialised by an exclusive lock on a file in the temp
directory: two processes of one test run (pytest-xdist workers) that both find a package missing install
it one after the other, and the second finds it installed (``present`` is asked again under the lock).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

LOCK = Path(tempfile.gettempdir()) / "queen-apt-install.lock"


class AptError(RuntimeError):
    pass


def may_install() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get") is not None


def command(packages: list[str]) -> str:
    return ("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
            f"--no-install-recommends {' '.join(packages)}")


def install(packages: list[str], *, timeout_s: float, present: Callable[[], bool] | None = None) -> None:
    """``apt-get install`` the packages, holding the lock; skipped when ``present()`` answers true once the
    lock is held. Raises AptError with the command's output when it fails or takes over ``timeout_s``."""
    cmd = command(packages)
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if present is not None and present():
            return
        try:
            proc = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AptError(f"`{cmd}` took more than {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        raise AptError(f"`{cmd}` failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")

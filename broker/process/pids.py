"""Is a process still running: the one check the process tooling shares (``queen cells down``, the
Patroni cluster's ``_stop_pid``, the process-fault tests)."""

from __future__ import annotations

import contextlib
import os


def alive(pid: int | None) -> bool:
    """Whether ``pid`` names a running process. A zombie counts as gone: reaped when it is a child of
    this process, told by its state in ``/proc`` otherwise. A process of another user counts as
    running (signal 0 is refused, but it exists)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False  # gone since the signal
    except OSError:
        return True  # no procfs here: the signal's answer stands

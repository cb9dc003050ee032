"""Named queries: ``broker/sql/queries/*.sql`` files hold blocks that start with ``-- name: <name>``.

The SQL ships inside the package and is read through ``importlib.resources``, so a wheel installed
anywhere finds it exactly as a checkout does; a directory without one ``.sql`` file is an error at load
time (a broken install never looks like "no queries wanted").

Loaded once, at import, into ``Q``; code refers to a query by its name (``Q.timers_schedule``), so SQL
never lives in f-strings next to handlers. A duplicate name across files is an error at load time.
"""

from __future__ import annotations

import re
from importlib.resources import files
from importlib.resources.abc import Traversable

SQL_DIR: Traversable = files("broker") / "sql"
_NAME = re.compile(r"^--\s*name:\s*([A-Za-z_][A-Za-z0-9_]*)\s*$")


class QueryError(LookupError):
    pass


def parse(text: str, source: str = "<string>") -> dict[str, str]:
    out: dict[str, str] = {}
    name: str | None = None
    buf: list[str] = []

    def flush() -> None:
        if name is not None:
            sql = "\n".join(buf).strip()
            if not sql:
                raise QueryError(f"{source}: query {name!r} is empty")
            if name in out:
                raise QueryError(f"{source}: query {name!r} defined twice")
            out[name] = sql

    for line in text.splitlines():
        m = _NAME.match(line.strip())
        if m:
            flush()
            name, buf = m.group(1), []
        elif name is not None:
            buf.append(line)
    flush()
    return out


class Queries:
    """Attribute access to named queries: ``Q.log_push``."""

    def __init__(self, queries: dict[str, str]) -> None:
        self._q = queries

    def __getattr__(self, name: str) -> str:
        try:
            return self._q[name]
        except KeyError:
            raise QueryError(f"no named query {name!r} in {SQL_DIR / 'queries'}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._q

    def names(self) -> list[str]:
        return sorted(self._q)


def sql_files(directory: Traversable) -> list[Traversable]:
    """The ``*.sql`` files of a shipped SQL directory, in name order; none at all is an error."""
    found = sorted(
        (p for p in directory.iterdir() if p.name.endswith(".sql") and p.is_file()) if directory.is_dir() else (),
        key=lambda p: p.name,
    )
    if not found:
        raise QueryError(f"no .sql files in {directory}: the installed package is incomplete (reinstall it)")
    return found


def load(directory: Traversable | None = None) -> Queries:
    directory = directory or SQL_DIR / "queries"
    merged: dict[str, str] = {}
    for path in sql_files(directory):
        for name, sql in parse(path.read_text(), str(path)).items():
            if name in merged:
                raise QueryError(f"{path}: query {name!r} already defined in another file")
            merged[name] = sql
    return Queries(merged)


Q = load()

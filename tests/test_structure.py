"""The code's structure, checked where it is cheap: the import graph of ``broker`` and ``conformance``
has no cycle; mypy is clean; the SQL's advisory-lock numbers are the registry's; hot and wide function
calls name their parameters; one name per role (see the tests at the end).

Every ``import``/``from ... import`` in a module counts, at module level or inside a function (a deferred
import still ties the two modules together); only imports under ``if TYPE_CHECKING:`` are left out,
since they never run. ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to
``pkg``. Parents of an imported module are not added as edges (a package whose ``__init__`` lists its
own submodules is not a cycle by itself).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("broker", "conformance")


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, name: str, is_pkg: bool, modules: dict[str, Path]) -> set[str]:
    found: set[str] = set()

    def target(mod: str) -> str | None:
        while mod and mod not in modules:
            mod = mod.rpartition(".")[0]
        return mod or None

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if (t := target(alias.name)) is not None:
                    found.add(t)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                if not is_pkg:
                    anchor = anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                t = sub if sub in modules else target(base)
                if t is not None:
                    found.add(t)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {
        name: _imports(ast.parse(path.read_text(), str(path)), name, path.name == "__init__.py", modules)
        for name, path in modules.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path [a, b, ..., a], or None."""
    white, grey, black = 0, 1, 2
    colour = dict.fromkeys(graph, white)
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        colour[node] = grey
        stack.append(node)
        for nxt in sorted(graph[node]):
            if colour[nxt] == grey:
                return stack[stack.index(nxt):] + [nxt]
            if colour[nxt] == white and (cycle := dfs(nxt)) is not None:
                return cycle
        stack.pop()
        colour[node] = black
        return None

    for node in sorted(graph):
        if colour[node] == white and (cycle := dfs(node)) is not None:
            return cycle
    return None


def test_the_graph_is_read():
    graph = import_graph()
    assert "broker.app" in graph and "conformance.plugin" in graph
    assert "broker.context" in graph["broker.app"]
    assert "broker.http" in graph["broker.app"]


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_route_modules_do_not_import_the_app():
    graph = import_graph()
    for name, deps in graph.items():
        if name.startswith("broker.http"):
            assert "broker.app" not in deps, f"{name} imports broker.app; use broker.context"


def test_mypy_is_clean_on_broker():
    """``mypy`` with the project's config (pyproject.toml: broker/, disallow_untyped_defs): ~10 s cold."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


# ------------------------------------------------------------------ SQL: lock keys and named calls

def _sql_blocks() -> dict[str, str]:
    """Each function body (by function name) and each named query (by query name) of broker/sql."""
    import re

    out: dict[str, str] = {}
    for path in sorted((ROOT / "broker" / "sql").glob("*/*.sql")):
        if path.parent.name == "migrations":
            continue
        text = path.read_text()
        marker = r"^-- name: (\w+)" if path.parent.name == "queries" else r"^CREATE OR REPLACE FUNCTION (\w+)"
        parts = re.split(marker, text, flags=re.M)
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            out[name] = out.get(name, "") + body
    return out


def test_advisory_lock_numbers_are_the_registry():
    """Every class number (or hash seed) of an advisory lock in the SQL is in broker.store.lock_keys, used
    where the registry says, and every registered number is used: a number reused for another purpose
    would make unrelated work wait for each other."""
    import re

    from broker.store import lock_keys

    used: dict[int, set[str]] = {}
    for name, body in _sql_blocks().items():
        for n in re.findall(r"advisory_\w*lock\w*\(\s*(\d+)", body):
            used.setdefault(int(n), set()).add(name)
        for n in re.findall(r"hashtextextended\([^;]*?,\s*(\d+)\)", body):
            if int(n) != 0:
                used.setdefault(int(n), set()).add(name)
    assert set(used) == set(lock_keys.IN_SQL), {"in SQL only": set(used) - set(lock_keys.IN_SQL),
                                                  "registered only": set(lock_keys.IN_SQL) - set(used)}
    for n, user in lock_keys.IN_SQL.items():
        assert user in used[n], f"lock number {n} is registered for {user}, used by {sorted(used[n])}"
    values = [v for k, v in vars(lock_keys).items() if k.isupper() and isinstance(v, int)]
    assert len(values) == len(set(values)), "two lock classes share a number"


def test_wide_and_hot_function_calls_name_their_parameters():
    """A named query that passes more than five parameters to a queen_* function, or calls one of the
    hot functions, names them (``p_tenant => $1``): a positional list that long is where a signature
    change goes wrong silently. Each such query's parameters are built by a typed object (``*/calls.py``)."""
    import re

    hot = {"queen_push_checked", "queen_push_edge", "queen_pop", "queen_ack", "queen_timers_apply",
           "queen_timers_take", "queen_timers_sweep", "queen_timers_fire", "queen_timers_lease"}
    queries = {}
    for path in sorted((ROOT / "broker" / "sql" / "queries").glob("*.sql")):
        parts = re.split(r"^-- name: (\w+)", path.read_text(), flags=re.M)
        queries.update(zip(parts[1::2], parts[2::2], strict=True))
    positional = []
    for name, body in queries.items():
        sql = re.sub(r"--[^\n]*", "", body)
        for fn, args in re.findall(r"(queen_\w+)\(([^()]*(?:\([^()]*\)[^()]*)*)\)", sql):
            n = len(re.findall(r"\$\d+", args))
            if (n > 5 or fn in hot) and n and "=>" not in args:
                positional.append(f"{name}: {fn}")
    assert positional == []


# ---------------------------------------------------------------------------- one name per role

def test_validation_modules_are_named_parse():
    """A package's module that turns wire input into typed values (or a 400) is its ``parse.py``: never
    ``ops.py``, ``validate.py`` or ``validation.py``."""
    odd = [p.relative_to(ROOT).as_posix() for p in (ROOT / "broker").rglob("*.py")
           if p.name in ("ops.py", "validate.py", "validation.py", "validators.py")]
    assert odd == []


def test_handlers_reach_the_worker_context_through_broker_request():
    """Route modules read the worker's context with ``broker(request)`` (broker/context.py), the one
    accessor, never ``request.app[BROKER]``."""
    odd = [p.relative_to(ROOT).as_posix() for p in (ROOT / "broker" / "http").glob("*.py")
           if "request.app[BROKER]" in p.read_text()]
    assert odd == []


def test_loop_bodies_are_named_run_with_the_pool_first():
    """Every loop broker/services.py starts runs a ``run``: a module's ``run(pool, ...)`` or the ``run``
    method of the object that holds the loop's state."""
    import re

    text = (ROOT / "broker" / "services.py").read_text()
    starts = re.findall(r"loops\.start\(\"([\w-]+)\", (.+)\)$", text, flags=re.M)
    assert len(starts) >= 7
    for name, body in starts:
        assert re.fullmatch(r"(lambda: )?[\w.]+\.run(\(b\.require_pool(, b\.settings)?\))?", body), (name, body)


def test_a_cycle_counts_rows_taken_not_claimed():
    """The sweeper's words: a cycle *takes* rows (in its transaction) and *leases* the ones it must hold
    past it; "claim" survives only in the schema's and the wire's names (claim_token, claimedUntil)."""
    text = (ROOT / "broker" / "timers" / "sweeper.py").read_text()
    assert "claimed" not in text.replace("claimed_until", "").replace("claimed_by", "")

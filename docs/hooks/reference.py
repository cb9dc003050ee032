"""MkDocs hook: the Reference pages are rendered from the code at build time, so they cannot drift.

A page asks for a generated block with a line ``<!-- generated: NAME -->``; the hook replaces it with
the Markdown rendered from the code (unknown names and pages that lose their marker fail the build):

- ``configuration``: every ``QUEEN_*`` variable ``broker.config.Settings.from_env`` reads, with its
  default and bounds taken from that call, its section from the comments of ``Settings`` and its meaning
  from ``broker.config.MEANINGS`` (a variable without a meaning fails the build);
- ``http-api``: every operation of ``broker/openapi.yaml`` (the document ``GET /openapi.json`` serves);
- ``error-reasons``: every reason the broker raises as an ``ApiError`` (``broker/errors.py``), found in
  the source with the status, the error code, the text it says and the modules that raise it;
- ``cli``: the ``--help`` of every ``queen`` command, from the parsers themselves.

The functions are plain (no MkDocs import), so tests call them too (tests/test_docs_site.py).
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

_CHECKOUT = Path(__file__).resolve().parents[2]
if (_CHECKOUT / "broker").is_dir() and str(_CHECKOUT) not in sys.path:  # a checkout that was not pip-installed
    sys.path.insert(0, str(_CHECKOUT))

import broker  # noqa: E402 - after the path is known

BROKER = Path(broker.__file__).resolve().parent
ROOT = BROKER.parent
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.M)


def _cell(text: object) -> str:
    """A value made safe for one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


# ------------------------------------------------------------------------------------ configuration


def settings_rows() -> list[dict[str, str]]:
    """One row per variable ``Settings.from_env`` reads, in the order of the Settings fields."""
    from broker import config

    source = Path(config.__file__).read_text()
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Settings")
    from_env = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "from_env")

    # The section of each field: the "# --- title" comment above it in the class body.
    sections: dict[str, str] = {}
    current = ""
    lines = source.splitlines()
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            for line in lines[: node.lineno - 1][::-1]:
                m = re.match(r"\s*# --- (.*)", line)
                if m:
                    current = m.group(1)
                    break
            sections[node.target.id] = current

    # Which field each variable feeds: `field=_int(env, "NAME", ...)`, possibly through a local name
    # (`pool_max = _int(...)` then `pool_max=pool_max`) or wrapped (`_key_ring(_str(...))`).
    readers = {"_int", "_bool", "_str"}
    local_calls: dict[str, ast.Call] = {}
    for node in ast.walk(from_env):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    local_calls[t.id] = node.value

    def reader_in(expr: ast.AST) -> ast.Call | None:
        if isinstance(expr, ast.Name) and expr.id in local_calls:
            expr = local_calls[expr.id]
        for sub in ast.walk(expr):
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id in readers:
                return sub
        return None

    found: dict[str, tuple[str, ast.Call]] = {}
    for node in ast.walk(from_env):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "cls":
            for kw in node.keywords:
                call = reader_in(kw.value)
                if kw.arg and call is not None:
                    name = ast.literal_eval(call.args[1])
                    found[name] = (kw.arg, call)

    namespace = dict(vars(config))
    shown_names = {"cpu": "CPU count", "pool_max": "`QUEEN_POOL_MAX`"}
    field_order = list(sections)
    rows = []
    for name, (fname, call) in sorted(found.items(), key=lambda kv: field_order.index(kv[1][0])):
        kind = call.func.id  # type: ignore[attr-defined]
        default_node = call.args[2]
        if isinstance(default_node, ast.Name) and default_node.id in shown_names:
            default = shown_names[default_node.id]
        else:
            value = eval(compile(ast.Expression(default_node), "<default>", "eval"), namespace)  # noqa: S307 - the config module's own literals
            default = _show_default(name, kind, value)
        bounds = [ast.unparse(a) for a in call.args[3:5]]
        lo = str(eval(bounds[0], namespace)) if len(bounds) > 0 and bounds[0] != "None" else None  # noqa: S307
        hi = str(eval(bounds[1], namespace)) if len(bounds) > 1 and bounds[1] != "None" else None  # noqa: S307
        if kind == "_bool":
            allowed = "boolean"
        elif kind == "_int":
            allowed = f"{lo}–{hi}" if lo and hi else f"≥ {lo}" if lo else "integer"
        else:
            allowed = "text"
        meaning = config.MEANINGS.get(name)
        if not meaning:
            raise RuntimeError(f"{name} is read by broker/config.py but has no entry in broker.config.MEANINGS")
        section = sections.get(fname, "")
        title = re.split(r"[:(]", section)[0].strip()
        note = section[len(title):].strip(" :()")
        rows.append({"name": name, "field": fname, "default": default, "allowed": allowed, "meaning": meaning,
                     "section": title[:1].upper() + title[1:], "note": note[:1].upper() + note[1:]})
    extra = set(config.MEANINGS) - set(found)
    if extra:
        raise RuntimeError(f"broker.config.MEANINGS documents variables from_env does not read: {sorted(extra)}")
    return rows


def _show_default(name: str, kind: str, value: Any) -> str:
    if value is None:
        return "unset"
    if kind == "_bool":
        return "`1`" if value else "`0`"
    if isinstance(value, int) and value > 0:
        if name.endswith("_BYTES") and value % (1024 * 1024) == 0:
            return f"`{value}` ({value // (1024 * 1024)} MiB)"
        if name.endswith("_MS") and value % 86_400_000 == 0:
            return f"`{value}` ({value // 86_400_000} days)"
        if name.endswith(("_SECONDS", "_S")) and value % 86_400 == 0:
            return f"`{value}` ({value // 86_400} days)"
    return f"`{value}`"


def render_configuration() -> str:
    out: list[str] = []
    section = None
    for row in settings_rows():
        if row["section"] != section:
            section = row["section"]
            out += ["", f"### {section}", ""] + ([f"{row['note']}.", ""] if row["note"] else [])
            out += ["| Variable | Default | Accepts | Meaning |", "|---|---|---|---|"]
        out.append(f"| `{row['name']}` | {_cell(row['default'])} | {_cell(row['allowed'])} | {_cell(row['meaning'])} |")
    return "\n".join(out).strip() + "\n"


# ------------------------------------------------------------------------------------ HTTP API

METHODS = ("get", "put", "post", "delete", "patch")


def render_http_api() -> str:
    import yaml

    doc = yaml.safe_load((BROKER / "openapi.yaml").read_text())
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {t["name"]: [] for t in doc.get("tags", [])}
    for path, item in doc["paths"].items():
        shared = item.get("parameters", [])
        for method in METHODS:
            if method in item:
                op = dict(item[method])
                op["parameters"] = shared + op.get("parameters", [])
                tag = (op.get("tags") or ["other"])[0]
                by_tag.setdefault(tag, []).append((method.upper(), path, op))
    components = doc.get("components", {})
    out = [f"Generated from `broker/openapi.yaml` (OpenAPI {doc['openapi']}, {sum(map(len, by_tag.values()))} "
           f"operations, {len(components.get('schemas', {}))} [schemas](#schemas)).", ""]
    for tag, ops in by_tag.items():
        if not ops:
            continue
        out += [f"## {tag}", "", "| Operation | What it does |", "|---|---|"]
        for method, path, op in ops:
            out.append(f"| `{method} {path}` | {_cell(op.get('summary', ''))} |")
        out.append("")
        for method, path, op in ops:
            out += [f"### `{method} {path}`", "", op.get("summary", "").strip() + ("." if op.get("summary") else ""), ""]
            if op.get("description"):
                out += [op["description"].strip(), ""]
            if op.get("security") == []:
                out += ["No credential needed.", ""]
            params = [_resolve(p, doc) for p in op["parameters"]]
            params = [p for p in params if isinstance(p, dict) and "name" in p]
            if params:
                out += ["| Parameter | In | Required | Schema | Meaning |", "|---|---|---|---|---|"]
                for p in params:
                    out.append(f"| `{p['name']}` | {p.get('in', '')} | {'yes' if p.get('required') else 'no'} | "
                               f"{_cell(_schema_text(p.get('schema', {})))} | {_cell(p.get('description', ''))} |")
                out.append("")
            body = op.get("requestBody")
            if body:
                body = _resolve(body, doc)
                for kind, content in body.get("content", {}).items():
                    out.append(f"Request body (`{kind}`): {_schema_text(content.get('schema', {}))}"
                               + (f". {body['description'].strip()}" if body.get("description") else "") + "  ")
                out.append("")
            out += ["| Status | Answer | Body |", "|---|---|---|"]
            for status, resp in op.get("responses", {}).items():
                resp = _resolve(resp, doc) if isinstance(resp, dict) else {}
                schemas = [_schema_text(c.get("schema", {})) for c in resp.get("content", {}).values() if c.get("schema")]
                out.append(f"| {status} | {_cell(resp.get('description', ''))} | {_cell(schemas[0] if schemas else '')} |")
            out.append("")
    out += ["## Schemas", "", "The named schemas of `components/schemas`; `*` marks a required property.", ""]
    for name, schema in components.get("schemas", {}).items():
        out += [f"### {name}", ""]
        if schema.get("description"):
            out += [schema["description"].strip(), ""]
        props = schema.get("properties")
        if props:
            required = set(schema.get("required", []))
            out += ["| Property | Schema | Meaning |", "|---|---|---|"]
            for prop, sub in props.items():
                star = "\\*" if prop in required else ""
                out.append(f"| `{prop}`{star} | {_cell(_schema_text(sub, top=False))} | {_cell(sub.get('description', ''))} |")
            out.append("")
        else:
            out += [_schema_text(schema, top=False, expand=True), ""]
    return "\n".join(out)


def _resolve(node: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    """A ``$ref`` to a component (a parameter, a response, a request body) replaced by the component."""
    while isinstance(node, dict) and "$ref" in node and node["$ref"].startswith("#/components/") \
            and not node["$ref"].startswith("#/components/schemas/"):
        target: Any = doc
        for part in node["$ref"][2:].split("/"):
            target = target[part]
        node = target
    return node


def _schema_text(schema: dict[str, Any], top: bool = True, expand: bool = False, depth: int = 0) -> str:
    """A schema in one line: a named schema links to its entry, an object lists its properties."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[`{name}`](#{name.lower()})"
    for combo in ("oneOf", "anyOf", "allOf"):
        if combo in schema:
            joiner = " and " if combo == "allOf" else " or "
            return joiner.join(_schema_text(s, top, expand, depth + 1) for s in schema[combo])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = " or ".join(map(str, kind))
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    if kind == "array":
        return f"array of {_schema_text(schema.get('items', {}), top, expand, depth + 1)}"
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        if not props or depth > 1:
            return "object"
        required = set(schema.get("required", []))
        inner = ", ".join(f"`{k}`{'*' if k in required else ''}: {_schema_text(v, top, expand, depth + 1)}"
                          for k, v in props.items())
        return f"{{{inner}}}"
    text = str(kind or "any")
    bounds = [f"{k} {schema[k]}" for k in ("minimum", "maximum", "minLength", "maxLength", "pattern") if k in schema]
    if bounds and (expand or not top):
        text += f" ({', '.join(bounds)})"
    return text


# ------------------------------------------------------------------------------------ error reasons

# What to do about a status, as broker/errors.py states the rule.
STATUS_FIX = {
    304: "Nothing: the copy you hold is current.",
    400: "Fix the request; sent again unchanged it is refused again. Nothing was changed.",
    401: "Send a valid token (`Authorization: Bearer <token>`).",
    403: "Retrying will not help: get the grant, a wider plan, or an operator's switch changed.",
    404: "The route or the resource does not exist for this tenant.",
    405: "Use one of the methods in the `Allow` header.",
    408: "Send the request faster; the connection was closed.",
    409: "The request conflicts with the resource's state; read it and decide.",
    412: "Your precondition (`If-Match`/`If-None-Match`) no longer holds: read again.",
    413: "Send less (split the batch, shrink the payload).",
    415: "Send the body with `Content-Type: application/json`.",
    429: "Retry after the `Retry-After` seconds.",
    500: "Nothing a client sends should cause it: it is a bug, logged with its traceback; report it.",
    503: "Not your fault: retry after `Retry-After` (the same `transactionId` keeps it idempotent).",
}

def _error_classes() -> dict[str, tuple[int, str]]:
    from broker import errors

    out = {}
    for name, obj in vars(errors).items():
        if isinstance(obj, type) and issubclass(obj, errors.ApiError):
            out[name] = (obj.status, obj.code)
    out["booting"] = (503, "booting")
    return out


def _text(node: ast.AST) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                parts.append(str(v.value))
            else:
                parts.append("…")
        return "".join(parts)
    return ""


def error_reasons() -> dict[str, dict[str, Any]]:
    """reason -> {"statuses": {(status, code)}, "texts": [...], "where": {module}} from the source.

    A reason is found where it is raised: a call of an ``ApiError`` class (or of ``errors.booting``)
    whose first argument is a string or a module constant naming one, a call of a module's own helper
    that passes its first parameter on as the reason (``bad("kv_reserved_namespace", ...)``), and the
    envelopes the HTTP server writes itself (``_json(503, "unavailable", "too_many_connections", ...)``).
    """
    classes = _error_classes()
    trees = {path: ast.parse(path.read_text()) for path in sorted(BROKER.rglob("*.py"))}
    constants: dict[str, str] = {}
    for tree in trees.values():
        for node in tree.body:
            if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                    and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
                constants[node.targets[0].id] = node.value.value

    def name_of(fn: ast.AST) -> str:
        return fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""

    def literal(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        key = name_of(node)
        return constants.get(key) if key.isupper() else None

    def overrides(call: ast.Call, status: int, code: str) -> tuple[int, str]:
        for kw in call.keywords:
            if kw.arg == "code" and isinstance(kw.value, ast.Constant):
                code = kw.value.value
            if kw.arg == "status" and isinstance(kw.value, ast.Constant):
                status = kw.value.value
        return status, code

    found: dict[str, dict[str, Any]] = {}

    def add(reason: str, status: int, code: str, text: str, path: Path) -> None:
        entry = found.setdefault(reason, {"statuses": set(), "texts": [], "where": set()})
        entry["statuses"].add((status, code))
        if text and text not in entry["texts"]:
            entry["texts"].append(text)
        entry["where"].add(str(path.relative_to(ROOT)))

    for path, tree in trees.items():
        # A module's helpers that hand their first parameter to an ApiError class as the reason.
        helpers: dict[str, tuple[int, str]] = {}
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef) and fn.args.args:
                first = fn.args.args[0].arg
                for call in ast.walk(fn):
                    if (isinstance(call, ast.Call) and name_of(call.func) in classes and call.args
                            and isinstance(call.args[0], ast.Name) and call.args[0].id == first):
                        helpers[fn.name] = overrides(call, *classes[name_of(call.func)])
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = name_of(node.func)
            if name == "booting":
                add("booting", 503, "booting", "the broker is starting: migrations or the database pool are not ready", path)
            elif name in classes or name in helpers:
                first = node.args[0] if node.args else None
                options = [first.body, first.orelse] if isinstance(first, ast.IfExp) else [first]
                status, code = overrides(node, *(classes.get(name) or helpers[name]))
                for option in options:
                    reason = literal(option) if option is not None else None
                    if reason is not None:
                        add(reason, status, code, _text(node.args[1]) if len(node.args) > 1 else "", path)
            elif (len(node.args) >= 3 and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, int)
                  and 400 <= node.args[0].value < 600 and literal(node.args[1]) and literal(node.args[2])):
                add(literal(node.args[2]) or "", node.args[0].value, literal(node.args[1]) or "",
                    _text(node.args[3]) if len(node.args) > 3 else "", path)
            elif (len(node.args) >= 3 and isinstance(node.args[0], ast.Name) and node.args[0].id == "status"
                  and literal(node.args[1]) and literal(node.args[2])):
                # server.py's parser refusals: the status comes from aiohttp (400, 413, ...)
                add(literal(node.args[2]) or "", 400, literal(node.args[1]) or "",
                    _text(node.args[3]) if len(node.args) > 3 else "", path)
    return found


def render_error_reasons() -> str:
    reasons = error_reasons()
    by_status: dict[int, list[str]] = {}
    for reason, entry in reasons.items():
        by_status.setdefault(min(s for s, _ in entry["statuses"]), []).append(reason)
    out = [f"{len(reasons)} reasons, found in `broker/` where they are raised.", ""]
    for status in sorted(by_status):
        out += [f"### {status}", "", f"**What to do**: {STATUS_FIX.get(status, '')}", "",
                "| `reason` | `error` | What the broker says | Raised in |", "|---|---|---|---|"]
        for reason in sorted(by_status[status]):
            e = reasons[reason]
            codes = ", ".join(f"`{c}`" + (f" ({s})" if s != status else "") for s, c in sorted(e["statuses"]))
            texts = "; ".join(f"“{t}”" for t in e["texts"][:3]) + (" …" if len(e["texts"]) > 3 else "")
            where = ", ".join(f"`{w}`" for w in sorted(e["where"]))
            out.append(f"| `{reason}` | {codes} | {_cell(texts)} | {where} |")
        out.append("")
    return "\n".join(out)


# ------------------------------------------------------------------------------------ CLI


def cli_helps() -> list[tuple[str, str]]:
    """(command line, its --help text) for `queen` and each of its commands."""
    from broker.process import cli

    pages: list[tuple[str, str]] = []
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        parser = cli.build_parser()
        pages.append(("queen --help", parser.format_help()))
        subs = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        delegated = {name: module for name, module, _ in cli.DELEGATES}
        for name, sub in subs.choices.items():  # type: ignore[attr-defined]
            if name in delegated:
                pages.append((f"queen {name} --help", _delegate_help(delegated[name])))
                continue
            pages.append((f"queen {name} --help", sub.format_help()))
            for action in sub._actions:
                if action.__class__.__name__ == "_SubParsersAction":
                    for inner, inner_parser in action.choices.items():
                        pages.append((f"queen {name} {inner} --help", inner_parser.format_help()))
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    return pages


def _delegate_help(module: str) -> str:
    """A delegated command's own --help (its module prints it and exits before doing anything)."""
    import importlib

    mod = importlib.import_module(module)
    build: Callable[[], Any] | None = getattr(mod, "build_parser", None)
    if build is not None:
        return str(build().format_help())
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
        mod.main(["--help"])
    return buf.getvalue()


def render_cli() -> str:
    out = []
    for line, text in cli_helps():
        out += [f"## `{line}`", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(out)


# ------------------------------------------------------------------------------------ the hook

RENDERERS: dict[str, Callable[[], str]] = {
    "configuration": render_configuration,
    "http-api": render_http_api,
    "error-reasons": render_error_reasons,
    "cli": render_cli,
}


def expand(markdown: str, where: str = "") -> str:
    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in RENDERERS:
            raise RuntimeError(f"{where}: unknown generated block {name!r} (known: {sorted(RENDERERS)})")
        return RENDERERS[name]()

    return MARKER.sub(sub, markdown)


# Which page must carry which block: a page that loses its marker would silently lose its reference.
EXPECTED = {
    "reference/configuration.md": "configuration",
    "reference/http-api.md": "http-api",
    "reference/errors.md": "error-reasons",
    "reference/cli.md": "cli",
}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    src = page.file.src_uri
    wanted = EXPECTED.get(src)
    if wanted and f"<!-- generated: {wanted} -->" not in markdown:
        raise RuntimeError(f"{src} must carry the line <!-- generated: {wanted} -->")
    return expand(markdown, src)

"""KV op validation: the wire ops of docs/protocol.md §4.2 in, normalised ops for ``queen_kv_apply`` out.

Everything a client can get wrong is refused here, before any SQL, with a 400 ``kv_bad_request`` (or a
413 ``payload_too_large`` for an oversized key or value) naming the op index: a bad call changes
nothing. The database function then only meets ops it understands.

Normalised op: ``{"op": put|delete|incr|check|get|getMany|getPrefix, "name": <wire op name>, "ns",
"key" | "keys" | "prefix"+"after"+"limit"+"keysOnly", "value", "ttl": seconds or None (= forever),
"expect": int or None, "required": bool, "delta", "min", "max"}``. ``putIfAbsent`` becomes ``put`` with
``expect: 0`` and keeps its name in the answer.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import orjson

from broker.errors import BadRequest, PayloadTooLarge

CODE = "kv_bad_request"
NS_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
MAX_KEY_BYTES = 512
MAX_VALUE_BYTES = 65_536
READ_BUDGET_BYTES = 4 * 1024 * 1024
KEY_BUDGET_CALL = 1024
KEY_BUDGET_TX = 256
MAX_OPS_TX = 64
PREFIX_DEFAULT_LIMIT = 100
PREFIX_MAX_LIMIT = 1000
MAX_TTL_S = 100 * 365 * 86_400
MAX_VERSION = 2**63 - 1

WRITES = frozenset({"put", "putIfAbsent", "delete", "incr"})
_FIELDS: dict[str, frozenset[str]] = {
    "get": frozenset({"op", "ns", "key"}),
    "getMany": frozenset({"op", "ns", "keys"}),
    "getPrefix": frozenset({"op", "ns", "prefix", "after", "limit", "keysOnly"}),
    "put": frozenset({"op", "ns", "key", "value", "ttlSeconds", "forever", "expect", "required"}),
    "putIfAbsent": frozenset({"op", "ns", "key", "value", "ttlSeconds", "forever", "expect", "required"}),
    "delete": frozenset({"op", "ns", "key", "expect", "required"}),
    "incr": frozenset({"op", "ns", "key", "delta", "min", "max", "ttlSeconds", "forever", "required"}),
    "check": frozenset({"op", "ns", "key", "expect", "required"}),
}
_TENANT_FIELDS = frozenset({"tenant", "tenantId", "tenant_id"})
# Namespaces whose rows only the broker writes: the lock permits (docs/decisions.md §8). Their rows stay
# readable (a lock's guard is a check of one), but a KV write there would forge or destroy a permit.
LOCKS_NS = "queen-locks"
RESERVED_NS = frozenset({LOCKS_NS})


def bad(reason: str, detail: str) -> BadRequest:
    return BadRequest(reason, detail, code=CODE)


@dataclass
class KvCall:
    """A validated call: normalised ops plus what admission and authorization need to know."""

    ops: list[dict[str, Any]] = field(default_factory=list)
    writes: int = 0
    reads: int = 0
    names: list[str] = field(default_factory=list)


def check_ns(ns: Any, where: str) -> str:
    if not isinstance(ns, str) or not NS_RE.match(ns):
        raise bad("kv_bad_namespace", f"{where}: ns must match {NS_RE.pattern}")
    return ns


def check_key(key: Any, where: str, what: str = "key") -> str:
    if not isinstance(key, str) or not key:
        raise bad("kv_bad_key", f"{where}: {what} must be a non-empty string")
    if "\x00" in key:
        raise bad("kv_bad_key", f"{where}: {what} must not contain NUL")
    if len(key.encode()) > MAX_KEY_BYTES:
        raise PayloadTooLarge("kv_key_too_large", f"{where}: {what} is longer than {MAX_KEY_BYTES} bytes (UTF-8)")
    return key


def check_value(value: Any, where: str) -> Any:
    raw = orjson.dumps(value)
    if len(raw) > MAX_VALUE_BYTES:
        raise PayloadTooLarge("kv_value_too_large", f"{where}: value is {len(raw)} bytes of JSON; the limit is {MAX_VALUE_BYTES}")
    if b"\\u0000" in raw:
        raise bad("kv_bad_value", f"{where}: value contains a NUL character in a string, which cannot be stored")
    return value


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _expiry(op: dict[str, Any], where: str) -> int | None:
    """Exactly one of ttlSeconds (a positive integer) and forever:true. Returns seconds or None (forever)."""
    ttl = op.get("ttlSeconds")
    forever = op.get("forever")
    if forever is not None and not isinstance(forever, bool):
        raise bad("kv_bad_ttl", f"{where}: forever must be true when given")
    declared = (ttl is not None) + (forever is True)
    if declared != 1:
        raise bad(
            "kv_expiry_not_specified",
            f"{where}: give exactly one of ttlSeconds (a positive integer) and forever:true; a write never "
            "inherits the previous expiry",
        )
    if ttl is None:
        return None
    if not _int(ttl) or ttl <= 0 or ttl > MAX_TTL_S:
        raise bad("kv_bad_ttl", f"{where}: ttlSeconds must be an integer between 1 and {MAX_TTL_S}")
    return int(ttl)


def _expect(op: dict[str, Any], where: str) -> int | None:
    if "expect" not in op:
        return None
    v = op["expect"]
    if not _int(v) or v < 0 or v > MAX_VERSION:
        raise bad("kv_bad_expect", f"{where}: expect must be an integer version >= 0 (0 = must not exist)")
    return int(v)


def op_name(op: Any, where: str, known: Collection[str], surface: str) -> str:
    """The ``op`` of one operation of a KV-like batch (``surface``: ``kv``, ``locks``), once it is an object
    naming a known op and carrying no tenant field; refused with ``<surface>_bad_request`` otherwise."""
    code = f"{surface}_bad_request"
    if not isinstance(op, dict):
        raise BadRequest(f"{surface}_bad_body", f"{where}: each operation must be a JSON object", code=code)
    name = op.get("op")
    if not isinstance(name, str) or name not in known:
        raise BadRequest(f"{surface}_unknown_op", f"{where}: unknown op {str(name)[:64]!r}; known: {sorted(known)}",
                         code=code)
    for k in op:
        if k in _TENANT_FIELDS:
            raise BadRequest(f"{surface}_tenant_not_an_input",
                             f"{where}: {k!r} is not an input; the tenant comes from the credential", code=code)
    return name


def parse_op(op: Any, i: int, *, in_tx: bool) -> dict[str, Any]:
    where = f"op {i}"
    name = op_name(op, where, _FIELDS, "kv")
    for k in op:
        if k not in _FIELDS[name]:
            if k in ("ttlSeconds", "forever", "expiresAt", "expires_at", "ttl"):
                raise bad("kv_bad_ttl", f"{where}: {name} takes no expiry field {k!r}; the expiry is ttlSeconds "
                          "or forever:true, on put/putIfAbsent/incr only")
            if k == "expect":
                raise bad("kv_bad_expect", f"{where}: {name} takes no expect")
            raise bad("kv_unknown_field", f"{where}: {name} does not take the field {k!r}")
    if in_tx and name == "getPrefix":
        raise bad("kv_get_prefix_not_allowed_in_transaction",
                  f"{where}: getPrefix is not allowed inside a transaction; use getMany, or getPrefix on POST /api/v1/kv")
    ns = check_ns(op.get("ns"), where)
    if ns in RESERVED_NS and name in WRITES:
        raise bad("kv_reserved_namespace", f"{where}: the namespace {ns!r} holds lock permits and is written only "
                  "through POST /api/v1/locks; it can be read (get, getMany, getPrefix, check)")
    out: dict[str, Any] = {"op": name, "name": name, "ns": ns}
    req = op.get("required")
    if req is not None and not isinstance(req, bool):
        raise bad("kv_bad_body", f"{where}: required must be a boolean")
    out["required"] = bool(req)

    if name == "getMany":
        keys = op.get("keys")
        if not isinstance(keys, list) or not keys:
            raise bad("kv_bad_key", f"{where}: keys must be a non-empty array of keys")
        seen: dict[str, None] = {}
        for j, k in enumerate(keys):
            seen[check_key(k, f"{where} keys[{j}]")] = None
        out["keys"] = list(seen)
        return out
    if name == "getPrefix":
        prefix = op.get("prefix")
        if not isinstance(prefix, str) or not prefix:
            raise bad("kv_prefix_required", f"{where}: getPrefix needs a non-empty prefix; a namespace is not a table to enumerate")
        out["prefix"] = check_key(prefix, where, "prefix")
        after = op.get("after")
        out["after"] = None if after is None else check_key(after, where, "after")
        limit = op.get("limit")
        if limit is None:
            limit = PREFIX_DEFAULT_LIMIT
        elif not _int(limit):
            raise bad("kv_bad_body", f"{where}: limit must be an integer (it is clamped to 1..{PREFIX_MAX_LIMIT})")
        out["limit"] = max(1, min(PREFIX_MAX_LIMIT, int(limit)))
        keys_only = op.get("keysOnly")
        if keys_only is not None and not isinstance(keys_only, bool):
            raise bad("kv_bad_body", f"{where}: keysOnly must be a boolean")
        out["keysOnly"] = bool(keys_only)
        return out

    out["key"] = check_key(op.get("key"), where)
    if name == "get":
        return out
    expect = _expect(op, where)
    if name in ("put", "putIfAbsent"):
        if "value" not in op:
            raise bad("kv_bad_body", f"{where}: {name} needs a value (null is a value; an absent value is not)")
        out["value"] = check_value(op["value"], where)
        out["ttl"] = _expiry(op, where)
        if name == "putIfAbsent":
            if expect not in (None, 0):
                raise bad("kv_bad_expect", f"{where}: putIfAbsent is put with expect 0; a different expect is refused")
            expect = 0
            out["op"] = "put"
        out["expect"] = expect
    elif name == "delete":
        out["expect"] = expect
    elif name == "check":
        if expect is None:
            raise bad("kv_bad_expect", f"{where}: check needs expect (the version the key must be at, or 0 for absent)")
        out["expect"] = expect
    elif name == "incr":
        delta = op.get("delta", 1)
        if delta is None:
            delta = 1
        if not _number(delta):
            raise bad("kv_bad_body", f"{where}: delta must be a number")
        out["delta"] = delta
        for bound in ("min", "max"):
            v = op.get(bound)
            if v is not None and not _number(v):
                raise bad("kv_bad_body", f"{where}: {bound} must be a number")
            out[bound] = v
        out["ttl"] = _expiry(op, where)
        out["expect"] = None
    return out


def parse_ops(ops: Any, *, max_ops: int, in_tx: bool = False) -> KvCall:
    if not isinstance(ops, list):
        raise bad("kv_bad_body", "operations must be an array of KV ops")
    if len(ops) > max_ops:
        raise bad("kv_too_many_ops", f"{len(ops)} ops in one call; the limit is {max_ops}")
    call = KvCall()
    written: dict[tuple[str, str], int] = {}
    key_budget = KEY_BUDGET_TX if in_tx else KEY_BUDGET_CALL
    keys = 0
    for i, raw in enumerate(ops):
        op = parse_op(raw, i, in_tx=in_tx)
        name = op["name"]
        call.names.append(name)
        if name in WRITES:
            call.writes += 1
            k = (op["ns"], op["key"])
            if k in written:
                raise bad("kv_duplicate_key_in_call",
                          f"op {i}: {op['ns']}/{op['key']} is already written by op {written[k]} of this call; "
                          "at most one write per key per call")
            written[k] = i
        else:
            call.reads += 1
        keys += len(op["keys"]) if name == "getMany" else op["limit"] if name == "getPrefix" else 1
        call.ops.append(op)
    if keys > key_budget:
        raise bad("kv_too_many_keys", f"this call touches {keys} keys (getMany counts its keys, getPrefix its limit); "
                  f"the limit is {key_budget}")
    return call


def batch_operations(body: Any, surface: str) -> Any:
    """The ``operations`` of a ``{"operations": [...]}`` body of a KV-like batch route (``surface``: ``kv``,
    ``locks``); any other shape, field or a tenant is refused with ``<surface>_bad_request``."""
    code = f"{surface}_bad_request"
    if not isinstance(body, dict):
        raise BadRequest(f"{surface}_bad_body", "the body must be a JSON object {\"operations\": [...]}", code=code)
    for k in body:
        if k in _TENANT_FIELDS:
            raise BadRequest(f"{surface}_tenant_not_an_input", f"{k!r} is not an input; the tenant comes from the "
                             "credential", code=code)
        if k != "operations":
            raise BadRequest(f"{surface}_bad_body", f"unknown field {str(k)[:64]!r}; the body is "
                             "{\"operations\": [...]}", code=code)
    if "operations" not in body:
        raise BadRequest(f"{surface}_bad_body", "the body needs an operations array", code=code)
    return body["operations"]


def parse_body(body: Any, *, max_ops: int) -> KvCall:
    return parse_ops(batch_operations(body, "kv"), max_ops=max_ops)

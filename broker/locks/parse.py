"""Lock op validation: the wire ops of docs/protocol.md §5 in, normalised ops for ``queen_locks_apply`` out.

Everything a client can get wrong is refused here, before any SQL, with 400 ``locks_bad_request`` and a
reason naming the rule and the op index; a refused call changes nothing.

- ``acquire {name, ttlSeconds, owner?, limit?}``: ``limit`` 1..1024 (default 1, a lock); no owner: the
  broker mints one and answers it.
- ``renew {name, token, ttlSeconds, slot?, owner?}``, ``release {name, token, slot?}``, ``get {name}``.
- name: a non-empty string of at most 256 UTF-8 bytes, no ``#`` (it separates the name from the slot in
  the permit row's key), no control characters (C0, DEL, C1); owner: the same without the ``#`` rule.
- token: an integer > 0; slot: an integer 0..1023; ttlSeconds: an integer 1..``MAX_TTL_S`` (no forever:
  a permit nobody renews must end).
- at most 64 ops per call, each lock named at most once, and at most 4096 slot rows per call (an acquire
  counts its ``limit``, every other op 1).

Normalised: ``{"op", "name", "ttl", "owner", "limit"}`` (acquire), ``{"op", "name", "token", "ttl",
"slot", "owner"}`` (renew), ``{"op", "name", "token", "slot"}`` (release), ``{"op", "name"}`` (get).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from broker.errors import BadRequest
from broker.kv.parse import MAX_TTL_S, MAX_VERSION, batch_operations, op_name

CODE = "locks_bad_request"
MAX_OPS = 64
SLOT_BUDGET = 4096
MAX_NAME_BYTES = 256
MAX_OWNER_BYTES = 256
MAX_LIMIT = 1024

_FIELDS: dict[str, frozenset[str]] = {
    "acquire": frozenset({"op", "name", "ttlSeconds", "owner", "limit"}),
    "renew": frozenset({"op", "name", "token", "ttlSeconds", "slot", "owner"}),
    "release": frozenset({"op", "name", "token", "slot"}),
    "get": frozenset({"op", "name"}),
}
# The ops that must pass the limits rungs (they take or extend a permit); a release gives one back and,
# like a timer cancel, is never refused by a rung.
ADMITTED = frozenset({"acquire", "renew"})


def bad(reason: str, detail: str) -> BadRequest:
    return BadRequest(reason, detail, code=CODE)


@dataclass
class LockCall:
    """A validated call: normalised ops plus what admission needs to know."""

    ops: list[dict[str, Any]] = field(default_factory=list)
    admitted: int = 0  # acquire + renew: the ops that pass the limits rungs
    writes: int = 0  # every op but get: the ones that need the produce grant


def _is_control(ch: str) -> bool:
    code = ord(ch)
    return code < 0x20 or 0x7F <= code <= 0x9F


def _text(v: Any, where: str, what: str, max_bytes: int, reason: str, *, hash_ok: bool) -> str:
    rule = f"a non-empty string of at most {max_bytes} UTF-8 bytes without control characters"
    if not hash_ok:
        rule += " and without '#'"
    if (not isinstance(v, str) or not v or len(v.encode("utf-8", "surrogatepass")) > max_bytes
            or any(_is_control(c) or (not hash_ok and c == "#") or 0xD800 <= ord(c) <= 0xDFFF for c in v)):
        raise bad(reason, f"{where}: {what} must be {rule}")
    return v


def _int(op: dict[str, Any], key: str, where: str, lo: int, hi: int, reason: str, what: str) -> int:
    v = op.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise bad(reason, f"{where}: {key} must be {what} ({lo}..{hi})")
    return v


def mint_owner() -> str:
    """The owner of an acquire that named none (answered back, so the caller can renew under it)."""
    return f"broker:{secrets.token_hex(8)}"


def parse_op(op: Any, i: int) -> dict[str, Any]:
    where = f"op {i}"
    kind = op_name(op, where, _FIELDS, "locks")
    for k in op:
        if k not in _FIELDS[kind]:
            raise bad("locks_unknown_field", f"{where}: {kind} does not take the field {str(k)[:64]!r}; it takes "
                      f"{sorted(_FIELDS[kind] - {'op'})}")
    out: dict[str, Any] = {"op": kind, "name": _text(op.get("name"), where, "name", MAX_NAME_BYTES, "locks_bad_name",
                                                      hash_ok=False)}
    if kind == "get":
        return out
    if kind in ("renew", "release"):
        out["token"] = _int(op, "token", where, 1, MAX_VERSION, "locks_bad_token",
                            "the permit's token, an integer above zero")
        slot = op.get("slot")
        out["slot"] = None if slot is None else _int(op, "slot", where, 0, MAX_LIMIT - 1, "locks_bad_slot",
                                                     "the permit's slot, an integer")
        if kind == "release":
            return out
    out["ttl"] = _int(op, "ttlSeconds", where, 1, MAX_TTL_S, "locks_bad_ttl",
                      "a whole number of seconds above zero; there is no forever, a holder that needs longer renews")
    owner = op.get("owner")
    if owner is not None:
        owner = _text(owner, where, "owner", MAX_OWNER_BYTES, "locks_bad_owner", hash_ok=True)
    if kind == "acquire":
        out["owner"] = owner if owner is not None else mint_owner()
        out["limit"] = 1 if op.get("limit") is None else _int(op, "limit", where, 1, MAX_LIMIT, "locks_bad_limit",
                                                               "the number of permits, 1 for a lock")
    else:
        out["owner"] = owner
    return out


def parse_ops(ops: Any) -> LockCall:
    if not isinstance(ops, list):
        raise bad("locks_bad_body", "operations must be an array of lock ops")
    if len(ops) > MAX_OPS:
        raise bad("locks_too_many_ops", f"{len(ops)} ops in one call; the limit is {MAX_OPS}")
    call = LockCall()
    named: dict[str, int] = {}
    slots = 0
    for i, raw in enumerate(ops):
        op = parse_op(raw, i)
        if op["name"] in named:
            raise bad("locks_duplicate_name", f"op {i}: lock {op['name']!r} is already named by op {named[op['name']]} "
                      "of this call; each lock at most once per call")
        named[op["name"]] = i
        slots += op.get("limit", 1)
        call.admitted += op["op"] in ADMITTED
        call.writes += op["op"] != "get"
        call.ops.append(op)
    if slots > SLOT_BUDGET:
        raise bad("locks_too_many_slots", f"this call spans {slots} slot rows (an acquire counts its limit, every "
                  f"other op 1); the limit is {SLOT_BUDGET}")
    return call


def parse_body(body: Any) -> LockCall:
    return parse_ops(batch_operations(body, "locks"))

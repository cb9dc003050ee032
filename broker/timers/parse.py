"""Timer op validation: the wire's ops become ``TimerOp`` values, or a 400 that names the problem.

Rules (docs/timer-routes.md, docs/protocol.md §3.1):

- ``op`` is ``schedule``, ``reschedule`` (the same upsert), ``cancel``, or, for recurring timers only,
  ``pause`` and ``resume`` (``queue`` and ``timerKey`` only).
- A schedule/reschedule with a ``recur`` object is a recurring timer (``broker.timers.recur``: a cron
  expression with its zone, or ``everyMs``, and the ``missed`` policy); ``delayMs`` is then optional (the
  first occurrence of an interval schedule, default one interval) and refused beside ``cron``.
- schedule/reschedule carry ``queue``, ``timerKey``, ``payload`` (base64), ``delayMs`` (integer; zero
  and negative are legal and fire on the first cycle), ``txn``; optionally ``partition`` and
  ``payloadZstd``. cancel carries ``queue``, ``timerKey`` and optionally ``txn`` (echoed on absent).
- Fields the server owns (producer identity, tenant, message id, any absolute instant, attempts, claim
  state, and any key starting with ``_``) are a refusal naming the field, never a silent drop.
- Any other unknown field, or an unknown op, is a refusal. JSON ``null`` on an optional field is absent.
- The same (queue, timerKey) twice in one call is a refusal: the batch is index-aligned and each op
  must have one unambiguous outcome.

Plan checks (horizon, payload ceiling) need the tenant's plan and live in ``service``.
"""

from __future__ import annotations

import binascii
from typing import Any, NamedTuple

from broker.errors import BadRequest
from broker.timers import recur
from broker.timers.recur import Schedule

CODE = "timers_bad_request"

SCHEDULE, RESCHEDULE, CANCEL, PAUSE, RESUME = "schedule", "reschedule", "cancel", "pause", "resume"
_OPS = (SCHEDULE, RESCHEDULE, CANCEL, PAUSE, RESUME)
_SCHEDULING = frozenset({SCHEDULE, RESCHEDULE})

SERVER_OWNED = frozenset(
    {
        "producerSub",
        "producer_sub",
        "messageId",
        "message_id",
        "tenant",
        "tenantId",
        "tenant_id",
        "deliverAt",
        "deliver_at",
        "delaySeconds",
        "delay_seconds",
        "attempts",
        "claimToken",
        "claim_token",
        "claimedUntil",
        "claimed_until",
    }
)
_SCHEDULE_FIELDS = frozenset({"op", "queue", "timerKey", "payload", "delayMs", "txn", "partition", "payloadZstd", "recur"})
_CANCEL_FIELDS = frozenset({"op", "queue", "timerKey", "txn"})
_PAUSE_FIELDS = frozenset({"op", "queue", "timerKey"})


def _fields_of(op: object) -> frozenset[str]:
    if op == CANCEL:
        return _CANCEL_FIELDS
    if op == PAUSE or op == RESUME:
        return _PAUSE_FIELDS
    return _SCHEDULE_FIELDS

# Name sizes: generous, but bounded so a key always fits the primary-key index.
MAX_QUEUE = 256
MAX_PARTITION = 256
MAX_KEY = 1024
MAX_TXN = 256
# A delay in the past is legal; one further back than this is nonsense (and would overflow a timestamp).
MIN_DELAY_MS = -(10**12)


class TimerOp(NamedTuple):
    """One validated op (immutable). A named tuple, not a frozen dataclass: a 256-op batch builds 256 of
    them and a frozen dataclass took 1 us each to construct (a third of the op's validation)."""

    op: str
    queue: str
    key: str
    txn: str | None
    partition: str | None = None
    payload: bytes | None = None
    payload_zstd: bool = False
    delay_ms: int | None = None
    recur: Schedule | None = None  # a recurring schedule (schedule/reschedule only)

    @property
    def is_schedule(self) -> bool:
        """A promise of a frame: schedule or reschedule (one-shot or recurring), never cancel/pause/resume."""
        return self.op in _SCHEDULING

    @property
    def is_recurring(self) -> bool:
        """Applied by queen_timers_recur_apply: a recurring schedule, a pause, a resume."""
        return self.recur is not None or self.op == PAUSE or self.op == RESUME


def bad(reason: str, detail: str, index: int | None = None, **extra: object) -> BadRequest:
    if index is not None:
        extra = {"index": index, **extra}
        detail = f"op {index}: {detail}"
    return BadRequest(reason, detail, code=CODE, extra=extra)


def check_name(value: object, field: str, reason: str, limit: int, index: int | None = None) -> str:
    if type(value) is not str or not value:
        raise bad(reason, f"`{field}` must be a non-empty string", index, field=field)
    if len(value) * 4 > limit:  # only a long name can be too long in bytes: encode just those
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            raise bad("timers_bad_name", f"`{field}` is not valid UTF-8 text", index, field=field) from None
        if size > limit:
            raise bad("timers_name_too_long", f"`{field}` is longer than {limit} bytes", index, field=field)
    elif not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise bad("timers_bad_name", f"`{field}` is not valid UTF-8 text", index, field=field) from None
    if "\x00" in value:
        raise bad("timers_bad_name", f"`{field}` contains a NUL character", index, field=field)
    return value


def _refuse_fields(raw: dict[str, Any], op: object, index: int | None) -> None:
    """An op with a field that is not one of its op's fields: name the first offender, a server-owned
    field before an unknown op before a field of the other op's shape."""
    for field in raw:
        if field in SERVER_OWNED or field.startswith("_"):
            raise bad(
                "timers_server_owned_field",
                f"`{field}` is owned by the server and cannot be supplied (the producer and tenant come from "
                "the credential, the message id is minted by the broker, and only the relative delayMs "
                "is expressible)",
                index,
                field=field,
            )
    if op not in _OPS:
        raise bad("timers_bad_op", f"unknown op {op!r}: expected schedule, reschedule, cancel, pause or resume", index)
    allowed = _fields_of(op)
    for field in raw:
        if field not in allowed:
            raise bad("timers_unknown_field", f"`{field}` is not a field of a {op} op", index, field=field)


def parse_op(raw: Any, index: int | None = None) -> TimerOp:
    if not isinstance(raw, dict):
        raise bad("timers_bad_op", "each operation must be a JSON object", index)
    op = raw.get("op")
    # The common case (every field one of its op's) is one subset test; only an op carrying some
    # other field is walked field by field, to name the offender.
    if not raw.keys() <= (_SCHEDULE_FIELDS if op == SCHEDULE else _fields_of(op)):
        _refuse_fields(raw, op, index)
    if op not in _OPS:
        raise bad("timers_bad_op", f"unknown op {op!r}: expected schedule, reschedule, cancel, pause or resume", index)
    queue = check_name(raw.get("queue"), "queue", "timers_queue_required", MAX_QUEUE, index)
    key = check_name(raw.get("timerKey"), "timerKey", "timers_key_required", MAX_KEY, index)
    txn_raw = raw.get("txn")
    if op == CANCEL:
        txn = None if txn_raw is None else check_name(txn_raw, "txn", "timers_bad_txn", MAX_TXN, index)
        return TimerOp(CANCEL, queue, key, txn)
    if op == PAUSE or op == RESUME:
        return TimerOp(op, queue, key, None)
    txn = check_name(txn_raw, "txn", "timers_txn_required", MAX_TXN, index)
    part_raw = raw.get("partition")
    partition = None if part_raw is None else check_name(part_raw, "partition", "timers_bad_partition", MAX_PARTITION, index)
    zstd_raw = raw.get("payloadZstd")
    if zstd_raw is not None and not isinstance(zstd_raw, bool):
        raise bad("timers_bad_payload_zstd", "`payloadZstd` must be a boolean", index, field="payloadZstd")
    delay = raw.get("delayMs")
    recur_raw = raw.get("recur")
    schedule: Schedule | None = None
    if recur_raw is not None:
        try:
            schedule = recur.parse(recur_raw, has_delay=delay is not None)
        except recur.RecurError as exc:
            raise bad(exc.reason, exc.detail, index, field=exc.field) from None
    if delay is None and schedule is None:
        raise bad("timers_delay_required", "`delayMs` (integer milliseconds from now) is required", index, field="delayMs")
    if delay is None:
        pass
    elif isinstance(delay, bool) or not isinstance(delay, int):
        raise bad("timers_bad_delay", "`delayMs` must be an integer number of milliseconds", index, field="delayMs")
    elif delay < (0 if schedule is not None else MIN_DELAY_MS):
        floor = 0 if schedule is not None else MIN_DELAY_MS
        raise bad("timers_bad_delay", f"`delayMs` must be >= {floor}", index, field="delayMs")
    payload_raw = raw.get("payload")
    if payload_raw is None:
        raise bad("timers_payload_required", "`payload` (base64) is required", index, field="payload")
    if not isinstance(payload_raw, str):
        raise bad("timers_payload_not_base64", "`payload` must be a base64 string", index, field="payload")
    try:
        payload = binascii.a2b_base64(payload_raw, strict_mode=True)  # base64.b64decode(validate=True), minus a layer
    except (binascii.Error, ValueError):
        raise bad("timers_payload_not_base64", "`payload` is not valid base64", index, field="payload") from None
    return TimerOp(op, queue, key, txn, partition, payload, bool(zstd_raw), delay, schedule)


def parse_ops(raw: Any, *, max_ops: int) -> list[TimerOp]:
    """Validate a whole ``operations`` array; any refusal refuses the whole call."""
    if not isinstance(raw, list):
        raise bad("timers_bad_body", "`operations` must be an array of timer operations")
    if len(raw) > max_ops:
        raise bad("timers_too_many_ops", f"at most {max_ops} operations per call, got {len(raw)}", limit=max_ops)
    ops = [parse_op(item, i) for i, item in enumerate(raw)]
    seen: dict[tuple[str, str], int] = {}
    for i, op in enumerate(ops):
        first = seen.setdefault((op.queue, op.key), i)
        if first != i:
            raise bad(
                "timers_duplicate_key",
                f"queue {op.queue!r} timerKey {op.key!r} already appears at op {first}; one op per timer per call",
                i,
            )
    return ops

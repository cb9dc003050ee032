"""The contract catalogue: one stable id per checkable sentence.

Read it as a table. Each entry is ``C(id, source, sentence)``: ``source`` names the document and section
the sentence comes from, ``sentence`` is the sentence itself (quoted from the timer spec, or stated in
our own words for the wire facts of docs/protocol.md and the decisions of docs/decisions.md). Ids never change meaning: a contract
that is dropped keeps its id retired, a new one gets a new id.

Sources:
  TR   = docs/timer-routes.md (the timer spec), gone through sentence by sentence; the sentences that
         state a reason or a design choice rather than something a broker can be caught doing are
         listed in ``INFORMATIVE`` with why they carry no id.
  DL   = docs/decisions.md §2 and docs/queued-call-deadlines.md: deadlines on queued messages.
  KV   = docs/protocol.md §4 (KV wire and semantics).
  LIM  = docs/decisions.md §4: plans, quotas and the degradation rungs; docs/protocol.md §3.4/§4.4/§7.
  ENV  = the envelope and status-code rules (broker/errors.py, docs/protocol.md §1.7).
  P3   = docs/protocol.md §3 (timer wire details not spelled out in the spec).
  LOG  = the README's "Message log" section and docs/protocol.md §2 (push, pop, ack, leases, DLQ, lookups,
         configure, retention, encryption as the wire sees it, transactions of pushes and acks).
  EDGE = every numeric rule at its exact boundary (the allowed value passes, the next one is refused);
         edges the target states (horizon, max payload) are read from GET /api/v1/usage.
  XB   = the README's "Multiple brokers on one database": contracts that need two --url of one deployment
         (NOT VERIFIED with one).
  LCK  = docs/protocol.md §5 and docs/decisions.md §8: locks and semaphores (POST /api/v1/locks), their
         fencing tokens, and the guard inside a transaction.
  EPH  = docs/protocol.md §6: the ephemeral queues (/api/v1/ephemeral/*).
  REC  = docs/timer-routes.md §15 and docs/concepts/recurring-schedules.md: recurring timers, this broker's
         extension of the timer wire (the extensions profile: the official client has no call for them).
  CELL = docs/guides/cells.md: tenants of a deployment of several cells behind a proxy (NOT VERIFIED
         without two tenants' tokens and each tenant's cell URL).

``queen conformance --list`` prints every id with its sentence, its profile and the tests that check it.

Profiles (``queen conformance --profile core,timers``; the default runs all and reports per profile):
  core        what the Queen wire and the official client require of any compatible broker
              (docs/protocol.md; the queen-mq client's own tolerance decides where the protocol allows a set:
              any 2xx is a success, an empty pop is 200-with-no-messages or 204, an error body has ``error`` and
              may have ``reason``).
  timers      the timer routes (docs/timer-routes.md) and what rides on them.
  deadlines   per-message deadlines on queued messages (docs/queued-call-deadlines.md).
  strict      this broker's choices where the protocol allows a range: unknown and server-owned fields
              refused, exact status codes (201 for push, 204 for an empty pop), the envelope's ``reason`` and
              ``detail``, our size and count limits.
  extensions  routes the official client may call but a broker may not offer: KV, locks, ephemeral queues,
              streams, monitoring and operator routes, tenants and plans.

How a contract declares its profile (the only thing a new contract has to decide):
  * nothing, when its id prefix says it: ``PROFILE_BY_PREFIX`` below maps id prefixes to profiles, longest
    prefix first (``TMR-`` -> timers, so a new ``TMR-RECUR-...`` contract is a timers contract, ``LOG-`` ->
    core, ``KV-`` -> extensions ...);
  * ``profile="strict"`` (or any other profile) as the fourth argument of ``C(...)`` when it differs from
    its prefix's: ``C("LOG-PUSH-UNKNOWN-FIELD", src, sentence, profile="strict")``.
  The meta-test (conformance/test_catalogue.py) refuses a test that names a core contract together with a
  contract of another profile: a strict habit or a missing extension must never fail a core contract.

Features a broker may not offer (``FEATURES``, ``FEATURE_BY_PREFIX``): a contract that needs one names it
through its id prefix (or ``feature="..."``). At the start of a run each needed feature's probe is sent
once; a probe that answers 404, 405 or 501, or a page that is not JSON, makes every contract needing that
feature NOT IMPLEMENTED, reported once per feature and never as failures (unless its profile is required:
``--require``).

Reference deviations (``REFERENCE_DEVIATIONS``): a ``core`` contract that an independent implementation
fails although our reading of the protocol holds keeps failing it; the entry records the broker, what it
does and the evidence (protocol text, the official client's code).
"""

from __future__ import annotations

from dataclasses import dataclass

PROFILES: tuple[str, ...] = ("core", "timers", "deadlines", "strict", "extensions")


@dataclass(frozen=True)
class C:
    id: str
    source: str
    sentence: str
    profile: str | None = None  # None: the profile of its id prefix (PROFILE_BY_PREFIX)
    feature: str | None = None  # None: the feature of its id prefix (FEATURE_BY_PREFIX), if any


TR = "docs/timer-routes.md"
ML = "README / Message log"
E6 = "docs/protocol.md §6"
REC = "docs/timer-routes.md §15"

CONTRACTS: tuple[C, ...] = (
    # ---------------------------------------------------------------- timer spec: The routes
    C("TMR-CANCEL-WITHDRAWS", f"{TR} / What a timer is",
      "Scheduling promises a frame in a queue at a future instant; cancelling one withdraws the promise: a "
      "cancelled timer is never delivered."),
    C("TMR-POST-PRODUCE-GRANT", f"{TR} / The routes",
      "POST is write-only because scheduling a timer is a produce operation: the timer becomes a message, "
      "so a produce-only credential must be able to do it."),
    C("TMR-POST-WRITE-ONLY", f"{TR} / The routes",
      "POST is write-only: the batch route accepts schedule, reschedule and cancel operations and no read "
      "operation (a peek or list op in the array is a 400)."),
    C("TMR-NO-TENANT-LIST", f"{TR} / The routes",
      "There is no tenant-wide list. The queue is a path segment rather than a filter precisely so that no "
      "call can ask for \u201cevery timer of this tenant\u201d."),
    C("TMR-KEY-CATCH-ALL", f"{TR} / The routes",
      "*timerKey is a catch-all, so tenant/42 is a legal key written naturally."),
    # ---------------------------------------------------------------- Cancel is not schedule
    C("TMR-CANCEL-ROUTE", f"{TR} / Cancel is not schedule",
      "DELETE /api/v1/timers/:queue/*timerKey exists as a separate route: it cancels a pending timer and "
      "answers the single result object {ok: true, status: cancelled, ...}."),
    C("TMR-CANCEL-NO-GRANT", f"{TR} / Cancel is not schedule",
      "The DELETE route has a separate authorization class: not a missing grant may refuse it (a tenant "
      "credential without the produce grant cancels)."),
    C("TMR-CANCEL-PASSES-PAUSED", f"{TR} / Cancel is not schedule",
      "The DELETE route passes only the boot flag. Not a paused schedule ... may refuse it."),
    C("TMR-CANCEL-PASSES-QUOTA", f"{TR} / Cancel is not schedule",
      "The DELETE route passes only the boot flag. ... not a full quota may refuse it."),
    C("TMR-CANCEL-PASSES-DISABLED", f"{TR} / Cancel is not schedule",
      "The DELETE route passes only the boot flag: the operator's scheduling kill switch (POST answers 503 "
      "timers_disabled) does not refuse it."),
    C("TMR-POST-CARRIES-CANCELS", f"{TR} / Cancel is not schedule",
      "POST /api/v1/timers carries cancels in the same array as schedules."),
    C("TMR-FIRE-NOT-STOPPED-BY-RUNGS", f"{TR} / Cancel is not schedule",
      "The fire never switches itself off: no degradation rung may stop it."),
    C("TMR-FIRE-OPERATOR-STOP", f"{TR} / Cancel is not schedule",
      "Only an operator can stop the fire (pausing the sweeper holds due timers; resuming fires them)."),
    C("TMR-BLOCKED-BATCH-WHOLE", f"{TR} / Cancel is not schedule",
      "A mixed batch sent to POST when the cluster is blocked is refused whole, explicitly, rather than "
      "having half of it silently dropped."),
    C("TMR-BLOCKED-HINT", f"{TR} / Cancel is not schedule",
      "The refusal carries an x-queen-timers-hint header naming the route that always works."),
    C("TMR-BATCH-CANCEL-AUTH", f"{TR} / Cancel is not schedule",
      "One that cancels inside a batch has chosen the schedule route's authorization (a cancel-only POST "
      "from a credential without the produce grant is refused; the DELETE route is not)."),
    # ---------------------------------------------------------------- Scheduling
    C("TMR-SCHEDULE-EXAMPLE", f"{TR} / Scheduling",
      "The example body {operations:[{op: schedule, queue, timerKey, delayMs, txn, payload (base64), "
      "partition}]} is accepted and schedules the timer."),
    C("TMR-UPSERT", f"{TR} / Scheduling",
      "schedule and reschedule are the same upsert on (tenant, queue, timerKey), so a client retry after a "
      "crash is safe by construction (a repeated schedule leaves one timer and delivers one message)."),
    C("TMR-UPSERT-STATUS-BY-ROW", f"{TR} / Scheduling",
      "Same upsert: the status (scheduled vs rescheduled) is decided by whether the row existed, not by the "
      "op name."),
    C("TMR-UPSERT-PER-TENANT", f"{TR} / Scheduling",
      "The upsert key includes the tenant: another tenant's timer with the same queue and timerKey is a "
      "different timer."),
    C("TMR-RESCHEDULE-RESETS", f"{TR} / Scheduling",
      "A reschedule resets the attempt budget and clears the last error."),
    C("TMR-RESCHEDULE-NEW-MESSAGE", f"{TR} / Scheduling",
      "Each reschedule mints a new txn, because it is a new message (a new messageId; the delivered frame "
      "carries the reschedule's txn and id, the replaced one is never delivered)."),
    C("TMR-RELATIVE-ONLY", f"{TR} / Scheduling",
      "Only relative durations are on this wire; an absolute instant is not expressible (deliverAt or any "
      "other instant field as input is a 400)."),
    C("TMR-ONE-CLOCK", f"{TR} / Scheduling",
      "There is one clock, PostgreSQL's: deliverAt is the broker's now plus delayMs (two ops of one call "
      "differ by exactly their delay difference)."),
    C("TMR-DELAY-MS", f"{TR} / Scheduling",
      "Durations that can be sub-second are in milliseconds: a 250 ms delayMs means 250 ms."),
    C("KV-TTL-SECONDS", f"{TR} / Scheduling",
      "Durations that cannot be sub-second are in seconds: ttlSeconds on the KV routes."),
    # ---------------------------------------------------------------- Fields the server owns
    C("TMR-OWNED-PRODUCERSUB", f"{TR} / Fields the server owns",
      "producerSub is not input: supplying one is a 400, never a silent drop."),
    C("TMR-OWNED-MESSAGEID", f"{TR} / Fields the server owns",
      "messageId is not input: supplying one is a 400, never a silent drop."),
    C("TMR-OWNED-TENANT", f"{TR} / Fields the server owns",
      "tenant is not input: supplying one is a 400, never a silent drop."),
    C("TMR-OWNED-UNDERSCORE", f"{TR} / Fields the server owns",
      "Neither is any underscore-prefixed field: supplying one is a 400, never a silent drop."),
    C("TMR-PRODUCERSUB-ATTESTED", f"{TR} / Fields the server owns",
      "producerSub is the one non-repudiable field a frame has: the delivered frame carries the scheduler's "
      "authenticated sub."),
    C("TMR-MESSAGEID-AT-SCHEDULE", f"{TR} / Fields the server owns",
      "The messageId is minted at schedule time and returned in the response, so a client can correlate "
      "the delivered frame without a second call."),
    # ---------------------------------------------------------------- deliverAt is a floor
    C("TMR-DELIVERAT-FLOOR", f"{TR} / deliverAt is a floor",
      "deliverAt means \u201cnot before\u201d, never \u201cexactly at\u201d: no frame is created before its "
      "deliverAt."),
    C("TMR-FIRE-LAG", f"{TR} / deliverAt is a floor",
      "A healthy timer lands within about ten milliseconds of the sweeper's minimum sleep (checked loosely: "
      "within --queen-lag-budget-ms, default 1000, on a shared machine)."),
    C("TMR-FIRE-LAG-SERIES", f"{TR} / deliverAt is a floor",
      "queen_timers_fire_lag_seconds is the series that says which (it is exported on /metrics)."),
    C("TMR-FIRE-ORDER", f"{TR} / deliverAt is a floor",
      "Two timers on the same queue and partition that mature in the same cycle enter the log in expiry "
      "order, which is not necessarily the order they were scheduled in."),
    C("TMR-FIRES-ONCE", f"{TR} / deliverAt is a floor",
      "There is no recurrence. A timer fires once."),
    # ---------------------------------------------------------------- Encryption happens at schedule
    C("TMR-ENCRYPT-AT-SCHEDULE", f"{TR} / Encryption happens at schedule",
      "When the destination queue encrypts at rest, the payload is encrypted when the timer is scheduled, "
      "not when it fires."),
    C("TMR-ENCRYPT-LATE-CLEAR", f"{TR} / Encryption happens at schedule",
      "A queue whose encryption is switched on after a timer was scheduled delivers that frame in "
      "cleartext (the stored timer stays unencrypted and is delivered readable)."),
    C("TMR-ENCRYPT-KEY-ROTATED", f"{TR} / Encryption happens at schedule",
      "A key rotated between schedule and fire makes that frame undecryptable."),
    # ---------------------------------------------------------------- The closed status taxonomy
    C("TMR-STATUS-CLOSED", f"{TR} / The closed status taxonomy",
      "Every element of a schedule or cancel response carries ok and exactly one status, from this list "
      "and no other: scheduled, rescheduled, cancelled, absent, too_late."),
    C("TMR-SCHEDULE-RESULT", f"{TR} / The closed status taxonomy",
      "A successful schedule returns {ok, status, queue, timerKey, txn, messageId, deliverAt}."),
    # ---------------------------------------------------------------- too_late
    C("TMR-TOO-LATE-CANCEL", f"{TR} / too_late is a verdict, not a failure",
      "A cancel that lands on a claimed timer answers too_late with HTTP 200 (and the timer is still "
      "delivered)."),
    C("TMR-TOO-LATE-RESCHEDULE", f"{TR} / too_late is a verdict, not a failure",
      "A reschedule that lands on a claimed timer answers too_late with HTTP 200, and the old payload is "
      "what gets delivered."),
    C("TMR-TOO-LATE-BOUNDED", f"{TR} / too_late is a verdict, not a failure",
      "The window is bounded by the lease: once the claim's lease has passed, a cancel no longer answers "
      "too_late."),
    C("TMR-TOO-LATE-NEW-KEY", f"{TR} / too_late is a verdict, not a failure",
      "The remedy is a new key: scheduling another key on the same queue works while the first is claimed."),
    C("TMR-BACKOFF-CANCELLABLE", f"{TR} / too_late is a verdict, not a failure",
      "A timer in backoff after a failed fire is not claimed, and cancelling it succeeds."),
    # ---------------------------------------------------------------- absent
    C("TMR-ABSENT-MAY-BE-DELIVERED", f"{TR} / The contract absent carries",
      "absent means \u201cno longer pending\u201d. It may mean already delivered. The authority is the log: "
      "the timer's txn is found in the destination queue."),
    C("TMR-NO-TOMBSTONE", f"{TR} / The contract absent carries",
      "Delivery deletes the row rather than marking it done, so there is no tombstone (peek misses, list "
      "omits it)."),
    C("TMR-ABSENT-ECHOES-TXN", f"{TR} / The contract absent carries",
      "The response echoes the txn you supplied as the one query parameter the DELETE route reads: "
      "{ok: false, status: absent, queue, timerKey, txn}."),
    C("TMR-ABSENT-OK-FALSE", f"{TR} / The contract absent carries",
      "absent carries ok: false."),
    C("TMR-ABSENT-OTHER-TENANT", f"{TR} / The contract absent carries",
      "A cancel for another tenant's timer also answers absent (ok: false), and the timer is untouched."),
    # ---------------------------------------------------------------- Peek and list
    C("TMR-PEEK-SHAPE", f"{TR} / Peek and list",
      "GET /api/v1/timers/:queue/*timerKey returns one timer with its payload, base64 as stored: {found, "
      "queue, timerKey, partition, deliverAt, txn, messageId, payload, payloadZstd, encrypted, producerSub, "
      "attempts, lastError, claimed, createdAt, updatedAt}."),
    C("TMR-PEEK-MISS", f"{TR} / Peek and list",
      "A miss is 200 with {\"found\": false}, not a 404."),
    C("TMR-PEEK-NO-DECRYPT", f"{TR} / Peek and list",
      "Peek does not decrypt (an encrypted timer peeks as encrypted: true with the ciphertext)."),
    C("TMR-PEEK-CLAIMED", f"{TR} / Peek and list",
      "claimed is the single definition of \u201cin somebody's hands\u201d (a claimed timer peeks "
      "claimed: true)."),
    C("TMR-PEEK-BACKOFF-UNCLAIMED", f"{TR} / Peek and list",
      "A row in backoff reads claimed: false deliberately, because it is still cancellable."),
    C("TMR-LIST-SHAPE", f"{TR} / Peek and list",
      "GET /api/v1/timers/:queue returns {rows, truncated, nextAfter}, without payloads."),
    C("TMR-LIST-AFTER", f"{TR} / Peek and list",
      "after is an exclusive keyset cursor over timerKey."),
    C("TMR-LIST-BYTE-ORDER", f"{TR} / Peek and list",
      "The cursor is stable across machines because the column carries a byte collation (keys list in "
      "byte order: 'B' before 'a')."),
    C("TMR-LIST-LIMIT-DEFAULT", f"{TR} / Peek and list",
      "limit defaults to 100."),
    C("TMR-LIST-LIMIT-CLAMPED", f"{TR} / Peek and list",
      "limit is clamped rather than rejected."),
    C("TMR-LIST-TRUNCATED", f"{TR} / Peek and list",
      "truncated tells the truth (true exactly when more rows follow; nextAfter resumes after the last row)."),
    # ---------------------------------------------------------------- Status codes
    C("TMR-RUNG-CLASSES", f"{TR} / Status codes",
      "429 retry later, 403 retry forever and it will not help, 503 not your fault: a 429 carries "
      "Retry-After, a paused schedule is 403, the operator's scheduling switch is 503 timers_disabled with "
      "Retry-After."),
    C("TMR-HORIZON-403", f"{TR} / Status codes",
      "A horizon overrun is 403 and not 400 because it is a plan verdict rather than a malformed request."),
    C("TMR-HORIZON-90D", f"{TR} / Status codes",
      "The horizon is finite by default, ninety days."),
    C("TMR-HORIZON-NARROWS", f"{TR} / Status codes",
      "A tenant's own horizon narrows the cell's and never widens it."),
    C("TMR-PAYLOAD-CEILING", f"{TR} / Status codes",
      "The payload ceiling is derived, min(1 MiB, the plan's max payload), and never independent."),
    # ---------------------------------------------------------------- Metering
    C("MET-SCHEDULE-COUNTS", f"{TR} / Metering",
      "You are billed for the promise: each schedule operation in a batch counts as one message, and each "
      "reschedule counts as another."),
    C("MET-CANCEL-ZERO", f"{TR} / Metering",
      "A cancel counts zero and does not refund."),
    C("MET-FIRE-ZERO", f"{TR} / Metering",
      "The fire counts zero, because it was already billed."),
    C("MET-PER-OPERATION", f"{TR} / Metering",
      "The unit is the operation and not the call."),
    C("TMR-MAX-OPS-256", f"{TR} / Metering",
      "There is a cap of 256 operations per call (256 accepted, 257 refused with 400)."),
    # ---------------------------------------------------------------- Timers that keep failing
    C("TMR-FAIL-RETRIED", f"{TR} / Timers that keep failing",
      "A fire that fails is retried with exponential backoff (and is delivered once the failure clears; the "
      "exponential shape of the delays is not timed: too noisy on shared machines)."),
    C("TMR-TRANSIENT-FREE", f"{TR} / Timers that keep failing",
      "A transient failure (serialization, deadlock, connection, resource, operator intervention) backs off "
      "and costs nothing from the attempt budget."),
    C("TMR-PERMANENT-SPENDS", f"{TR} / Timers that keep failing",
      "The attempt budget is spent only on permanent and configuration failures."),
    C("TMR-DLQ-AFTER-MAX", f"{TR} / Timers that keep failing",
      "After QUEEN_SWEEPER_MAX_ATTEMPTS attempts the timer goes to the destination queue's DLQ under a "
      "synthetic consumer group."),
    C("TMR-DLQ-REPLAY-REFUSED", f"{TR} / Timers that keep failing",
      "Replaying that DLQ row is refused explicitly (409 dlq_replay_refused)."),
    C("TMR-TENANT-ISOLATION", "house rules / docs/timer-routes.md",
      "Another tenant's timers are invisible: its peek misses, its list of the same queue is empty, its "
      "lookup of the delivered txn finds nothing."),
    C("TMR-UNDELIVERABLE-PAYLOAD", "house rules / docs/protocol.md §2.8 / docs/timer-routes.md",
      "A timer whose payload the log cannot carry (not JSON) is either refused at schedule with a 400, or "
      "spends its attempts and lands in the DLQ as a row GET /api/v1/dlq can render (valid JSON); it is never "
      "lost and never breaks the DLQ listing."),
    # ---------------------------------------------------------------- docs/protocol.md §3 timer wire details
    C("TMR-PAST-DELAY", "docs/protocol.md §3.1",
      "A zero or negative delayMs is legal: the timer is due at once and fires on the first cycle."),
    C("TMR-PAYLOAD-ZSTD", "docs/protocol.md §3.1/§3.3",
      "payloadZstd: true marks the caller's payload as one zstd frame: peek shows it as sent with "
      "payloadZstd: true, and the delivered frame carries the decompressed payload."),
    C("TMR-INDEX-ALIGNED", "docs/protocol.md §3.2",
      "Timer results are index-aligned: results[i] answers operations[i]."),
    C("TMR-BAD-BATCH-CHANGES-NOTHING", "docs/protocol.md §3.4 / house rules",
      "A batch with one invalid op is a 400 in the envelope and applies none of its ops."),
    C("TMR-VALIDATION", "docs/protocol.md §3.4",
      "Malformed ops are 400 timers_bad_request: unknown op, missing queue/timerKey/delayMs, payload not "
      "base64, the same (queue, timerKey) twice in one call."),
    # ---------------------------------------------------------------- transactions with riders (docs/protocol.md §2.6)
    C("TXN-RIDERS-FLAT", "docs/protocol.md §2.6",
      "kv and timers ride as top-level fields of POST /api/v1/transaction; results are one flat index space: "
      "pushed items and acks in operation order, then kv, then timers (typed kv / timer)."),
    C("TXN-RIDERS-ONLY", "docs/protocol.md §2.6",
      "operations may be [] when the bundle is only riders."),
    C("TXN-ATOMIC", "docs/protocol.md §2.6 / docs/decisions.md §1",
      "All or nothing: a refused bundle (a requiredLeases entry that is not live) applies none of its pushes, "
      "kv writes or timer ops."),
    C("TXN-KV-PRECONDITION", "docs/protocol.md §2.6",
      "A lost required KV precondition answers HTTP 200 {success: false, reason: kv_precondition, failedIndex "
      "(flat), kvReason, version, value} and nothing in the bundle is applied."),
    C("TXN-TIMERS-DISABLED", "docs/protocol.md §2.6",
      "With scheduling switched off by the operator, a timers rider is refused with 403 timers_disabled "
      "inside a transaction (503 on the standalone route)."),
    C("DL-TXN", "docs/decisions.md §2",
      "A transaction push item may carry deadlineMs, with the same meaning as on the push route."),
    # ---------------------------------------------------------------- message log deadlines (docs/decisions.md §2)
    C("DL-NOT-DELIVERED", "docs/decisions.md §2 / docs/queued-call-deadlines.md",
      "A pop never hands out a message whose deadlineMs has passed."),
    C("DL-TO-DLQ", "docs/decisions.md §2 / docs/queued-call-deadlines.md",
      "An expired message lands in the DLQ with error deadline_exceeded, so nothing vanishes unseen."),
    C("DL-LIVE-DELIVERED", "docs/decisions.md §2 / docs/queued-call-deadlines.md",
      "A message within its deadline (or without one) is delivered as before."),
    C("DL-POP-DEADLINE", "docs/decisions.md §2 / docs/queued-call-deadlines.md §4",
      "A popped message carries deadlineAt: the absolute instant fixed at push by the broker's clock "
      "(createdAt + deadlineMs, ISO-8601 UTC), or null when it was pushed without a deadline."),
    C("DL-BAD-DEADLINE", "docs/decisions.md §2",
      "deadlineMs is a relative integer budget > 0; anything else is a 400 and nothing is pushed."),
    C("LOG-OWNED-FIELDS", "docs/decisions.md §1 / docs/protocol.md §2.3",
      "A push item carrying producerSub, messageId, tenant or an underscore-prefixed field is a 400 (the "
      "broker stamps producerSub from the credential); nothing is pushed.", profile="strict"),
    # ---------------------------------------------------------------- message log: push (README / Message log, protocol §2.3)
    C("LOG-PUSH-ARRAY", f"{ML} / Push / docs/protocol.md §2.3",
      "POST /api/v1/push answers a 2xx (the client takes any 2xx; ours is 201, LOG-PUSH-201) with a JSON array, one object per item in item order: results[i] answers "
      "items[i] and carries index i, message_id, transaction_id, partition_id, queueName and status."),
    C("LOG-PUSH-QUEUED", "docs/protocol.md §2.3",
      "A new (partition, transactionId) answers status queued and is delivered with the payload as sent."),
    C("LOG-PUSH-EMPTY", "docs/protocol.md §2.3",
      "An empty items array answers a 2xx with [] and writes nothing."),
    C("LOG-PUSH-201", "docs/protocol.md §2.3 / §1.4",
      "This broker answers a push with exactly 201 Created (the protocol allows any 2xx).", profile="strict"),
    C("LOG-PUSH-DEDUPE", f"{ML} / Push",
      "Dedupe is per (partition, transactionId) across calls: a repeat answers duplicate carrying the first "
      "message's id, and the log holds one message."),
    C("LOG-PUSH-DEDUPE-IN-REQUEST", f"{ML} / Push / docs/protocol.md §2.3",
      "Repeats inside one request are deduplicated too: the second answers duplicate with the first's "
      "message id, and one message is delivered."),
    C("LOG-PUSH-DEDUPE-PER-PARTITION", f"{ML} / Push",
      "The dedupe key includes the partition: the same transactionId on another partition is another "
      "message (queued, delivered)."),
    C("LOG-PUSH-TXN-MINTED", f"{ML} / Push",
      "The broker mints message ids and a missing transactionId (equal to the message id)."),
    C("LOG-PUSH-ANY-JSON", f"{ML} / Push",
      "payload is any JSON, null included, and is delivered as sent."),
    C("LOG-PUSH-UNKNOWN-FIELD", f"{ML} / Push",
      "An item with an unknown key is 400 and nothing of the request is written (not even its valid items).",
      profile="strict"),
    C("LOG-PRODUCERSUB-STAMPED", f"{ML} / Push / docs/protocol.md §2.3",
      "producerSub is the credential's sub: the delivered message and its lookup carry the pusher's sub.", profile="extensions"),
    C("LOG-PAYLOAD-413-WHOLE", f"{ML} / Push",
      "Over the plan's max payload the whole request is 413 payload_too_large and none of its items is "
      "written.", profile="strict"),
    # ---------------------------------------------------------------- message log: pop (README / Message log, protocol §2.4)
    C("LOG-POP-204", f"{ML} table / docs/protocol.md §2.4",
      "A pop that finds nothing answers 204 with no body.", profile="strict"),
    C("LOG-POP-EMPTY", "docs/protocol.md §2.4 / §1.4",
      "A pop that finds nothing answers 204, or 200 with no messages (both read as nothing by the client)."),
    C("LOG-POP-SHAPE", f"{ML} table / docs/protocol.md §2.4",
      "A pop answers 200 {messages, leaseId, partition, partitionId, consumerGroup, ...}; each message carries "
      "id, transactionId, partitionId, data, createdAt, leaseId and deliveryAttempt (1 on first delivery)."),
    C("LOG-POP-FIFO", f"{ML} / Pop",
      "Pop is FIFO per partition: messages come in the order they were pushed."),
    C("LOG-POP-ONE-LEASE", f"{ML} / Pop",
      "One lease per (partition, group): a partition being worked on is not handed to anyone else of that "
      "group until its lease ends or everything under it is acked."),
    C("LOG-POP-QUEUE-MODE", f"{ML} / Pop",
      "No group is queue mode (competing consumers): a message taken by one consumer is not handed to "
      "another."),
    C("LOG-POP-GROUPS-SEE-ALL", f"{ML} / Pop",
      "Each consumer group sees every message, independently of the other groups and of queue mode."),
    C("LOG-POP-BATCH", f"{ML} / Pop",
      "batch caps the number of messages one pop hands out (batch=N of more than N gives exactly N)."),
    C("LOG-POP-BATCH-DEFAULT", f"{ML} / Pop",
      "Without batch a pop hands out at most QUEEN_POP_DEFAULT_BATCH messages (default 200; "
      "--queen-pop-default-batch)."),
    C("LOG-POP-WAIT-WOKEN", f"{ML} / Pop / docs/protocol.md §2.4",
      "wait=true&timeout=ms holds the pop until a message arrives: a push during the wait answers it well "
      "before the timeout."),
    C("LOG-POP-WAIT-TIMEOUT", f"{ML} / Pop / docs/protocol.md §2.4",
      "A long poll that nothing wakes answers empty (204, or 200 with no messages: docs/protocol.md §2.4) after its timeout, not before."),
    C("LOG-POP-AUTOACK", f"{ML} / Pop",
      "autoAck=true commits at delivery: no lease (leaseId \"\") and the message is not delivered again."),
    C("LOG-POP-SUB-NEW", f"{ML} / Pop",
      "subscriptionMode=new (or subscriptionFrom=now) on a group's first pop skips the messages already "
      "there and delivers the later ones."),
    C("LOG-POP-SUB-ALL", f"{ML} / Pop / docs/protocol.md §2.4",
      "A new group without subscription parameters starts at the oldest message (mode all)."),
    C("LOG-POP-PARTITION-ROUTE", f"{ML} table / docs/protocol.md §2.4",
      "GET /api/v1/pop/queue/{q}/partition/{p} pops only partition p."),
    # LOG-POP-CONFLATION-REFUSED is retired: conflation is served (LOG-POP-CONFLATION*).
    C("LOG-POP-CONFLATION", f"{ML} / Pop / docs/protocol.md §2.4",
      "A pop with conflation=true of a consumer group delivers, per claimed partition, only the newest message, "
      "retires the ones behind it for that group (other groups still read them) and echoes \"conflation\": true."),
    C("LOG-POP-CONFLATION-ECHO-EMPTY", "docs/protocol.md §2.4",
      "An empty answer to a conflating pop is 200 with \"conflation\": true, never a bodiless 204."),
    C("LOG-POP-CONFLATION-STORED", "docs/protocol.md §2.4",
      "Conflation is stored with the group at its first pop and wins: a consumer of a conflating group that "
      "does not ask still gets last-value delivery and the echo; one that asks for a group stored without it "
      "gets ordinary delivery and \"conflationConflict\": true."),
    C("LOG-POP-CONFLATION-REFUSALS", "docs/protocol.md §2.4",
      "conflation=true without a consumerGroup, or with autoAck=true, is a 400 in the envelope."),
    C("LOG-PUSH-BINARY", "docs/protocol.md §1.9",
      "POST /api/v1/push with Content-Type application/x-queen-push and a QPB1 body stores the items in order "
      "and answers 201 with one result per item, as the JSON body does (a repeated transaction id is a duplicate "
      "of the first message)."),
    C("LOG-PUSH-BINARY-FRAMES", "docs/protocol.md §1.9",
      "A QPB1 body with flag 8 (zstd groups of stored-message frames) keeps the client's message ids: the push "
      "answer and the popped messages carry them."),
    C("LOG-PUSH-BINARY-MALFORMED", "docs/protocol.md §1.9",
      "A binary push body that does not parse whole (wrong magic, unknown flags, truncated, a length or count past "
      "the end, trailing bytes, a payload that is not JSON) is a 400 in the envelope and stores nothing."),
    C("LOG-TX-BINARY", "docs/protocol.md §1.10",
      "POST /api/v1/transaction with a QTB1 body applies the head's operations and the groups' pushes in one "
      "transaction; results list the head's operations first, then the pushed messages in wire order."),
    C("LOG-POP-FRAMED", "docs/protocol.md §1.11",
      "A pop with frames=true answers the QPF1 framed form (or JSON); decoded, it is the JSON answer with "
      "partitionId as a decimal number, and that number acknowledges the message like the UUID."),
    # ---------------------------------------------------------------- message log: ack and leases (README, protocol §2.5/§2.7)
    C("LOG-ACK-PER-ITEM", f"{ML} table / docs/protocol.md §2.5",
      "POST /api/v1/ack and /ack/batch answer 200 with an array, one {success, error, dlq} per item in order; "
      "a refused item is success: false with an error, never an HTTP error."),
    C("LOG-ACK-COMPLETED", f"{ML} / Ack",
      "An ack completed (or success) under the live lease settles the message: it is not delivered again and "
      "the partition moves on."),
    C("LOG-ACK-WRONG-LEASE", f"{ML} / Ack",
      "An ack with a lease someone else now holds answers success: false, error \"Invalid or expired lease\", "
      "and settles nothing."),
    C("LOG-ACK-IDEMPOTENT", f"{ML} / Ack",
      "Acks are idempotent: acking a message already done succeeds again."),
    C("LOG-ACK-FAILED-REDELIVERS", f"{ML} / Ack",
      "A nack (failed or retry) releases the partition's lease: the message and what follows it in that "
      "partition are delivered again with deliveryAttempt grown."),
    C("LOG-ACK-NO-LEASE", f"{ML} / Ack",
      "An ack without leaseId settles the message for its group (consumerGroup, default queue mode) once that "
      "group has read the partition, unless a live lease covers it (then success: false); other groups are "
      "untouched."),
    C("LOG-ACK-DLQ-STATUS", f"{ML} / Ack / docs/protocol.md §2.5",
      "An ack with status dlq under a live lease files the message in the DLQ with the consumer's error."),
    C("LOG-RETRY-LIMIT-DLQ", f"{ML} / Ack",
      "After retryLimit redeliveries (failure number retryLimit + 1) the message goes to the DLQ with the "
      "consumer's error text and is not delivered again."),
    C("LOG-DLQ-OFF-DROPS", f"{ML} / Ack",
      "With dlqAfterMaxRetries: false a message past its retry limit is dropped: neither delivered again nor "
      "in the DLQ."),
    C("LOG-LEASE-EXPIRY", f"{ML} / Ack",
      "A lease that runs out counts one failure for each message it still covered, and they are delivered "
      "again (deliveryAttempt grown)."),
    C("LOG-LEASE-EXTEND", f"{ML} / Lease extend / docs/protocol.md §2.7",
      "POST /api/v1/lease/{id}/extend (no body) answers 200 {leaseId, success: true, renewed, newExpiresAt} "
      "with the lease's end at least now + QUEEN_LEASE_EXTEND_S (60 s), and the lease outlives its leaseTime."),
    C("LOG-LEASE-EXTEND-GONE", f"{ML} / Lease extend / docs/protocol.md §2.7",
      "Extending a lease that is gone answers 200 with success: false."),
    # ---------------------------------------------------------------- message log: DLQ, lookups, configure
    C("LOG-DLQ-LIST", f"{ML} table / docs/protocol.md §2.8",
      "GET /api/v1/dlq answers {messages, total, limit, offset}, filtered by queue and consumerGroup; each row "
      "carries its transactionId and error."),
    C("LOG-DLQ-REPLAY", f"{ML} / DLQ replay",
      "Replay writes a NEW message in the same queue and partition with transaction id "
      "<original txn>:replay:<dlq id> and the original payload, and deletes the DLQ row."),
    C("LOG-DLQ-REPLAY-IDEMPOTENT", f"{ML} / DLQ replay",
      "Replaying the same row again changes nothing: the derived transaction id deduplicates (one replayed "
      "message; the second call is 409 or answers the same message)."),
    C("LOG-LOOKUP", f"{ML} table",
      "GET /api/v1/messages/lookup finds a message by (queue, txn): {found: true, queue, partition, "
      "partitionId, messageId, transactionId, producerSub, createdAt}, or {found: false, queue, "
      "transactionId}."),
    C("LOG-MESSAGE-GET", f"{ML} table",
      "GET /api/v1/messages/{partitionId}/{transactionId} answers the message with its payload; a miss is "
      "404 message_not_found."),
    C("LOG-CONFIGURE", f"{ML} / Configure",
      "POST /api/v1/configure answers {configured: true, queue, options}; an unknown option key is 400 "
      "unknown_option naming it; a queue nobody configured is created by its first push (retry limit 3, "
      "lease 300 s)."),
    C("LOG-TENANT-ISOLATION", f"{ML} (opening)",
      "Another tenant's queue, message, lease or DLQ row does not exist for you: its pop answers 204, its "
      "lookup misses, its DLQ list is empty, its ack with your lease settles nothing.", profile="extensions"),
    C("LOG-RETENTION", f"{ML} / Retention",
      "retentionSeconds: N deletes a message N seconds after it was written, consumed or not (it is gone "
      "from lookups and pops), while a queue without retention keeps it."),
    C("LOG-COMPLETED-RETENTION", f"{ML} / Retention",
      "completedRetentionSeconds: N deletes a message once every group has it done and it is N seconds old; "
      "a message not yet done is kept."),
    C("LOG-ENCRYPTION-TRANSPARENT", f"{ML} / Encryption at rest",
      "encryptionEnabled: true is either accepted and invisible on the wire (pop, lookup and message get "
      "answer the payload as sent) or refused with 400 encryption_unavailable when the broker has no keys "
      "(core checks pop and what is stored; the message browser is an extension)."),
    C("LOG-TXN-PUSH-ACK", f"{ML} / Transactions / docs/protocol.md §2.6",
      "A transaction's pushes and acks apply in one step; results are flat (each pushed item and each ack, "
      "in operation order) and success is true."),
    C("LOG-TXN-REFUSED-200", f"{ML} / Transactions",
      "A bundle whose ack is refused answers 200 {success: false, error, reason: ack_refused | lease_invalid, "
      "failedIndex, results: []} and applies none of its pushes or acks."),
    C("LOG-TXN-MALFORMED-400", f"{ML} / Transactions",
      "Malformed transaction input is 400 in the envelope before anything runs."),
    # ---------------------------------------------------------------- edges: every numeric rule at its boundary
    C("EDGE-TMR-HORIZON-MS", f"{TR} / Status codes / docs/protocol.md §3.4",
      "delayMs equal to the tenant's horizon (read from GET /api/v1/usage plan.timersHorizonMs, else 90 days) "
      "is scheduled; one millisecond more is 403 timer_horizon_exceeded."),
    C("EDGE-KV-OPS", "docs/protocol.md §4.4 / README / KV",
      "A KV call of exactly QUEEN_KV_MAX_OPS_PER_CALL ops (256) is applied; one more is 400 and applies nothing."),
    C("EDGE-KV-TXN-OPS", "README / KV",
      "A transaction's kv rider takes 64 ops; 65 is 400 and nothing is applied."),
    C("EDGE-LOG-PAYLOAD-BYTES", f"{ML} / Push",
      "A push payload whose JSON is exactly the plan's max payload bytes (plan.maxPayloadBytes, default 1 MiB) "
      "is queued; one byte more is 413 payload_too_large."),
    C("EDGE-TMR-PAYLOAD-BYTES", f"{TR} / Status codes",
      "A timer payload of exactly min(1 MiB, plan max payload) bytes is scheduled; one byte more is 413."),
    C("EDGE-KV-VALUE-BYTES", "docs/protocol.md §4.4 / README / KV",
      "A KV value whose JSON is exactly 64 KiB (65536 bytes) is stored; one byte more is 413."),
    C("EDGE-KV-KEY-BYTES", "README / KV",
      "A KV key of exactly 512 UTF-8 bytes is accepted; 513 is refused (4xx) and writes nothing."),
    C("EDGE-KV-NAMESPACE", "README / KV",
      "A namespace of 64 characters matching ^[a-z0-9][a-z0-9._-]{0,63}$ is accepted; 65 is 400."),
    C("EDGE-LOG-NAME-LENGTH", f"{ML} / Push",
      "Queue and partition names of 256 characters are accepted by push; 257 is 400 and writes nothing."),
    C("EDGE-LOG-TXN-LENGTH", f"{ML} / Push",
      "A push transactionId of 512 characters is accepted; 513 is 400."),
    C("EDGE-TMR-NAME-LENGTH", "docs/protocol.md §3.4",
      "A timer queue of 256 characters and a timerKey of 1024 are scheduled; 257 and 1025 are 400."),
    C("EDGE-PUSH-ITEMS", f"{ML} / Push",
      "A push of 10000 items is accepted; 10001 is 400 too_many_items and writes nothing."),
    C("EDGE-TMR-LIST-CLAMP", f"{TR} / Peek and list",
      "The timer list limit is clamped to 1..1000: limit=1000 and limit=1001 both answer 1000 rows, limit=0 "
      "answers 1."),
    C("EDGE-KV-PREFIX-CLAMP", "README / KV",
      "getPrefix limit is clamped to 1..1000: limit=1001 answers 1000 rows (truncated), limit=0 answers 1."),
    C("EDGE-DLQ-LIMIT-CLAMP", f"{ML} table",
      "The DLQ list limit is clamped to 1..1000 (the answer's limit says 1000 for 1001 and 1 for 0), never "
      "refused."),
    C("EDGE-KV-TTL", "docs/protocol.md §4.2",
      "ttlSeconds 1 is accepted and 0 refused; the upper bound, 100 years (3153600000 s), is accepted and one "
      "second more refused."),
    C("EDGE-DEADLINE-MS", f"{ML} / Push",
      "deadlineMs 1 is accepted (and 0 refused); 7 days (604800000 ms) is accepted, one millisecond more is "
      "400."),
    C("EDGE-LEASE-EXTEND-S", f"{ML} / Lease extend",
      "An extended lease ends no earlier than now + QUEEN_LEASE_EXTEND_S (60 s, --queen-lease-extend-s) and "
      "not later than that plus a few seconds."),
    C("EDGE-RETRY-AFTER", "README / Plans and degradation rungs / README / Errors",
      "Retry-After is whole seconds: rate_limited at 1 message/s says exactly 1 (the bucket holds one second "
      "of rate), quota_exceeded says the seconds until the period resets (within 2 s, by the answer's Date)."),
    C("EDGE-LCK-OPS", "docs/protocol.md §5 / docs/decisions.md §8",
      "A locks call of 64 ops is answered; 65 is 400 locks_too_many_ops and changes nothing."),
    C("EDGE-LCK-NAME-BYTES", "docs/protocol.md §5",
      "A lock name (and an owner) of exactly 256 UTF-8 bytes is accepted; 257 is 400 and takes nothing."),
    C("EDGE-LCK-LIMIT", "docs/protocol.md §5",
      "A semaphore limit of 1024 is accepted and 1025 (or 0) refused 400; four acquires of limit 1024 (4096 slot "
      "rows) go in one call, one more op is 400 locks_too_many_slots."),
    # ---------------------------------------------------------------- a deployment: several brokers on one database
    C("XB-PUSH-POP", "README / Multiple brokers on one database",
      "A message pushed on one broker is popped, acked and deduplicated on another of the same deployment."),
    C("XB-LEASE-SHARED", "README / Multiple brokers on one database",
      "A lease taken on one broker holds on every broker: another broker hands that partition to nobody else "
      "of the group, and acks under the lease there."),
    C("XB-LONG-POLL-WAKE", "README / Multiple brokers on one database",
      "A push on one broker wakes a long poll waiting on another (well before its timeout)."),
    C("XB-TIMER-CROSS", "README / Multiple brokers on one database",
      "A timer scheduled on one broker is peeked, listed and cancelled on another; the cancel holds everywhere."),
    C("XB-TOO-LATE", "README / Multiple brokers on one database / docs/timer-routes.md / too_late is a verdict, not a failure",
      "A claim held by one deployment's sweeper is seen as too_late by a cancel sent to any broker."),
    # ---------------------------------------------------------------- KV (docs/protocol.md §4)
    C("KV-INDEX-ALIGNED", "docs/protocol.md §4.1/§4.3",
      "POST /api/v1/kv answers {results: [...]} index-aligned; every element carries index and op."),
    C("KV-FOUND-SEPARATE", "docs/protocol.md §4.3",
      "found is separate from value: {found: true, value: null} is not {found: false}."),
    C("KV-EXPIRY-REQUIRED", "docs/protocol.md §4.2",
      "Every put/putIfAbsent/incr carries exactly one of ttlSeconds (positive int) and forever: true; zero or "
      "two is 400 kv_expiry_not_specified (or another kv_bad_request reason)."),
    C("KV-EXPIRED-NEVER-RETURNED", "docs/protocol.md §4.3",
      "Expired keys are never returned and never count as existing, even before pruning."),
    C("KV-PUT-IF-ABSENT", "docs/protocol.md §4.3",
      "putIfAbsent on a live key answers applied: false, reason: exists, with the current value and version."),
    C("KV-EXPECT", "docs/protocol.md §4.3",
      "expect: N > 0 creates nothing (absent on a missing key); a stale version answers reason: version "
      "with the current value and version."),
    C("KV-DELETE-ABSENT-200", "docs/protocol.md §4.3",
      "A delete of a missing key answers 200 applied: false, reason: absent."),
    C("KV-VERSION-NEVER-REUSED", "docs/protocol.md §4.3",
      "version is never reused for a recreated key; an absent key's effective version is 0."),
    C("KV-INCR", "docs/protocol.md §4.3",
      "incr creates from zero, adds delta, and with max the applied flag is the admission decision "
      "(reason: limit, no saturation); a non-numeric value is reason: type."),
    C("KV-CHECK", "docs/protocol.md §4.3",
      "check answers applied when the precondition holds, else reason version|absent|exists."),
    C("KV-REQUIRED-ABORTS", "docs/protocol.md §4.3",
      "required: true on a lost precondition aborts the whole call: none of its writes is applied."),
    C("KV-READ-OWN-WRITES", "docs/protocol.md §4.3",
      "Within one call reads observe that call's writes."),
    C("KV-DUPLICATE-KEY", "docs/protocol.md §4.3",
      "At most one write op per key per call, else 400 kv_duplicate_key_in_call."),
    C("KV-GETPREFIX", "docs/protocol.md §4.3",
      "getPrefix lists in byte order with an exclusive after; limit is clamped (never rejected); truncated "
      "and nextAfter are honest; an empty prefix is refused."),
    C("KV-EXPIRY-NOT-INHERITED", "docs/protocol.md §4.2/§4.3",
      "A put never inherits the previous expiry; an incr's TTL is create-only (a live row keeps its expiry); "
      "putIfAbsent takes no expect."),
    C("KV-PATH-ROUTES", "docs/protocol.md §4.1/§10",
      "The path routes GET/PUT/DELETE /api/v1/kv/{ns}/{key} are curl sugar over the same rows, with an ETag "
      "carrying the version."),
    C("KV-LIMITS", "docs/protocol.md §4.4",
      "More than 256 ops is 400; a value over 64 KiB is 413 payload_too_large; a bad namespace and a tenant "
      "field in an op are 400."),
    C("KV-TENANT-ISOLATION", "docs/protocol.md §4 / house rules",
      "Another tenant's key reads as not found and is not changed by the other tenant's writes."),
    # ---------------------------------------------------------------- limits and rungs (docs/decisions.md §4)
    C("LIM-RATE-LIMITED", "docs/decisions.md §4 / docs/protocol.md §7",
      "Over the rate limit, produce-class work is 429 rate_limited with Retry-After."),
    C("LIM-QUOTA-EXCEEDED", "docs/decisions.md §4 / docs/protocol.md §7",
      "A spent period quota is 429 quota_exceeded with Retry-After."),
    C("LIM-STORAGE-QUOTA", "docs/decisions.md §4 / docs/protocol.md §7",
      "Over the storage quota, produce-class work is 403 storage_quota_exceeded."),
    C("LIM-TIMERS-QUOTA", "docs/decisions.md §4",
      "Over the timer-row quota, scheduling is 403 timers_quota_exceeded; the quota counts pending rows, so "
      "cancelling frees it again."),
    C("LIM-TIMERS-PAUSED", "docs/decisions.md §4",
      "A schedule paused by an operator for the tenant is 403 timers_paused on the timers surface only "
      "(pushes still pass)."),
    C("LIM-CLUSTER-SUSPENDED", "docs/decisions.md §4 / docs/protocol.md §7",
      "A suspended cluster refuses produce-class work with 403 cluster_suspended."),
    C("LIM-CANCEL-EVERY-RUNG", "docs/decisions.md §4 / docs/timer-routes.md",
      "DELETE cancel passes every rung: rate limit, period quota, storage quota, timer-row quota, paused "
      "schedule, cluster suspension."),
    C("LIM-REFUSAL-CHANGES-NOTHING", "docs/decisions.md §4 / house rules",
      "A refused call changes nothing (a push refused by a rung stores no message)."),
    # ---------------------------------------------------------------- envelope and status codes
    C("ENV-MALFORMED-JSON", "errors.py / docs/protocol.md §1.7",
      "Malformed JSON is a 400 with the envelope {error, reason, detail}."),
    C("ENV-CONTENT-TYPE", "errors.py / docs/protocol.md §1.3",
      "A body with a wrong content type is refused (4xx) with the envelope.", profile="strict"),
    C("ENV-OVERSIZED", "errors.py",
      "An oversized body is 413 with the envelope.", profile="strict"),
    C("ENV-NO-SUCH-ROUTE", "docs/protocol.md §7",
      "An unknown route is 404 with error no_such_route.", profile="strict"),
    C("ENV-SHAPE", "errors.py / docs/protocol.md §1.7",
      "Every refusal is a JSON object {error: code, reason: stable id, detail: prose} with a JSON content "
      "type.", profile="strict"),
    C("ENV-ERROR-BODY", "docs/protocol.md §1.4 / §1.7",
      "A refusal (4xx) with a body carries a JSON object whose error is a string (the client's message); "
      "reason and code, when present, are strings."),
    C("ENV-NO-500", "house rules",
      "No 500 for anything a client can send (a battery of garbage requests to every surface)."),
    C("ENV-NO-500-OPERATOR", "house rules",
      "No 500 for anything an operator can send to this broker's operator API (/api/v1/admin/*).",
      profile="extensions", feature="admin"),
    C("ENV-UNAUTHENTICATED", "auth / errors.py",
      "With authentication on, a request without a credential is 401 in the envelope."),
    # ---------------------------------------------------------------- locks and semaphores (docs/protocol.md §5, docs/decisions.md §8)
    C("LCK-RESULT-PER-OP", "docs/protocol.md §5",
      "POST /api/v1/locks answers 200 {results} with exactly one result per op, in order; verdicts are fields: "
      "a lock held by somebody else is a 200 with acquired: false, never an error status."),
    C("LCK-ACQUIRE", "docs/protocol.md §5",
      "An acquire of a free lock answers {acquired: true, slot: 0, token, owner, guard}; the guard is the KV op "
      "{op: check, ns: queen-locks, key: <name>#<slot>, expect: <token>, required: true}; an acquire naming no "
      "owner gets one minted and answered."),
    C("LCK-HELD", "docs/protocol.md §5",
      "Another owner's acquire of a held lock answers acquired: false, reason held, with the holders "
      "[{slot, owner, token, since, expiresAt, renewedAt}]; get answers {held, holders} in the same shape."),
    C("LCK-ALREADY", "docs/protocol.md §5",
      "The same owner acquiring a lock it holds again is answered the permit it has: same slot and token, "
      "already: true."),
    C("LCK-RENEW-NEW-TOKEN", "docs/protocol.md §5",
      "A renew answers renewed: true with a NEW, larger token and its guard; the previous token renews and "
      "releases no more (renewed/released false, reason lost), unless the renew names the permit's owner."),
    C("LCK-RELEASE", "docs/protocol.md §5",
      "A release with the permit's current token answers released: true and the lock is free (get held: "
      "false); a second release, or one with another token, answers released: false, reason lost."),
    C("LCK-EXPIRY", "docs/protocol.md §5",
      "A permit expires ttlSeconds after its acquire or renew, by the database clock: get no longer lists it, "
      "its renew answers lost, and another owner acquires it with a larger token."),
    C("LCK-TOKEN-RISES", "docs/protocol.md §5 / docs/decisions.md §8",
      "The token of a permit row only rises: every acquire and renew of a lock, across releases and new "
      "owners, answers a token greater than every one before it."),
    C("LCK-SEMAPHORE", "docs/protocol.md §5",
      "With limit N at most N owners hold permits, each in its own slot 0..N-1; the next acquire answers held; "
      "a release frees its slot for the next acquirer."),
    C("LCK-CONCURRENT", "docs/protocol.md §5",
      "Of N concurrent acquires of a semaphore of limit k, exactly k are granted, in k distinct slots."),
    C("LCK-GUARD-TXN", "docs/protocol.md §2.6 / §5",
      "A transaction whose kv array starts with a permit's guard commits while the permit is held; once the "
      "permit is released and taken by another owner it answers 200 success: false, reason kv_precondition, "
      "failedIndex in the flat space, kvReason version and value.owner the new holder, and applies nothing."),
    C("LCK-PERMIT-KV-ROW", "docs/decisions.md §8",
      "A permit is readable as the KV row queen-locks/<name>#<slot> (version = token, value.owner the holder); "
      "KV writes into the namespace queen-locks are refused 400 kv_reserved_namespace."),
    C("LCK-REFUSALS", "docs/protocol.md §5",
      "Bad names (empty, with # or a control character), owners, limits, tokens (not an integer > 0), "
      "ttlSeconds (not an integer > 0), unknown ops or fields, a tenant field and a lock named twice in one "
      "call are 400 locks_bad_request in the envelope and take nothing."),
    C("LCK-TENANT-ISOLATION", "docs/protocol.md §5 / house rules",
      "Another tenant's lock of the same name is another lock: it reads as free, its token releases nothing, "
      "and its guard loses in this tenant's transaction."),
    # ---------------------------------------------------------------- the official client's surface (docs/decisions.md §7)
    C("CLI-DELETE-MISSING-QUEUE", "docs/protocol.md §2.2 / docs/decisions.md §7",
      "Deleting a queue that does not exist answers a 2xx without error (ours says deleted: false; the client "
      "reads only error); deleting one that exists answers deleted: true and its messages are gone."),
    C("CLI-RENEW-EXPIRED-LEASE", "docs/protocol.md §2.7 / docs/decisions.md §7",
      "Renewing a live lease answers success: true; renewing one whose end has passed answers 200 "
      "success: false."),
    C("CLI-RETRY-MESSAGE", "docs/protocol.md §2.9 / docs/decisions.md §7",
      "POST /api/v1/messages/:partitionId/:transactionId/retry replays that message's dead letter as a new "
      "message of its queue and removes the row; retrying an address with no dead letter is 404 "
      "dlq_not_found."),
    C("CLI-RETRY-SYNTHETIC-REFUSED", "docs/protocol.md §2.9 / docs/decisions.md §1",
      "Retrying by address the dead letter of a timer that exhausted its attempts is refused 409 "
      "dlq_replay_refused (reason synthetic_consumer_group) and the row stays."),
    C("CLI-GROUPS-LIST-LAG", "docs/protocol.md §2.11",
      "GET /api/v1/consumer-groups lists the tenant's groups with per-queue pending counts; /{group} shows "
      "one (404 consumer_group_not_found otherwise); /lagging?minLagSeconds=N lists the (group, queue) pairs "
      "whose oldest pending message is at least N seconds old. Another tenant sees none of them."),
    C("CLI-GROUPS-SEEK", "docs/protocol.md §2.11",
      "Seeking a group on a queue to the end makes everything pushed so far done for it; seeking to an "
      "instant redelivers exactly the messages created at or after it; both or neither of toEnd/timestamp "
      "is a 400; an unknown queue is a 404."),
    C("CLI-GROUPS-DELETE", "docs/protocol.md §2.11",
      "Deleting a group for one queue forgets its position there only (it reads that queue from the start "
      "again); deleting it everywhere removes it from the listing."),
    C("CLI-GROUPS-SUBSCRIPTION", "docs/protocol.md §2.11",
      "Updating a group's subscription timestamp decides where it starts in partitions it has not read: "
      "messages created before the instant are skipped there."),
    C("CLI-OPT-DELAYED", "docs/protocol.md §2.1 / docs/decisions.md §7",
      "delayedProcessing=N (seconds): a message is not delivered before its push + N by the broker's clock; "
      "after that it is."),
    C("CLI-OPT-RETRY-DELAY", "docs/protocol.md §2.1 / docs/decisions.md §7",
      "retryDelay=N (ms): a nacked message is not redelivered before the nack + N; then it comes back with "
      "deliveryAttempt 2."),
    C("CLI-OPT-WINDOW", "docs/protocol.md §2.1 / docs/decisions.md §7",
      "windowBuffer=N (seconds): a partition is not served until its newest message is N s old; then its "
      "messages come out together, in order."),
    C("CLI-OPT-MAX-WAIT", "docs/protocol.md §2.1 / docs/decisions.md §7",
      "maxWaitTimeSeconds=N: a message still undelivered N s after its push is not delivered; it is in the "
      "DLQ with an error naming max_wait_exceeded."),
    C("CLI-OPT-PRIORITY", "docs/protocol.md §2.1 / docs/decisions.md §7",
      "A namespace pop serves the queue of higher priority first, whatever the queues' names."),
    C("CLI-OPT-MAX-SIZE", "docs/protocol.md §2.1, §2.3 / docs/decisions.md §7",
      "maxSize=N: a push that would take the queue's unconsumed messages over N answers a 2xx with its items "
      "status failed, reason queue_full and an error naming queue_full, and writes nothing; once a message "
      "is consumed a push fits again."),
    C("CLI-OPT-CONFLICT", "docs/protocol.md §2.1 / docs/decisions.md §7",
      "delayedProcessing >= maxWaitTimeSeconds > 0 (no message could ever be delivered) is refused at "
      "configure with 400 conflicting_options naming maxWaitTimeSeconds; a smaller delay is accepted.", profile="strict"),
    C("CLI-MON-RESOURCES", "docs/protocol.md §2.10",
      "GET /api/v1/resources/overview, /namespaces, /tasks and /partitions?queue= report the tenant's own "
      "queues, partitions and message counts (another tenant sees none of them)."),
    C("CLI-MON-DEPTH", "docs/protocol.md §2.10",
      "GET /api/v1/resources/queues/:q/depth[?group=] answers {queue, group, pending, partitionsPending, "
      "conflation, effectivePending, partitions}; pending counts the messages the group (or, unnamed, the "
      "worst cursor) has not done; an unknown queue is a 404."),
    C("CLI-MON-STATUS", "docs/protocol.md §2.13",
      "GET /api/v1/status, /status/queues, /status/queues/:q and /status/analytics answer the tenant's "
      "figures (messages, dead letters per queue); system metrics need the admin grant (403 otherwise)."),
    C("CLI-MON-MESSAGES", "docs/protocol.md §2.9",
      "GET /api/v1/messages?queue= lists a queue's messages newest first with their state for the group "
      "(pending, leased, completed, deleted) and filters by status; without a queue it is a 400; deleting a "
      "message is an operator's act: without the admin grant it is refused 403 and the message stays (with it, "
      "a broker may delete or refuse)."),
    # CLI-MON-DELETE-REFUSED is retired: a message can be deleted (CLI-MSG-DELETE*, docs/decisions.md §9).
    C("CLI-MSG-DELETE", "docs/protocol.md §2.9 / docs/decisions.md §9",
      "DELETE /api/v1/messages/:pid/:txn (admin grant) answers 200 {deleted: true, alreadyDeleted: false, "
      "partitionId, transactionId, offset, queue, deletedAt}; the message stays at its offset as a tombstone: "
      "GET /api/v1/messages/:pid/:txn answers 200 {deleted: true, data: null, offset, deletedAt}, the "
      "lookup by transaction id answers found and deleted, and the listing shows it with status deleted."),
    C("CLI-MSG-DELETE-PASSED-OVER", "docs/decisions.md §9",
      "No consumer group receives a deleted message again: queue mode and a group that starts later pass "
      "over it and get the messages around it in offset order; the partition's offsets stay gapless."),
    C("CLI-MSG-DELETE-LEASE", "docs/decisions.md §9",
      "A lease holding a message that is then deleted acknowledges its other messages normally (acking the "
      "deleted one succeeds as already done), and the partition is released for the next message."),
    C("CLI-MSG-DELETE-IDEMPOTENT", "docs/decisions.md §9",
      "Deleting a deleted message again answers 200 {deleted: true, alreadyDeleted: true} with the first "
      "deletion's deletedAt and offset."),
    C("CLI-MSG-DELETE-NOT-FOUND", "docs/protocol.md §2.9 / ENV",
      "Deleting at an address the tenant has no message at (unknown transaction id or partition id) is a 404 "
      "message_not_found in the error envelope; a malformed partition id is a 400; nothing changes."),
    C("CLI-MSG-DELETE-TENANT", "docs/decisions.md §9",
      "Another tenant's message cannot be deleted: the address answers 404 message_not_found and the message "
      "stays, delivered as before."),
    C("CLI-MSG-DELETE-STORAGE", "docs/decisions.md §9",
      "Deleting a message frees its stored bytes: the answer's freedBytes, and the tenant's storageBytes in "
      "GET /api/v1/usage drops by them."),
    C("CLI-TRACES", "docs/protocol.md §2.12",
      "POST /api/v1/traces records an event about an existing message of the tenant (404 message_not_found "
      "otherwise); it is read back per message, per trace name, and in the name listing; another tenant "
      "sees none of it."),
    C("CLI-FETCH", "docs/protocol.md §2.14",
      "POST /api/v1/fetch answers one entry per requested entry, in order: the records from the 0-based "
      "offset (offset, transactionId, payload, ts) with highWatermark and logStartOffset; an unknown "
      "partition is UNKNOWN_TOPIC_OR_PARTITION, an offset past the high watermark OFFSET_OUT_OF_RANGE; "
      "maxBytes still yields at least one record; a fetch consumes nothing; another tenant's partition is "
      "unknown."),
    C("CLI-CHANGED-SINCE", "docs/protocol.md §2.14",
      "POST /api/v1/partitions/changed lists a queue's partitions in creation order, paged by the `next` "
      "cursor, only those written at or after `since`, with a safeTime that, passed back as `since`, shows "
      "exactly the partitions written after it; safeTime strings compare in time order."),
    # ---------------------------------------------------------------- the streams SDK's routes (docs/protocol.md §11)
    C("STR-REGISTER", "docs/protocol.md §11.1",
      "POST /streams/v1/queries finds a query by name within the tenant: the first registration answers "
      "fresh: true, the next ones the same query_id with fresh: false; another config_hash is 409 "
      "config_hash_mismatch and changes nothing, unless reset is true: then the query's state is dropped "
      "and reset: true answered."),
    C("STR-CYCLE-COMMIT", "docs/protocol.md §11.2",
      "A cycle with state ops, sink items and an ack of a popped batch answers success: true; the state "
      "reads back, the sink queue holds the items and the batch is done for the consumer group."),
    C("STR-CYCLE-ALL-OR-NOTHING", "docs/protocol.md §11.2",
      "A cycle whose ack names a lease the group does not hold answers 200 success: false, reason "
      "lease_invalid, and applies nothing: no state, no sink message, the batch still leased."),
    C("STR-CYCLE-REPLAY", "docs/protocol.md §11.2",
      "A cycle sent again after it committed (its ack's message already done) answers success: true, "
      "duplicate: true and applies nothing again."),
    C("STR-CYCLE-PARTIAL-ACK", "docs/protocol.md §11.2",
      "An ack of the first count messages of a batch with release_lease: true delivers the rest again at "
      "once; with release_lease: false the partition stays held until the lease ends, then the rest comes "
      "back without a failure counted (deliveryAttempt 1, nothing dead-lettered)."),
    C("STR-STATE-GET", "docs/protocol.md §11.3",
      "POST /streams/v1/state/get answers a (query, partition)'s rows: every row for empty keys, the named "
      "keys only, keys under key_prefix, and with ripe_at_or_before only rows whose numeric windowEnd is at "
      "or before it; a delete in a cycle removes the row; another partition has its own rows."),
    C("STR-UNKNOWN-QUERY", "docs/protocol.md §11.2",
      "A cycle or state read of a query_id that was never registered is 404 stream_query_not_found."),
    C("STR-TENANCY", "docs/protocol.md §11",
      "Another tenant's query does not exist: its cycles and state reads are 404 stream_query_not_found and "
      "change nothing."),
    C("STR-MALFORMED", "docs/protocol.md §11",
      "A malformed registration, cycle or state read (missing or mistyped fields, an unknown op type, an "
      "ack status other than completed) is 400 in the envelope and changes nothing."),
    # ---------------------------------------------------------------- ephemeral queues (docs/protocol.md §6)
    C("EPH-CONFIGURE", E6,
      "POST /api/v1/ephemeral/configure answers the declaration with every effective option (the ones not "
      "given take their defaults); an unknown option, or a value out of its range, is 400 and declares "
      "nothing (depth stays 404)."),
    C("EPH-PUSH-POP-SHAPE", E6,
      "A push answers 201 {pushed: n}; a pop answers 200 {queue, messages: [{id, partition, payload, "
      "attempts}]}, FIFO per partition, payloads as pushed, attempts 1 on a first delivery, and an empty "
      "list (never 204) when there is nothing."),
    C("EPH-POLICY-REJECT", E6,
      "At maxLength or maxBytes, a queue whose policy is reject refuses the push with 429 and Retry-After, "
      "and nothing of that push is stored (all or nothing); consuming makes room again."),
    C("EPH-POLICY-DROP-OLDEST", E6,
      "A queue whose policy is dropOldest accepts the push and drops the oldest messages to stay within "
      "its bounds; the drops are counted in the queue's gauges."),
    C("EPH-ACK-OUTCOMES", E6,
      "An ack answers one {id, outcome} per id in order: acked for a held delivery; unknown for one settled "
      "already; redelivered for status retry/failed with attempts left, the message coming back with "
      "attempts + 1."),
    C("EPH-LEASE-REDELIVERY", E6,
      "An unacked message is not handed to another consumer of the group while its lease lives, and is "
      "redelivered with attempts + 1 once leaseSeconds have passed; the ack of the old delivery is then "
      "unknown."),
    C("EPH-RETRY-LIMIT", E6,
      "Once a message has been delivered retryLimit + 1 times and its last lease runs out (or its last "
      "delivery is nacked) it is dropped, never delivered again, and counted."),
    C("EPH-TTL", E6,
      "A message older than the queue's ttlSeconds is never delivered."),
    C("EPH-GROUPS", E6,
      "Each group has its own cursor (two groups each get every message); autoAck commits at delivery (no "
      "lease, no redelivery); two consumers of one group never receive the same message under a live lease."),
    C("EPH-WAIT-WOKEN", E6,
      "A waiting pop (wait=true) on an empty queue answers as soon as a push arrives, well before its "
      "timeout, and answers an empty list at its timeout."),
    C("EPH-RESET", E6,
      "reset answers {dropped: n}, empties the queue and keeps the declaration; reset of a missing queue "
      "answers dropped: 0; the queue list shows the tenant's queues with their tier; depth of a missing "
      "queue is 404 with code ephemeral_queue_not_found."),
    C("EPH-DELETE", E6,
      "DELETE /api/v1/ephemeral/queue/{queue} (admin grant, like the log's queue delete) answers "
      "{deleted: true} for a queue, removing its declaration (depth is then 404 ephemeral_queue_not_found), "
      "and {deleted: false} for a missing one."),
    C("EPH-TENANT-ISOLATION", E6,
      "Another tenant sees nothing of a tenant's ephemeral queue: not in its list, 404 on depth, an empty "
      "pop, and its ack of the tenant's ids settles nothing."),
    C("XB-EPH-WAKE", "README / Multiple brokers on one database",
      "A push to an ephemeral queue through one broker wakes a waiting ephemeral pop on another broker of "
      "the deployment within seconds, and a message pushed through one is popped through the other."),
    C("REC-SCHEDULE-SHAPE", REC,
      "A schedule op with a recur object answers scheduled with the schedule echoed as recur, txn = the op's "
      "txn@deliverAt (the first occurrence's), and peek and list show the row with recur, paused and occurrences."),
    C("REC-FIRES-ON-SCHEDULE", REC,
      "Each occurrence fires once into the queue, its frame txn naming the occurrence, and the occurrences are "
      "first + k x everyMs exactly: the next is computed from the schedule, never from the fire time."),
    C("REC-PAUSE-RESUME", REC,
      "pause and resume answer paused / resumed (ok) with the next occurrence, peek shows paused; on a one-shot "
      "timer they answer not_recurring, on a missing key absent (ok false)."),
    C("REC-REPLACE", REC,
      "A schedule on an existing key replaces it (rescheduled, new message id), recurring or one-shot either way."),
    C("REC-BAD-INPUT", REC,
      "A bad cron expression, an unknown time zone, an interval below 1000 ms or conflicting fields is a 400 in "
      "the envelope and nothing of the batch is applied."),
    C("REC-CANCEL", REC,
      "Cancelling a recurring timer deletes it: nothing fires after the cancel and peek finds nothing."),
    # ---------------------------------------------------------------- cells (docs/guides/cells.md)
    C("CELL-HOME", "docs/guides/cells.md / Routing",
      "A tenant's writes made through the proxy land in its own cell: its message, timer and KV entry answer "
      "from that cell's direct URL."),
    C("CELL-ISOLATED", "docs/guides/cells.md / Routing",
      "A tenant's queues, timers and KV are invisible from another cell's direct URL, even to its own valid "
      "token: that cell holds nothing of it."),
)

BY_ID: dict[str, C] = {c.id: c for c in CONTRACTS}
assert len(BY_ID) == len(CONTRACTS), "duplicate contract id"

# ---------------------------------------------------------------------------------------- profiles
# id prefix -> profile; the longest matching prefix wins, ``C(..., profile=...)`` wins over all of them.
PROFILE_BY_PREFIX: dict[str, str] = {
    "LOG-": "core", "CLI-": "core", "ENV-": "core", "XB-": "core",
    "EDGE-": "strict",
    "TMR-": "timers", "MET-": "timers", "EDGE-TMR-": "timers", "XB-TIMER-": "timers", "XB-TOO-LATE": "timers",
    "LIM-TIMERS-": "timers", "TXN-TIMERS-": "timers", "CLI-RETRY-SYNTHETIC-": "timers",
    "DL-": "deadlines", "EDGE-DEADLINE-": "deadlines",
    "KV-": "extensions", "EDGE-KV-": "extensions", "LCK-": "extensions", "EDGE-LCK-": "extensions",
    "EPH-": "extensions", "XB-EPH-": "extensions", "STR-": "extensions", "TXN-": "extensions",
    "LIM-": "extensions", "EDGE-RETRY-AFTER": "extensions",
    "CLI-MON-": "extensions", "CLI-TRACES": "extensions", "CLI-FETCH": "extensions",
    "CLI-CHANGED-SINCE": "extensions", "CLI-GROUPS-": "extensions", "CLI-MSG-DELETE": "extensions",
    "REC-": "extensions", "CELL-": "extensions",
    "LOG-POP-CONFLATION": "extensions", "LOG-PUSH-BINARY": "extensions", "LOG-TX-BINARY": "extensions",
    "LOG-POP-FRAMED": "extensions", "LOG-LOOKUP": "extensions", "LOG-MESSAGE-GET": "extensions",
    "LOG-DLQ-REPLAY": "extensions",
    # this broker's choices beyond what the protocol and the client ask (reference run of 2026-12-06):
    # the client always sends batch and transactionId, never acks twice on purpose, and reads a
    # transaction's refusal from success/error; unknown options and malformed bundles are our validation
    "LOG-POP-BATCH-DEFAULT": "strict", "LOG-PUSH-TXN-MINTED": "strict", "LOG-ACK-IDEMPOTENT": "strict",
    "LOG-ACK-NO-LEASE": "strict", "LOG-CONFIGURE": "strict", "LOG-TXN-MALFORMED-400": "strict",
}

# A broker may not offer these (docs/protocol.md §9 lists what is safe to omit). The probe of each is in
# conformance/features.py; id prefix -> feature, the longest matching prefix wins, ``C(..., feature=...)``
# wins over all of them. Core contracts need no feature: they are what every broker serves.
FEATURES: dict[str, str] = {
    "timers": "the timer routes (/api/v1/timers)",
    "kv": "the KV route (POST /api/v1/kv)",
    "locks": "locks and semaphores (POST /api/v1/locks)",
    "ephemeral": "ephemeral queues (/api/v1/ephemeral/*)",
    "streams": "the streams SDK routes (/streams/v1/*)",
    "deadlines": "per-message deadlines (deadlineMs on push)",
    "admin": "the operator API (/api/v1/admin/*)",
    "usage": "tenant usage and plans (GET /api/v1/usage)",
    "binary": "the binary push and transaction bodies (application/x-queen-push)",
    "frames": "the framed pop answer (frames=true)",
    "conflation": "conflating consumer groups (conflation=true)",
    "monitoring": "the monitoring routes (GET /api/v1/status, /api/v1/resources/*, /api/v1/messages)",
    "traces": "message traces (/api/v1/traces)",
    "consumer-groups": "consumer group management (/api/v1/consumer-groups)",
    "reads": "reads by offset (POST /api/v1/fetch, /api/v1/partitions/changed)",
    "lookup": "the message lookup by transaction id (GET /api/v1/messages/lookup)",
    "messages": "the message browser (GET /api/v1/messages, /api/v1/messages/{partitionId}/{transactionId})",
    "dlq-replay": "the DLQ replay by row id (POST /api/v1/dlq/{id}/replay)",
}
FEATURE_BY_PREFIX: dict[str, str] = {
    "TMR-": "timers", "MET-": "timers", "EDGE-TMR-": "timers", "XB-TIMER-": "timers", "XB-TOO-LATE": "timers",
    "LIM-TIMERS-": "timers", "TXN-TIMERS-": "timers", "CLI-RETRY-SYNTHETIC-": "timers", "TXN-RIDERS-": "kv",
    "TXN-ATOMIC": "kv", "TXN-KV-": "kv",
    "KV-": "kv", "EDGE-KV-": "kv", "LCK-": "locks", "EDGE-LCK-": "locks", "EPH-": "ephemeral", "XB-EPH-": "ephemeral",
    "STR-": "streams", "DL-": "deadlines", "EDGE-DEADLINE-": "deadlines", "LIM-": "admin", "EDGE-RETRY-AFTER": "admin",
    "LOG-PUSH-BINARY": "binary", "LOG-TX-BINARY": "binary", "LOG-POP-FRAMED": "frames", "LOG-POP-CONFLATION": "conflation",
    "CLI-MON-": "monitoring", "CLI-MON-MESSAGES": "messages", "CLI-MSG-DELETE": "messages", "LOG-LOOKUP": "lookup",
    "LOG-MESSAGE-GET": "messages", "LOG-DLQ-REPLAY": "dlq-replay", "CLI-TRACES": "traces", "CLI-GROUPS-": "consumer-groups", "CLI-FETCH": "reads",
    "CLI-CHANGED-SINCE": "reads", "REC-": "timers",
}


def _by_prefix(table: dict[str, str], cid: str) -> str | None:
    best = max((p for p in table if cid.startswith(p)), key=len, default=None)
    return table[best] if best is not None else None


def profile_of(cid: str) -> str:
    c = BY_ID.get(cid)
    got = (c.profile if c is not None else None) or _by_prefix(PROFILE_BY_PREFIX, cid)
    if got is None:
        raise KeyError(f"contract {cid}: no profile (give C(..., profile=...) or add its prefix to PROFILE_BY_PREFIX)")
    return got


def feature_of(cid: str) -> str | None:
    c = BY_ID.get(cid)
    return (c.feature if c is not None else None) or _by_prefix(FEATURE_BY_PREFIX, cid)


def family_of(cid: str) -> str:
    """The row of the compatibility matrix: the id's first segment (LOG, TMR, KV ...)."""
    return cid.split("-")[0]


for _c in CONTRACTS:
    assert profile_of(_c.id) in PROFILES, f"{_c.id}: unknown profile {profile_of(_c.id)!r}"
    assert feature_of(_c.id) in (None, *FEATURES), f"{_c.id}: unknown feature {feature_of(_c.id)!r}"


@dataclass(frozen=True)
class Deviation:
    broker: str
    what: str
    evidence: str


# A core contract an independent broker fails although our reading of the protocol holds: it keeps
# failing there, and this table says why that is the broker's deviation, not the suite's habit.
CPP = "C++ Queen 0.15.1"
_EXTEND = Deviation(
    CPP, "POST /api/v1/lease/{id}/extend without a body answers 400 {\"error\": \"Empty request body\"}",
    "docs/protocol.md §1.3 and §2.7: the extend arrives without a body; the client posts {} "
    "(queen/client.py, renew: post(f\"/api/v1/lease/{lease_id}/extend\", {})) and its HTTP client sends no "
    "body for an empty dict (queen/http/http_client.py: `elif body:`), so the official client's renew fails "
    "against it")
_ATTEMPT = Deviation(
    CPP, "popped messages carry no deliveryAttempt",
    "docs/protocol.md §2.4 lists deliveryAttempt among every message's fields; the client's own message model "
    "carries it (queen/http/pop_frames.py decodes deliveryAttempt per claim into each message)")
_RETENTION = Deviation(
    CPP, "the retention option is stored (the configure answer echoes it) but the message is still there "
    "20 s after it was due (the suite's --fire-timeout)",
    "docs/protocol.md §2.1 (the option is accepted and stored); the reference's retention runs as a periodic "
    "service: a longer --fire-timeout may see it; recorded as observed")
REFERENCE_DEVIATIONS: dict[str, Deviation] = {
    "LOG-LEASE-EXTEND": _EXTEND,
    "LOG-LEASE-EXTEND-GONE": _EXTEND,
    "CLI-RENEW-EXPIRED-LEASE": _EXTEND,
    "LOG-POP-SHAPE": _ATTEMPT,
    "LOG-ACK-FAILED-REDELIVERS": _ATTEMPT,
    "LOG-ACK-WRONG-LEASE": _ATTEMPT,
    "LOG-LEASE-EXPIRY": _ATTEMPT,
    "LOG-RETRY-LIMIT-DLQ": _ATTEMPT,
    "LOG-RETENTION": _RETENTION,
    "LOG-COMPLETED-RETENTION": _RETENTION,
    "CLI-OPT-PRIORITY": Deviation(
        CPP, "GET /api/v1/pop?namespace=&task= answers 404 (a uWebSockets 'File Not Found' page): no namespace pop",
        "docs/protocol.md §2.4 names the route; the client calls GET /api/v1/pop (queen/builders/queue_builder.py, "
        "a namespace/task consumer)"),
    "CLI-RETRY-MESSAGE": Deviation(
        CPP, "POST /api/v1/messages/{partitionId}/{transactionId}/retry answers 404 (no such route)",
        "docs/protocol.md §2.9; the client calls it (queen/admin/admin.py: retry_message)"),
    "CLI-OPT-MAX-SIZE": Deviation(
        CPP, "configure with maxSize=1 answers 200, yet a second push to the full queue answers status queued",
        "docs/protocol.md §2.1/§2.3: the option is sent by the client and a refused item is status failed, which "
        "the client reads"),
    "CLI-OPT-MAX-WAIT": Deviation(
        CPP, "a message older than maxWaitTimeSeconds is still delivered (not dead-lettered)",
        "docs/protocol.md §2.1: maxWaitTimeSeconds is a queue option the client sends (queen/builders/queue_builder.py)"),
    "CLI-OPT-RETRY-DELAY": Deviation(
        CPP, "a message nacked on a queue with retryDelay=1000 is handed out again at once",
        "docs/protocol.md §2.1: retryDelay is a queue option the client sends"),
    "LOG-DLQ-OFF-DROPS": Deviation(
        CPP, "with dlqAfterMaxRetries: false a message past its retry limit is still filed in the DLQ",
        "docs/protocol.md §2.1: dlqAfterMaxRetries is a queue option the client sends"),
    "LOG-ACK-COMPLETED": Deviation(
        CPP, "in a batch ack [completed, wrong lease, completed] the third message, acked completed under its live "
        "lease and answered success: true, is delivered again",
        "docs/protocol.md §2.5: each element answers its own acknowledgment and success is the signal; the client "
        "takes success: true as settled"),
}
REFERENCE_DEVIATIONS["LOG-ACK-PER-ITEM"] = REFERENCE_DEVIATIONS["LOG-ACK-COMPLETED"]

# Sentences of the timer spec (docs/timer-routes.md) that carry no id, and why. Listed so the
# sentence-by-sentence pass is auditable: each is a reason, a design statement or advice to clients,
# not a behaviour a broker can be caught violating over HTTP.
INFORMATIVE: tuple[tuple[str, str], ...] = (
    ("A timer is a message that is not in the log yet.", "definition (its promise is TMR-CANCEL-WITHDRAWS)"),
    ("... this is the first surface in the product whose call rate is decided by somebody else's web traffic.",
     "rationale for TMR-NO-TENANT-LIST"),
    ("Classifying all timer traffic as a produce variant ... would therefore 403 the cancels ...",
     "rationale for the DELETE route (its checks are TMR-CANCEL-*)"),
    ("That tenant would keep producing messages it cannot stop ...", "rationale"),
    ("An SDK that cancels should use the DELETE route.", "advice to SDK authors"),
    ("That keeps \u201cthis timer, rescheduled, delivered this message\u201d answerable ...",
     "rationale for TMR-RESCHEDULE-NEW-MESSAGE"),
    ("... no inter-broker skew can enter anywhere.", "consequence of TMR-ONE-CLOCK; needs two brokers' clocks"),
    ("A sub-second TTL is a real use for nobody ...", "rationale for KV-TTL-SECONDS"),
    ("A tenant that could post {\"producerSub\":\"billing-service\"} would get ... a frame ... forged by the client",
     "rationale for TMR-OWNED-PRODUCERSUB"),
    ("Above QUEEN_SWEEPER_MAX_SLEEP_MS you have a wake-up problem, not a load problem", "operational advice"),
    ("The next one is scheduled by whoever handled the first.", "advice to consumers"),
    ("A timer's push happens inside the sweeper, so encrypting late would leave the payload in cleartext ...",
     "rationale for TMR-ENCRYPT-AT-SCHEDULE"),
    ("Closed because a client that has to tell these apart writes a switch.", "rationale"),
    ("The broker holding the claim has already decompressed and packed that payload ...",
     "rationale for TMR-TOO-LATE-*"),
    ("... which is also the longest a cancel can answer too_late after a broker dies.",
     "needs killing a broker mid-claim; the bound itself is TMR-TOO-LATE-BOUNDED"),
    ("This is the one place on this surface where a user gets hurt ...", "emphasis"),
    ("A consumer that compensates must check state before compensating ... nobody writes it by accident.",
     "advice to consumers (saga shape), not broker behaviour"),
    ("The in-house lesson was already paid on queue deletion ...", "history"),
    ("Not revealing is right; saying ok: true would not be.", "rationale for TMR-ABSENT-OTHER-TENANT"),
    ("It is an inspection surface, and quietly decrypting ... would misreport the thing being inspected.",
     "rationale for TMR-PEEK-NO-DECRYPT"),
    ("The same one-sentence rule governs the three refusals as on the KV routes", "covered by TMR-RUNG-CLASSES"),
    ("... it is what keeps the row quota cyclic instead of permanent ... schedule rate times the horizon.",
     "rationale for the horizon; that a cancel frees the row quota is checked in LIM-TIMERS-QUOTA"),
    ("A timer becomes a message: a ceiling of its own would be a service entrance past the plan's own payload limit.",
     "rationale for TMR-PAYLOAD-CEILING"),
    ("The reason is structural rather than commercial ... never crosses the gateway ...", "rationale for metering"),
    ("... the frame never had a consumer group, its offset is not a position ...", "rationale for TMR-DLQ-REPLAY-REFUSED"),
)

# Sentences of the README's "Message log" section that carry no id, and why (same audit as above).
INFORMATIVE_LOG: tuple[tuple[str, str], ...] = (
    ("Code: broker/log/ ..., broker/sql/migrations/0010-0016_log_*.sql ...", "where our code lives, not wire behaviour"),
    ("DELETE /api/v1/resources/queues/{queue} ... 200 {deleted: true}", "needs the admin grant on tenant A's "
     "queues; deleting is destructive for a shared target (the missing-queue answer is CLI-DELETE-MISSING-QUEUE, "
     "on the operator's own tenant)"),
    ("partitions (how many partitions one pop may claim, default 1, all under one leaseId)",
     "not yet catalogued: a multi-partition pop's shared lease"),
    ("autopilot=true without partitions ... lets one pop claim up to 32 partitions, at most its batch",
     "a sizing choice the client leaves to the broker (tests/test_log_pop.py), not a promise it relies on"),
    ("other unknown parameters are ignored", "tolerance, not a promise a client relies on"),
    ("... (queen_messages_expired_total) ...", "metric names: the metrics surface is not part of the wire contract"),
    ("One queen_push call per request; offsets are gapless per partition and commit in offset order.",
     "implementation; the visible part (FIFO) is LOG-POP-FIFO"),
    ("Only the head of a partition is deleted ... a cursor below the floor moves up to it ...",
     "needs retention racing consumers at known offsets; the visible part is LOG-RETENTION / LOG-COMPLETED-RETENTION"),
    ("Each worker runs a supervised log-retention loop ... QUEEN_LOG_RETENTION_INTERVAL_MS ...",
     "operator settings (the suite waits up to --queen-fire-timeout for a pass)"),
    ("Deleted bytes leave the tenant's storage gauge ...", "metering detail; storage quota rungs are LIM-STORAGE-QUOTA"),
    ("To rotate: put the new key first and keep the old ones ... restart the brokers",
     "needs restarting the brokers with another key ring: out of reach over HTTP"),
    ("A message whose key is gone is still delivered ... undecryptable: true ...",
     "needs a key removed from the ring: out of reach over HTTP (the broker's own tests cover it)"),
    ("A queue switched to encryption is honoured by every worker at once ...",
     "a race between workers; not observable deterministically from outside"),
    ("Compression: payloads of at least QUEEN_ZSTD_THRESHOLD_BYTES are stored zstd-compressed ... transparently.",
     "invisible on the wire by design; LOG-PUSH-ANY-JSON and EDGE-LOG-PAYLOAD-BYTES round-trip large payloads"),
    ("Long polls and NOTIFY: ... advisory-lock handshake ... At drain, waiting polls answer 204 at once.",
     "mechanism; the wake-ups are LOG-POP-WAIT-WOKEN and XB-LONG-POLL-WAKE; drain needs stopping the broker"),
    ("Push cost: ... fast path ...", "performance, not behaviour (same answers)"),
    ("Metrics: queen_messages_pushed_total{source} ...", "metric names"),
    ("Bench: ...", "tooling"),
)

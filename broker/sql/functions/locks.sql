-- Locks and semaphores (POST /api/v1/locks, docs/protocol.md §5): queen_locks_apply runs every op of one
-- call in ONE function call. A permit is a real KV row (docs/decisions.md §8): table queen_kv (0005_kv),
-- namespace 'queen-locks', key '<name>#<slot>', value {"owner", "since"}, an expiry (always), and its
-- version is the fencing token: a write takes the next value of queen_kv_version, so the token of a
-- permit row only ever rises, across releases and re-acquires too. The guard a holder puts in a
-- transaction is the KV op {"op":"check","ns":"queen-locks","key":..,"expect":<token>,"required":true},
-- judged by queen_kv_apply like any check. Expiry is compared with now() here exactly as the KV does, and
-- the KV pruner removes expired permits with the other expired rows.
--
-- Locking, in this order (deadlock-free with the KV, whose writers and checks take their key locks
-- sorted before any row lock):
--   1. one advisory lock per (tenant, name) of every acquire/renew/release, sorted (the two-int form,
--      a lock space of its own): the calls on one name are judged one after the other, so the rows of
--      a name change only under that lock (the pruner only ever deletes expired ones);
--   2. the KV key lock (queen_kv_lock_id) of every row a renew, a release or a re-acquire will touch,
--      sorted, waiting for a transaction whose guard holds the row to end;
--   3. an acquire of a free slot only TRIES the slot's key lock (a guard still holding an expired
--      permit's row): it takes the next free slot, and when every free slot is busy that way it answers
--      acquired:false, reason "contended" rather than wait behind a foreign transaction.
-- Tables: broker/sql/migrations/0005_kv.sql. Re-applied at boot when a function file changes (CREATE OR
-- REPLACE statements only).

-- The slot of a permit row's key ('<name>#<slot>'; a name never holds '#').
CREATE OR REPLACE FUNCTION queen_lock_slot(p_key text) RETURNS integer LANGUAGE sql IMMUTABLE AS $$
    SELECT split_part(p_key, '#', 2)::integer
$$;

-- The live permit rows of one lock name (every slot), by the database clock.
CREATE OR REPLACE FUNCTION queen_lock_live(p_tenant text, p_name text) RETURNS SETOF queen_kv
LANGUAGE sql STABLE AS $$
    SELECT q.* FROM queen_kv q
    WHERE q.tenant = p_tenant AND q.ns = 'queen-locks'
      AND q.key >= (p_name || '#') COLLATE "C" AND q.key < (p_name || '$') COLLATE "C"
      AND (q.expires_at IS NULL OR q.expires_at > now())
$$;

-- Who holds a lock: one element per live permit, by slot.
CREATE OR REPLACE FUNCTION queen_lock_holders(p_tenant text, p_name text) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'slot', queen_lock_slot(r.key), 'owner', r.value->'owner', 'token', r.version,
               'since', r.value->'since', 'expiresAt', queen_kv_ts(r.expires_at),
               'renewedAt', queen_kv_ts(r.updated_at))
           ORDER BY queen_lock_slot(r.key)), '[]'::jsonb)
    FROM queen_lock_live(p_tenant, p_name) r
$$;

-- The guard of a permit at a token: the KV check a transaction carries first in its kv array.
CREATE OR REPLACE FUNCTION queen_lock_guard(p_key text, p_token bigint) RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object('op', 'check', 'ns', 'queen-locks', 'key', p_key, 'expect', p_token, 'required', true)
$$;

-- The row a renew or a release names: its slot's, or (no slot) the live one at the token, or for a renew
-- that names its owner the live one of that owner (a renew sent again after its answer was lost).
CREATE OR REPLACE FUNCTION queen_lock_target(p_tenant text, p_op jsonb) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_op->>'slot' IS NOT NULL THEN (p_op->>'name') || '#' || (p_op->>'slot') ELSE (
        SELECT r.key FROM queen_lock_live(p_tenant, p_op->>'name') r
        WHERE r.version = (p_op->>'token')::bigint
           OR (p_op->>'op' = 'renew' AND r.value->>'owner' = p_op->>'owner')
        ORDER BY r.version = (p_op->>'token')::bigint DESC, queen_lock_slot(r.key)
        LIMIT 1) END
$$;

-- queen_locks_apply: the ops of one call, validated and normalised by broker/locks/parse.py:
--   {"op":"acquire","name","ttl","owner","limit"}  {"op":"renew","name","token","ttl","slot"|null,"owner"|null}
--   {"op":"release","name","token","slot"|null}    {"op":"get","name"}
-- Each name appears at most once per call. Returns {"results":[...]} index-aligned, in the shapes of
-- docs/protocol.md §5. Every op is metered as one KV op; the permits' bytes go to the storage gauge.
CREATE OR REPLACE FUNCTION queen_locks_apply(p_tenant text, p_ops jsonb, p_period_s integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_out      jsonb[] := '{}';
    v_targets  text[] := '{}';
    v_op       jsonb;
    v_i        integer := 0;
    v_kind     text;
    v_name     text;
    v_owner    text;
    v_key      text;
    v_row      queen_kv%ROWTYPE;
    v_found    boolean;
    v_res      jsonb;
    v_ver      bigint;
    v_value    jsonb;
    v_slot     integer;
    v_free     integer[];
    v_storage  bigint := 0;
    v_tenant_known boolean := false;
    v_lock32   integer;
    v_lock     bigint;
BEGIN
    -- 1. The calls on one name, one after the other.
    FOR v_lock32 IN
        SELECT DISTINCT hashtext(p_tenant || chr(1) || (e->>'name'))
        FROM jsonb_array_elements(p_ops) AS e WHERE e->>'op' <> 'get' ORDER BY 1
    LOOP
        PERFORM pg_advisory_xact_lock(7143, v_lock32);
    END LOOP;

    -- 2. The rows a renew, a release or a re-acquire by the same owner will touch, then their KV key locks.
    FOR v_op IN SELECT e FROM jsonb_array_elements(p_ops) AS e LOOP
        v_key := NULL;
        IF v_op->>'op' = 'acquire' THEN
            SELECT r.key INTO v_key FROM queen_lock_live(p_tenant, v_op->>'name') r
            WHERE r.value->>'owner' = v_op->>'owner' ORDER BY queen_lock_slot(r.key) LIMIT 1;
        ELSIF v_op->>'op' IN ('renew', 'release') THEN
            v_key := queen_lock_target(p_tenant, v_op);
        END IF;
        v_targets := v_targets || v_key;
    END LOOP;
    FOR v_lock IN
        SELECT DISTINCT queen_kv_lock_id(p_tenant, 'queen-locks', k) FROM unnest(v_targets) AS k
        WHERE k IS NOT NULL ORDER BY 1
    LOOP
        PERFORM pg_advisory_xact_lock(v_lock);
    END LOOP;

    -- 3. Judge and write, op by op.
    FOR v_op IN SELECT e FROM jsonb_array_elements(p_ops) AS e LOOP
        v_i := v_i + 1;
        v_kind := v_op->>'op';
        v_name := v_op->>'name';
        v_owner := v_op->>'owner';
        v_key := v_targets[v_i];
        v_res := NULL;
        v_found := false;
        IF v_key IS NOT NULL THEN
            SELECT * INTO v_row FROM queen_kv q
            WHERE q.tenant = p_tenant AND q.ns = 'queen-locks' AND q.key = v_key FOR UPDATE;
            v_found := FOUND AND (v_row.expires_at IS NULL OR v_row.expires_at > now());
        END IF;

        IF v_kind = 'acquire' THEN
            IF v_found AND v_row.value->>'owner' = v_owner THEN
                -- The same holder asking again (an answer that was lost, or a second handle of one
                -- owner): the permit it has, same token, its lifetime never shortened.
                UPDATE queen_kv q SET expires_at = greatest(q.expires_at, now() + (v_op->>'ttl')::bigint * interval '1 second'),
                       updated_at = now()
                WHERE q.tenant = p_tenant AND q.ns = 'queen-locks' AND q.key = v_key;
                v_res := jsonb_build_object('acquired', true, 'slot', queen_lock_slot(v_key), 'token', v_row.version,
                                            'owner', v_owner, 'guard', queen_lock_guard(v_key, v_row.version),
                                            'already', true);
            ELSE
                v_free := ARRAY(
                    SELECT s FROM generate_series(0, (v_op->>'limit')::integer - 1) AS s
                    WHERE s NOT IN (SELECT queen_lock_slot(r.key) FROM queen_lock_live(p_tenant, v_name) r)
                    ORDER BY s);
                FOREACH v_slot IN ARRAY v_free LOOP
                    v_key := v_name || '#' || v_slot;
                    CONTINUE WHEN NOT pg_try_advisory_xact_lock(queen_kv_lock_id(p_tenant, 'queen-locks', v_key));
                    SELECT * INTO v_row FROM queen_kv q
                    WHERE q.tenant = p_tenant AND q.ns = 'queen-locks' AND q.key = v_key FOR UPDATE;
                    v_found := FOUND;
                    -- (live again cannot happen: the rows of a name change only under its lock, held here)
                    CONTINUE WHEN v_found AND (v_row.expires_at IS NULL OR v_row.expires_at > now());
                    v_ver := nextval('queen_kv_version');
                    v_value := jsonb_build_object('owner', v_owner, 'since', queen_kv_ts(now()));
                    IF v_found THEN
                        UPDATE queen_kv q SET value = v_value, version = v_ver, created_at = now(), updated_at = now(),
                               expires_at = now() + (v_op->>'ttl')::bigint * interval '1 second'
                        WHERE q.tenant = p_tenant AND q.ns = 'queen-locks' AND q.key = v_key;
                        v_storage := v_storage - octet_length(v_row.value::text) + octet_length(v_value::text);
                    ELSE
                        INSERT INTO queen_kv (tenant, ns, key, value, version, expires_at)
                        VALUES (p_tenant, 'queen-locks', v_key, v_value, v_ver,
                                now() + (v_op->>'ttl')::bigint * interval '1 second')
                        ON CONFLICT DO NOTHING;
                        CONTINUE WHEN NOT FOUND;
                        v_storage := v_storage + octet_length(v_key) + octet_length(v_value::text);
                    END IF;
                    IF NOT v_tenant_known THEN
                        -- the KV pruner walks tenants from queen_tenants
                        INSERT INTO queen_tenants (tenant) VALUES (p_tenant) ON CONFLICT DO NOTHING;
                        v_tenant_known := true;
                    END IF;
                    v_res := jsonb_build_object('acquired', true, 'slot', v_slot, 'token', v_ver, 'owner', v_owner,
                                                'guard', queen_lock_guard(v_key, v_ver));
                    EXIT;
                END LOOP;
                IF v_res IS NULL THEN
                    v_res := jsonb_build_object('acquired', false,
                        'reason', CASE WHEN cardinality(v_free) > 0 THEN 'contended' ELSE 'held' END,
                        'holders', queen_lock_holders(p_tenant, v_name));
                END IF;
            END IF;

        ELSIF v_kind = 'renew' THEN
            IF v_found AND (v_row.version = (v_op->>'token')::bigint OR v_row.value->>'owner' = v_owner) THEN
                v_ver := nextval('queen_kv_version');
                UPDATE queen_kv q SET version = v_ver, updated_at = now(),
                       expires_at = now() + (v_op->>'ttl')::bigint * interval '1 second'
                WHERE q.tenant = p_tenant AND q.ns = 'queen-locks' AND q.key = v_key;
                v_res := jsonb_build_object('renewed', true, 'slot', queen_lock_slot(v_key), 'token', v_ver,
                                            'guard', queen_lock_guard(v_key, v_ver));
            ELSE
                v_res := jsonb_build_object('renewed', false, 'reason', 'lost',
                                            'holders', queen_lock_holders(p_tenant, v_name));
            END IF;

        ELSIF v_kind = 'release' THEN
            IF v_found AND v_row.version = (v_op->>'token')::bigint THEN
                DELETE FROM queen_kv q WHERE q.tenant = p_tenant AND q.ns = 'queen-locks' AND q.key = v_key;
                v_storage := v_storage - octet_length(v_row.key) - octet_length(v_row.value::text);
                v_res := jsonb_build_object('released', true);
            ELSE
                v_res := jsonb_build_object('released', false, 'reason', 'lost');
            END IF;

        ELSIF v_kind = 'get' THEN
            v_value := queen_lock_holders(p_tenant, v_name);
            v_res := jsonb_build_object('held', jsonb_array_length(v_value) > 0, 'holders', v_value);

        ELSE
            RAISE EXCEPTION 'queen_locks_apply: unknown op %', v_kind USING ERRCODE = '22023';
        END IF;
        v_out := v_out || v_res;
    END LOOP;

    PERFORM queen_meter(p_tenant, p_period_s, 0, v_i);
    PERFORM queen_gauge_add(p_tenant, v_storage, 0);
    RETURN jsonb_build_object('results', to_jsonb(v_out));
END
$$;

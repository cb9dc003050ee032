-- The KV store: queen_kv_apply (every op of one call, or of one transaction's kv rider, in ONE
-- function call) and the expiry pruner. Tables: broker/sql/migrations/0005_kv.sql.
--
-- Storage counts a row as the bytes of its key plus its value's JSON text (the same measure on insert,
-- update, delete and prune, so the gauge never drifts).
-- Re-applied at boot when any function file changes (docs/guides/deploying.md, "Schema and upgrades"): CREATE OR
-- REPLACE statements only; tables, indexes and data belong in forward-only migrations.

-- A timestamp as the KV answers carry it (UTC, microseconds, ISO 8601).
CREATE OR REPLACE FUNCTION queen_kv_ts(ts timestamptz) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$$;

-- One KV row as the API answers it (the value only when asked for).
CREATE OR REPLACE FUNCTION queen_kv_row(r queen_kv, with_value boolean) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('key', r.key, 'version', r.version,
                              'expiresAt', queen_kv_ts(r.expires_at), 'updatedAt', queen_kv_ts(r.updated_at))
           || CASE WHEN with_value THEN jsonb_build_object('value', r.value) ELSE '{}'::jsonb END
$$;

-- The smallest string greater than every string that starts with p (code point order = C collation
-- byte order for UTF-8), or NULL when there is none. Gives getPrefix an index range.
CREATE OR REPLACE FUNCTION queen_kv_prefix_upper(p text) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    s text := p;
    c integer;
BEGIN
    WHILE s <> '' LOOP
        c := ascii(right(s, 1));
        IF c < 1114111 THEN
            RETURN left(s, -1) || chr(CASE WHEN c = 55295 THEN 57344 ELSE c + 1 END);
        END IF;
        s := left(s, -1);
    END LOOP;
    RETURN NULL;
END
$$;

-- The transaction advisory lock a writer (or a check) of one key takes before touching its row: one id
-- per (tenant, ns, key), shared with the lock permits of broker/sql/functions/locks.sql, so a guard's check and
-- a renew or release of its permit queue behind each other in the same global order.
CREATE OR REPLACE FUNCTION queen_kv_lock_id(p_tenant text, p_ns text, p_key text) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT hashtextextended(p_tenant || chr(1) || p_ns || chr(1) || p_key, 7142)
$$;

-- queen_kv_apply: apply the ops of one call in order; reads observe this call's earlier writes.
--
-- p_ops: the ops validated and normalised by broker/kv (putIfAbsent arrives as "put" with expect 0 and
-- keeps its name in "name"): {"op","name","ns","key"|"keys"|"prefix","after","limit","keysOnly",
-- "value","ttl" (seconds, null = forever),"expect","required","delta","min","max"}.
-- p_base: index of the first op in the caller's result space (0 standalone, the flat offset in a
-- transaction). p_budget: read byte budget (key + value JSON text bytes) for getMany/getPrefix rows;
-- a get always answers (one value is at most 64 KiB) but spends from the same budget.
--
-- Returns {"results":[...]} index-aligned, or {"abort":{"failedIndex","kvReason","version","value"}}
-- when an op with required:true did not apply: then every write of this call is rolled back (the
-- whole body runs in a subtransaction) and nothing is metered.
CREATE OR REPLACE FUNCTION queen_kv_apply(p_tenant text, p_ops jsonb, p_base integer, p_budget bigint,
                               p_period_s integer, p_meter boolean)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_out     jsonb[] := '{}';
    v_op      jsonb;
    v_i       integer := 0;
    v_kind    text;
    v_ns      text;
    v_key     text;
    v_row     queen_kv%ROWTYPE;
    v_exists  boolean;
    v_live    boolean;
    v_expect  bigint;
    v_res     jsonb;
    v_reason  text;
    v_ver     bigint;
    v_value   jsonb;
    v_exp     timestamptz;
    v_num     numeric;
    v_budget  bigint := p_budget;
    v_storage bigint := 0;
    v_rows    jsonb;
    v_missing jsonb;
    v_trunc   boolean;
    v_cost    bigint;
    v_limit   integer;
    v_count   integer;
    v_last    text;
    v_upper   text;
    v_keys    boolean;
    v_tenant_known boolean := false;
    r         record;
    v_msg     text;
    v_lock    bigint;
BEGIN
    -- Lock every key this call writes or checks BEFORE touching a row, in one global order (the lock
    -- id's): two calls naming the same keys in opposite orders then queue behind each other instead of
    -- deadlocking. Row locks and the wait on a concurrent insert of an absent key both come after.
    -- Transaction-scoped: held to commit, in a transaction body too.
    FOR v_lock IN
        SELECT DISTINCT queen_kv_lock_id(p_tenant, e->>'ns', e->>'key')
        FROM jsonb_array_elements(p_ops) AS e
        WHERE e->>'op' IN ('put', 'delete', 'incr', 'check')
        ORDER BY 1
    LOOP
        PERFORM pg_advisory_xact_lock(v_lock);
    END LOOP;
    BEGIN
        FOR v_op IN SELECT e FROM jsonb_array_elements(p_ops) AS e LOOP
            v_kind := v_op->>'op';
            v_ns := v_op->>'ns';
            v_key := v_op->>'key';
            v_reason := NULL;
            v_res := NULL;

            IF v_kind = 'get' THEN
                SELECT * INTO v_row FROM queen_kv q
                WHERE q.tenant = p_tenant AND q.ns = v_ns AND q.key = v_key
                  AND (q.expires_at IS NULL OR q.expires_at > now());
                IF FOUND THEN
                    v_res := jsonb_build_object('found', true) || queen_kv_row(v_row, true);
                    v_budget := v_budget - octet_length(v_row.key) - octet_length(v_row.value::text);
                ELSE
                    v_res := jsonb_build_object('found', false, 'key', v_key);
                END IF;

            ELSIF v_kind = 'getMany' THEN
                v_rows := '[]'; v_missing := '[]'; v_trunc := false;
                FOR r IN
                    SELECT k.key AS want, q AS kvrow, q.key IS NOT NULL AS hit
                    FROM jsonb_array_elements_text(v_op->'keys') WITH ORDINALITY AS k(key, ord)
                    LEFT JOIN queen_kv q
                      ON q.tenant = p_tenant AND q.ns = v_ns AND q.key = k.key COLLATE "C"
                     AND (q.expires_at IS NULL OR q.expires_at > now())
                    ORDER BY k.ord
                LOOP
                    IF r.hit THEN
                        -- once the budget cuts, later hits are left out too (in neither list); misses
                        -- cost nothing and are still reported
                        v_cost := octet_length((r.kvrow).key) + octet_length((r.kvrow).value::text);
                        IF v_trunc OR v_cost > v_budget THEN
                            v_trunc := true;
                            CONTINUE;
                        END IF;
                        v_budget := v_budget - v_cost;
                        v_rows := v_rows || queen_kv_row(r.kvrow, true);
                    ELSE
                        v_missing := v_missing || to_jsonb(r.want);
                    END IF;
                END LOOP;
                v_res := jsonb_build_object('rows', v_rows, 'missing', v_missing, 'truncated', v_trunc);

            ELSIF v_kind = 'getPrefix' THEN
                v_rows := '[]'; v_trunc := false; v_count := 0; v_last := NULL;
                v_limit := (v_op->>'limit')::integer;
                v_keys := coalesce((v_op->>'keysOnly')::boolean, false);
                v_upper := queen_kv_prefix_upper(v_op->>'prefix');
                FOR r IN
                    SELECT q AS kvrow FROM queen_kv q
                    WHERE q.tenant = p_tenant AND q.ns = v_ns
                      AND q.key >= (v_op->>'prefix') COLLATE "C"
                      AND (v_upper IS NULL OR q.key < v_upper COLLATE "C")
                      AND (v_op->>'after' IS NULL OR q.key > (v_op->>'after') COLLATE "C")
                      AND (q.expires_at IS NULL OR q.expires_at > now())
                    ORDER BY q.key
                    LIMIT v_limit + 1
                LOOP
                    IF v_count >= v_limit THEN
                        v_trunc := true;
                        EXIT;
                    END IF;
                    v_cost := octet_length((r.kvrow).key) + CASE WHEN v_keys THEN 0 ELSE octet_length((r.kvrow).value::text) END;
                    IF v_cost > v_budget THEN
                        v_trunc := true;
                        EXIT;
                    END IF;
                    v_budget := v_budget - v_cost;
                    v_rows := v_rows || queen_kv_row(r.kvrow, NOT v_keys);
                    v_count := v_count + 1;
                    v_last := (r.kvrow).key;
                END LOOP;
                v_res := jsonb_build_object('rows', v_rows, 'truncated', v_trunc,
                    'nextAfter', CASE WHEN v_trunc THEN to_jsonb(coalesce(v_last, v_op->>'after')) ELSE 'null'::jsonb END);

            ELSIF v_kind IN ('put', 'delete', 'incr', 'check') THEN
                v_expect := (v_op->>'expect')::bigint;
                <<attempt>>
                LOOP
                    IF v_kind = 'check' THEN
                        SELECT * INTO v_row FROM queen_kv q
                        WHERE q.tenant = p_tenant AND q.ns = v_ns AND q.key = v_key FOR SHARE;
                    ELSE
                        SELECT * INTO v_row FROM queen_kv q
                        WHERE q.tenant = p_tenant AND q.ns = v_ns AND q.key = v_key FOR UPDATE;
                    END IF;
                    v_exists := FOUND;
                    v_live := v_exists AND (v_row.expires_at IS NULL OR v_row.expires_at > now());

                    -- Preconditions (expect) and incr admission.
                    IF v_expect IS NOT NULL THEN
                        IF v_expect = 0 THEN
                            IF v_live THEN v_reason := 'exists'; END IF;
                        ELSIF NOT v_live THEN
                            v_reason := 'absent';
                        ELSIF v_row.version <> v_expect THEN
                            v_reason := 'version';
                        END IF;
                    ELSIF v_kind = 'delete' AND NOT v_live THEN
                        v_reason := 'absent';
                    END IF;
                    IF v_kind = 'incr' THEN
                        IF v_live AND jsonb_typeof(v_row.value) <> 'number' THEN
                            v_reason := 'type';
                        ELSE
                            v_num := CASE WHEN v_live THEN (v_row.value #>> '{}')::numeric ELSE 0 END
                                     + (v_op->>'delta')::numeric;
                            -- beyond a double no JSON client can read the number back: an implicit bound
                            IF (v_op->>'min' IS NOT NULL AND v_num < (v_op->>'min')::numeric)
                               OR (v_op->>'max' IS NOT NULL AND v_num > (v_op->>'max')::numeric)
                               OR abs(v_num) > 1.7976931348623157e308 THEN
                                v_reason := 'limit';
                            END IF;
                        END IF;
                    END IF;

                    IF v_reason IS NOT NULL THEN
                        v_res := jsonb_build_object('applied', false, 'reason', v_reason, 'key', v_key,
                            'value', CASE WHEN v_live THEN v_row.value
                                          WHEN v_kind = 'incr' THEN to_jsonb(0) ELSE 'null'::jsonb END,
                            'version', CASE WHEN v_live THEN v_row.version ELSE 0 END);
                        EXIT attempt;
                    END IF;

                    IF v_kind = 'check' THEN
                        v_res := jsonb_build_object('applied', true, 'key', v_key,
                            'value', CASE WHEN v_live THEN v_row.value ELSE 'null'::jsonb END,
                            'version', CASE WHEN v_live THEN v_row.version ELSE 0 END);
                        EXIT attempt;
                    END IF;

                    IF v_kind = 'delete' THEN
                        IF v_exists THEN
                            DELETE FROM queen_kv q WHERE q.tenant = p_tenant AND q.ns = v_ns AND q.key = v_key;
                            v_storage := v_storage - octet_length(v_row.key) - octet_length(v_row.value::text);
                        END IF;
                        v_res := jsonb_build_object('applied', true, 'key', v_key, 'value', 'null'::jsonb, 'version', 0);
                        EXIT attempt;
                    END IF;

                    -- put / incr: the new value and expiry. incr's TTL is create-only: a live row keeps its
                    -- expiry; a put never inherits the previous one.
                    IF v_kind = 'incr' THEN
                        v_value := to_jsonb(v_num);
                    ELSE
                        v_value := v_op->'value';
                    END IF;
                    IF v_kind = 'incr' AND v_live THEN
                        v_exp := v_row.expires_at;
                    ELSIF v_op->>'ttl' IS NULL THEN
                        v_exp := NULL;
                    ELSE
                        v_exp := now() + (v_op->>'ttl')::bigint * interval '1 second';
                    END IF;
                    IF v_exp IS NOT NULL AND NOT v_tenant_known THEN
                        -- the pruner walks tenants from queen_tenants
                        INSERT INTO queen_tenants (tenant) VALUES (p_tenant) ON CONFLICT DO NOTHING;
                        v_tenant_known := true;
                    END IF;
                    v_ver := nextval('queen_kv_version');
                    IF v_exists THEN
                        UPDATE queen_kv q SET value = v_value, version = v_ver, expires_at = v_exp, updated_at = now(),
                               created_at = CASE WHEN v_live THEN q.created_at ELSE now() END
                        WHERE q.tenant = p_tenant AND q.ns = v_ns AND q.key = v_key;
                        v_storage := v_storage - octet_length(v_row.value::text) + octet_length(v_value::text);
                    ELSE
                        INSERT INTO queen_kv (tenant, ns, key, value, version, expires_at)
                        VALUES (p_tenant, v_ns, v_key, v_value, v_ver, v_exp)
                        ON CONFLICT DO NOTHING;
                        IF NOT FOUND THEN
                            -- a concurrent writer created the key meanwhile: judge again against its row
                            CONTINUE attempt;
                        END IF;
                        v_storage := v_storage + octet_length(v_key) + octet_length(v_value::text);
                    END IF;
                    v_res := jsonb_build_object('applied', true, 'key', v_key, 'value', v_value, 'version', v_ver);
                    EXIT attempt;
                END LOOP;

                IF v_reason IS NOT NULL AND coalesce((v_op->>'required')::boolean, false) THEN
                    RAISE EXCEPTION USING ERRCODE = 'QK001', MESSAGE = jsonb_build_object(
                        'failedIndex', p_base + v_i, 'kvReason', v_reason,
                        'version', v_res->'version', 'value', v_res->'value')::text;
                END IF;
            ELSE
                RAISE EXCEPTION 'queen_kv_apply: unknown op %', v_kind USING ERRCODE = '22023';
            END IF;

            v_out := v_out || (jsonb_build_object('index', p_base + v_i, 'op', v_op->>'name') || v_res);
            v_i := v_i + 1;
        END LOOP;

        IF p_meter THEN
            PERFORM queen_meter(p_tenant, p_period_s, 0, v_i);
        END IF;
        PERFORM queen_gauge_add(p_tenant, v_storage, 0);
    EXCEPTION WHEN SQLSTATE 'QK001' THEN
        GET STACKED DIAGNOSTICS v_msg = MESSAGE_TEXT;
        RETURN jsonb_build_object('abort', v_msg::jsonb);
    END;
    RETURN jsonb_build_object('results', to_jsonb(v_out));
END
$$;

-- Remove expired rows, at most p_batch (each tenant's share capped at p_batch too), and give their bytes
-- back to the tenants' storage gauges. Re-checks expiry at delete time, so a row rewritten since it
-- was picked survives; a row a writer holds is skipped (pruned on a later pass).
CREATE OR REPLACE FUNCTION queen_kv_prune(p_batch integer) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_n integer := 0;
    r   record;
BEGIN
    FOR r IN
        WITH doomed AS (
            SELECT k.tenant, k.ns, k.key
            FROM queen_tenants t
            CROSS JOIN LATERAL (
                SELECT q.tenant, q.ns, q.key FROM queen_kv q
                WHERE q.tenant = t.tenant AND q.expires_at <= now()
                ORDER BY q.expires_at
                LIMIT p_batch
                FOR UPDATE SKIP LOCKED  -- never wait on a writer's row: no lock cycle with queen_kv_apply
            ) k
            LIMIT p_batch
        ), gone AS (
            DELETE FROM queen_kv q USING doomed d
            WHERE q.tenant = d.tenant AND q.ns = d.ns AND q.key = d.key AND q.expires_at <= now()
            RETURNING q.tenant, octet_length(q.key) + octet_length(q.value::text) AS bytes
        )
        SELECT tenant, sum(bytes)::bigint AS bytes, count(*)::integer AS n FROM gone GROUP BY tenant ORDER BY tenant
    LOOP
        PERFORM queen_gauge_add(r.tenant, -r.bytes, 0);
        v_n := v_n + r.n;
    END LOOP;
    RETURN v_n;
END
$$;

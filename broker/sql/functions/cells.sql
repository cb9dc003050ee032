-- Cells: the freeze guard of a tenant that is moving to another cell (queen_tenant_freeze,
-- broker/sql/migrations/0026_tenant_freeze.sql; the mover is broker/cells/move.py).
--
-- One statement-level trigger per table and write event, on every table that holds a tenant's state
-- (the list below is also the mover's copy list: tests/test_cells.py compares the two). It runs inside
-- the writer's transaction, after its rows are written and before its commit:
--   1. LOCK queen_tenant_freeze IN ACCESS SHARE MODE, held until the writer's commit. The mover freezes
--      under ACCESS EXCLUSIVE, so its freeze commits only once every transaction that has written
--      anything has ended, and a writer that comes later waits for the freeze to commit;
--   2. a new statement, so a new snapshot taken after that lock: with no frozen tenant at all (the
--      steady case: an empty table, one probe) it returns; else
--   3. it looks for a frozen tenant among the rows the statement wrote (the transition table) and
--      raises SQLSTATE 57Q01, which aborts the writer's whole transaction.
-- So once a freeze has committed no write of that tenant can commit in this database, and no write
-- that started before it is left half-done: it committed before the freeze, or it rolls back. The
-- mover's snapshot taken after the freeze therefore holds all of the tenant's committed state.
-- Statement-level, not per row: a 1,000-message push pays one call, and the transition tables are
-- shared with the storage-gauge triggers already on queen_messages and queen_timers.
-- Writes made by the mover itself run with session_replication_role = replica, which skips these.
CREATE OR REPLACE FUNCTION queen_freeze_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v record;
BEGIN
    LOCK TABLE queen_tenant_freeze IN ACCESS SHARE MODE;
    IF NOT EXISTS (SELECT 1 FROM queen_tenant_freeze) THEN
        RETURN NULL;
    END IF;
    SELECT f.tenant, f.state, f.retry_after_s INTO v
    FROM queen_tenant_freeze f
    WHERE f.tenant IN (SELECT DISTINCT r.tenant FROM queen_freeze_rows r)
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'tenant % is frozen in this cell (%)', v.tenant, v.state
            USING ERRCODE = '57Q01', DETAIL = v.tenant, HINT = v.retry_after_s::text;
    END IF;
    RETURN NULL;
END
$$;

-- The guarded tables, one trigger per write event (a trigger with a transition table serves one event).
-- These files are also applied to a schema part-way through its migrations (an upgrade release by
-- release): only tables that exist get a guard, and none before the freeze table itself exists.
DO $$
DECLARE
    t text;
BEGIN
    IF to_regclass('queen_tenant_freeze') IS NULL THEN
        RETURN;
    END IF;
    FOREACH t IN ARRAY ARRAY[
        'queen_tenants', 'queen_queues', 'queen_partitions', 'queen_messages', 'queen_log_floor',
        'queen_groups', 'queen_cursors', 'queen_msg_state', 'queen_dlq', 'queen_timers', 'queen_kv',
        'queen_tenant_plans', 'queen_tenant_switches', 'queen_timer_switches', 'queen_usage',
        'queen_usage_gauges', 'queen_rate_buckets', 'queen_traces', 'queen_trace_names',
        'queen_eph_queues', 'queen_eph_messages', 'queen_eph_cursors', 'queen_eph_inflight',
        'queen_eph_stats', 'queen_eph_incarnation', 'queen_stream_queries', 'queen_stream_state']
    LOOP
        CONTINUE WHEN to_regclass(t) IS NULL;
        EXECUTE format('CREATE OR REPLACE TRIGGER queen_freeze_ins AFTER INSERT ON %I '
                       'REFERENCING NEW TABLE AS queen_freeze_rows FOR EACH STATEMENT '
                       'EXECUTE FUNCTION queen_freeze_guard()', t);
        EXECUTE format('CREATE OR REPLACE TRIGGER queen_freeze_upd AFTER UPDATE ON %I '
                       'REFERENCING NEW TABLE AS queen_freeze_rows FOR EACH STATEMENT '
                       'EXECUTE FUNCTION queen_freeze_guard()', t);
        EXECUTE format('CREATE OR REPLACE TRIGGER queen_freeze_del AFTER DELETE ON %I '
                       'REFERENCING OLD TABLE AS queen_freeze_rows FOR EACH STATEMENT '
                       'EXECUTE FUNCTION queen_freeze_guard()', t);
    END LOOP;
END
$$;

-- The tables that hold a tenant's state: exactly those the freeze guards (one source of truth for the
-- guard, the mover's copy and its clean-up).
CREATE OR REPLACE FUNCTION queen_cells_tables() RETURNS SETOF text LANGUAGE sql STABLE AS $$
    SELECT c.relname::text FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
    WHERE t.tgname = 'queen_freeze_ins' AND c.relnamespace = current_schema()::regnamespace
    ORDER BY c.relname
$$;

-- Rows of p_tenant per guarded table (the mover checks the target holds none before, and that the
-- copy holds as many as the source's snapshot after).
CREATE OR REPLACE FUNCTION queen_cells_census(p_tenant text) RETURNS TABLE (tbl text, n bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t text;
BEGIN
    FOR t IN SELECT queen_cells_tables() LOOP
        tbl := t;
        EXECUTE format('SELECT count(*) FROM %I WHERE tenant = $1', t) INTO n USING p_tenant;
        RETURN NEXT;
    END LOOP;
END
$$;

-- Delete every row of p_tenant from the guarded tables (the source after a move, or the target after a
-- failed one). The caller runs it with session_replication_role = replica, so neither the guard nor
-- the gauge triggers fire: the gauges' own rows of the tenant are deleted with the rest.
CREATE OR REPLACE FUNCTION queen_cells_forget(p_tenant text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    t     text;
    n     bigint;
    total bigint := 0;
BEGIN
    FOR t IN SELECT queen_cells_tables() LOOP
        EXECUTE format('DELETE FROM %I WHERE tenant = $1', t) USING p_tenant;
        GET DIAGNOSTICS n = ROW_COUNT;
        total := total + n;
    END LOOP;
    RETURN total;
END
$$;

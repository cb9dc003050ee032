-- Pending-timer count per tenant, for the timer-row quota, without ever counting queen_timers:
-- statement-level triggers (transition tables) add one aggregate per INSERT / DELETE statement on
-- queen_timers (schedule of a new key, cancel, fire, DLQ move). A reschedule updates the row in
-- place and changes nothing; the sweeper's claim and backoff updates change nothing either.
--
-- Timer payloads are not added to the storage gauge: a pending timer is bounded by the timer-row quota
-- times the timer payload ceiling, and its bytes are counted as log storage once it fires.

CREATE FUNCTION queen_timers_gauge_ins() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queen_usage_gauges AS g (tenant, slot, storage_bytes, timers_pending)
    SELECT n.tenant, (pg_backend_pid() % 16)::smallint, 0, count(*)
    FROM queen_new_timers n GROUP BY n.tenant ORDER BY n.tenant
    ON CONFLICT (tenant, slot) DO UPDATE SET timers_pending = g.timers_pending + excluded.timers_pending;
    RETURN NULL;
END
$$;

CREATE FUNCTION queen_timers_gauge_del() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queen_usage_gauges AS g (tenant, slot, storage_bytes, timers_pending)
    SELECT o.tenant, (pg_backend_pid() % 16)::smallint, 0, -count(*)
    FROM queen_old_timers o GROUP BY o.tenant ORDER BY o.tenant
    ON CONFLICT (tenant, slot) DO UPDATE SET timers_pending = g.timers_pending + excluded.timers_pending;
    RETURN NULL;
END
$$;

CREATE TRIGGER queen_timers_gauge_ins AFTER INSERT ON queen_timers
    REFERENCING NEW TABLE AS queen_new_timers FOR EACH STATEMENT EXECUTE FUNCTION queen_timers_gauge_ins();
CREATE TRIGGER queen_timers_gauge_del AFTER DELETE ON queen_timers
    REFERENCING OLD TABLE AS queen_old_timers FOR EACH STATEMENT EXECUTE FUNCTION queen_timers_gauge_del();

-- Timers pending when this migration runs (a one-time count, at migration only).
INSERT INTO queen_usage_gauges (tenant, slot, storage_bytes, timers_pending)
SELECT tenant, 0, 0, count(*) FROM queen_timers GROUP BY tenant
ON CONFLICT (tenant, slot) DO UPDATE SET timers_pending = queen_usage_gauges.timers_pending + excluded.timers_pending;

-- A registration also forgets the expired registrations of the same (tenant, queue) (workers that
-- stopped or restarted under a new id), so queen_listeners stays as small as the set of live waiters.
-- Supersedes queen_listen of 0010.
CREATE OR REPLACE FUNCTION queen_listen(p_tenant text, p_queue text, p_worker text, p_ms bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(7301, queen_wake_key(p_tenant, p_queue));
    DELETE FROM queen_listeners l
    WHERE l.tenant = p_tenant AND l.queue = p_queue AND l.until < now() AND l.worker <> p_worker;
    INSERT INTO queen_listeners AS l (tenant, queue, worker, until)
    VALUES (p_tenant, p_queue, p_worker, now() + p_ms * interval '1 millisecond')
    ON CONFLICT (tenant, queue, worker) DO UPDATE SET until = greatest(l.until, excluded.until);
END
$$;

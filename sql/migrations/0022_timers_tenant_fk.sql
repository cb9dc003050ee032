-- The sweeper finds due timers by walking queen_tenants (every index leads with tenant), so a timer
-- whose tenant is missing there would never fire. The schedule path registers the tenant; this makes
-- the invariant hold for any writer of queen_timers, loudly.
ALTER TABLE queen_timers
    ADD CONSTRAINT queen_timers_tenant_fk FOREIGN KEY (tenant) REFERENCES queen_tenants (tenant);

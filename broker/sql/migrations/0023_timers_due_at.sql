-- The due instants of all tenants in one order, for the take (broker/sql/functions/timers.sql,
-- queen_timers_take): which tenants have due timers is the short front of this index, and the next due
-- instant its first entry. Before it, every cycle found both per tenant, one descent of
-- (tenant, due_at) for each tenant that had any timer: beside 1,000 tenants holding one far-future
-- timer each, a 5-row cycle took 18 ms instead of 3.6, beside 10,000 105 ms (PostgreSQL 16).
-- The tenant rides along so the front is read from the index alone.
CREATE INDEX queen_timers_due_at ON queen_timers (due_at, tenant) WHERE due_at IS NOT NULL;

-- queen_push's statements are planned once per connection instead of at every call: with the default
-- plan_cache_mode PL/pgSQL kept choosing fresh custom plans for the array-driven statements, and
-- planning was over half the cost of a one-item push (measured: 1.3 -> 0.6 ms per call at batch 1,
-- about 15 % less at batch 100, about 20 % more at batch 1000, where execution dominates).
ALTER FUNCTION queen_push(text, text[], text[], uuid[], text[], uuid[], bytea[], smallint[], text[], text[], bigint[])
    SET plan_cache_mode = force_generic_plan;

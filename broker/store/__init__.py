"""The only code that speaks SQL: the pool, the named-query loader and the migration runner."""

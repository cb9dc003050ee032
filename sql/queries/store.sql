-- Queries of the store itself (not of a surface).

-- name: store_ping
-- /health: does the database answer on a pooled connection?
SELECT 1

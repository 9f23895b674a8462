-- Issue 19, item 6: `created_at` of the rows the orphan rule reads is the database's clock at
-- insert, the clock heartbeats are written with (`extract(epoch from clock_timestamp())`,
-- Unix seconds), never a gateway host's. The rule takes a process's last sign of life as the
-- later of its heartbeat and its open request's (or claim's) creation, so a host clock there
-- let a host running ahead keep its requests and claims from the rule after it died, and one
-- running behind expose a fresh request to it.
--
-- - inference_requests: gw_reserve (and gw_reserve_batch, which calls it) stores the
--   database's clock; `p_now` is NULL from the gateway and only a test places a request in
--   time with it (as heartbeats). A leased request's record is written with the same
--   expression by its open write (src/adapters/pg/leases.ts) and, when its close writes it
--   first, by gw_close_leased_batch below; an Idempotency-Key claim by its INSERT.
-- - The columns default to it as well, for any other writer.
ALTER TABLE inference_requests
  ALTER COLUMN created_at SET DEFAULT extract(epoch from clock_timestamp())::bigint;
ALTER TABLE idempotency_keys
  ALTER COLUMN created_at SET DEFAULT extract(epoch from clock_timestamp())::bigint;

-- The functions this migration defined live in ../functions/ (current definitions only), which
-- migrate() re-applies after the migrations on every start: a migration holds tables, indexes
-- and data changes.

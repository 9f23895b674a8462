-- The ledger functions plan their statements for each call (test/false-capacity.test.ts).
--
-- PL/pgSQL caches every statement's plan per connection and, after five calls, keeps a
-- generic plan for good; nothing but an invalidation (DDL, ANALYZE, VACUUM) replans it. A
-- plan made while a table is small is a sequential scan, and it stays one as the table grows:
-- - after a plain VACUUM of a small ledger (the planner then believes the recorded 0 or 1
--   page; before a table's first VACUUM it assumes at least 10), even `WHERE id = $1` on
--   inference_requests, so every close read the whole request history several times per item;
-- - on a fresh database, gw_close_batch's `WHERE r.id = ANY (open_ids)`, twice per batch.
-- With autovacuum off (no autoanalyze to replan), closes fell further behind the
-- reservations as the history grew, queued, timed out or waited past their queue's bound, and
-- kept their offer slots in the outbox: in_flight reached max_concurrency with every request
-- answered, and reservations were refused `offer_at_capacity` until an ANALYZE replanned.
--
-- force_custom_plan plans each execution with the tables' current size (the page count is
-- read at planning time), so a point lookup is an index scan once a table is more than a few
-- pages, whatever VACUUM or ANALYZE recorded. Measured on the bench machine: no throughput
-- loss (planning these statements costs less than the generic plans did).
--
-- Applied to every plpgsql function named gw_* that exists (the per-request ledger of 005-007
-- and, when present, the lease functions). A function redefined later with CREATE OR REPLACE
-- loses this setting: repeat it there (the test checks every gw_* function).
DO $$
DECLARE
  f regprocedure;
BEGIN
  FOR f IN
    SELECT p.oid::regprocedure
    FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
    WHERE p.pronamespace = current_schema()::regnamespace
      AND l.lanname = 'plpgsql' AND p.proname LIKE 'gw\_%'
  LOOP
    EXECUTE format('ALTER FUNCTION %s SET plan_cache_mode = force_custom_plan', f);
  END LOOP;
END
$$;

-- Fleet-wide per-API-key limits (issue 21, item 7; docs/decisions/errors-and-rate-limits.md "Rate limits"): the
-- database is the arbiter of each key's request budget and stream count, and every replica
-- leases from it in chunks, so no limit is divided by a replica count and no row is written
-- per request.
--
-- rate_budgets: one row per API key that was ever limited, the fleet's token bucket (tokens
-- at `at`, epoch seconds of the database clock), updated in place. No index covers `tokens` or
-- `at`, and fillfactor leaves room on each page, so updates are HOT and their dead versions are
-- pruned with the page, without vacuum.
CREATE TABLE rate_budgets (
  api_key_id text PRIMARY KEY,
  tokens double precision NOT NULL,
  at double precision NOT NULL
) WITH (fillfactor = 50);

-- rate_streams: the stream slots each process holds of a key, until `expires_at` (epoch
-- seconds, database clock). A live process renews its rows; a dead one's stop counting once
-- they expire. One row per key and process, updated in place; expired rows of a key are
-- deleted when another process leases streams of it, so they are bounded by the processes
-- that died holding slots.
CREATE TABLE rate_streams (
  api_key_id text NOT NULL,
  instance_id text NOT NULL,
  slots integer NOT NULL,
  expires_at double precision NOT NULL,
  PRIMARY KEY (api_key_id, instance_id)
) WITH (fillfactor = 50);

-- Issue 38, item 1: a key's requests and a key's or a permit's usage, as APIs (GET /v1/requests,
-- GET /v1/usage), answered by index, never by reading every request row.
--
-- Both indexes name only columns a request's row is admitted with and never changes
-- (api_key_id, permit_id, created_at, id): the close stays a HOT update (migration 031;
-- hot-close.test.ts checks every index of the table). What the close writes (status, offer,
-- counts, charge) is read from the heap rows the index range leads to:
--
-- * inference_requests_key_created: a key's requests newest first (read backwards), each page
--   one range of the index from the cursor's (created_at, id); a key's usage over a time range.
--   The filters of the list (model, permit, status) are checked on those rows.
-- * inference_requests_permit_created: a permit's usage over a time range, whichever key made
--   the requests (only keys its payer authorized may ask).
--
-- IF NOT EXISTS: on a large table an operator may build them first with CREATE INDEX
-- CONCURRENTLY (same names and definitions; docs/operations.md).
CREATE INDEX IF NOT EXISTS inference_requests_key_created
  ON inference_requests (api_key_id, created_at, id);
CREATE INDEX IF NOT EXISTS inference_requests_permit_created
  ON inference_requests (permit_id, created_at);

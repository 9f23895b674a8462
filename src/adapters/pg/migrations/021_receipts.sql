-- Issue 22, item 2: signed usage receipts. A receipt is signed when it is asked for, from the
-- closed record (nothing is stored for it), and a settlement batch's receipts are the records
-- whose batch_id names it (migration 008). What a payer lists is a permit's charged records in
-- the order they closed: this index serves that list (and its pages) without a scan of every
-- request. Partial: an open or void request has no entry, so a reservation adds nothing here;
-- a charged close adds one entry (that UPDATE is never HOT: credits_charged is already indexed
-- by 008's settle queue). IF NOT EXISTS: on a large table an operator may build it beforehand
-- without holding writes (CREATE INDEX CONCURRENTLY, same name and definition; docs/operations.md).
CREATE INDEX IF NOT EXISTS inference_requests_permit_receipts ON inference_requests (permit_id, completed_at, id)
  WHERE credits_charged > 0;

-- Issue 35: a request's close is a HOT update. A request row is inserted at admission and
-- updated once at its close (status, counts, claim, charge, completed_at). PostgreSQL makes an
-- update HOT (one new tuple on the same page, no index entry written) only when no column that
-- any index of the table names, in its key, its expression or its WHERE clause, changes value,
-- and when the page has room for the new tuple. Before this migration the close changed status
-- (the open index's predicate), credits_charged and completed_at (four partial indexes), so
-- every close wrote a tuple on another page and an entry in every index of the table.
--
-- The rule from here on: no index of inference_requests names a column that a leased close
-- changes (status, offer_id, maximum_credits, tariff_version, the counts, claimed_*, counted_*,
-- credits_charged, billing, usage_source, error, completed_at; settlement_status changes only
-- for a close that charges nothing, from 'unsettled' to 'none'). migrate.test.ts checks it.
-- What needs the close's values in an index gets them elsewhere:
--
-- * The per-request reservations the orphan rule frees (gw_reserve's requests): a column of
--   their own, holds_reservation, true from gw_reserve's insert until gw_close_request, which
--   the leased path never sets. A per-request close stays a non-HOT update (it leaves the
--   index); it is the admission path of capped authorizations only.
-- * The open records of leased requests (the orphan rule voids those of a dead holder): an
--   open record's settlement_status is always 'unsettled' (the default; every settlement write
--   names charged requests only), so they are found among the unsettled requests of the
--   permits the dead holder leases (reconcileOrphans, gw_release_holder): a scan of the
--   settlement backlog while a dead holder still has leases, not an index of their own.
-- * Settlement's queue: the requests still 'unsettled' (the open ones and the charged ones not
--   yet in a batch), oldest admission first, filtered on the heap by the charge. Its entry is
--   written at admission and leaves when settlement writes the row (a batched, non-HOT update).
-- * Receipts (a permit's charges in the order they closed) and earnings (an offer's charges
--   over a window of completion times): inference_charges, one row per charged close, inserted
--   by the close in its transaction, never updated or deleted; the record stays the request
--   row, joined by id.
--
-- fillfactor: HOT needs room on the page of the open record for the closed version, and a
-- batch of closes is one transaction: every row of a page it closes needs its old and its new
-- version on the page at once (the old ones are reclaimed only after the commit). Inserts stop
-- at 45% of a page; a closed row is about 1.15 times its open record with the ids the gateway
-- makes (0x and 64 hex digits for permits, offers and models), up to about 1.35 with shorter
-- ids, so the new versions of all the records of a page fit beside the old ones. The old
-- versions' space is reclaimed by the page pruning that any later access to the page runs
-- (heap_page_prune_opt: below the free-space target, which a page at 45% always is), not by
-- vacuum: nothing here depends on vacuum. The heap is no larger than before: without vacuum,
-- a non-HOT close left its old version's space unused on the page all the same.

ALTER TABLE inference_requests ADD COLUMN IF NOT EXISTS holds_reservation boolean NOT NULL
  DEFAULT false;
UPDATE inference_requests SET holds_reservation = true
WHERE status IN ('pending', 'streaming') AND NOT leased;

-- New names, IF NOT EXISTS (and the column's too): on a large table an operator may add the
-- column and build the indexes first with CREATE INDEX CONCURRENTLY (same names and
-- definitions; docs/operations.md), since a build inside the migration's transaction holds the
-- table's writes until it ends.
DROP INDEX IF EXISTS inference_requests_open;
CREATE INDEX IF NOT EXISTS inference_requests_held ON inference_requests (instance_id)
  WHERE holds_reservation;
DROP INDEX IF EXISTS inference_requests_settle_queue;
CREATE INDEX IF NOT EXISTS inference_requests_settlement_queue ON inference_requests (created_at, id)
  WHERE settlement_status = 'unsettled';
DROP INDEX IF EXISTS inference_requests_unsettled;
CREATE INDEX IF NOT EXISTS inference_requests_unsettled_permit ON inference_requests (permit_id)
  WHERE settlement_status = 'unsettled';

CREATE TABLE inference_charges (
  request_id text NOT NULL,
  permit_id text NOT NULL,
  offer_id text NOT NULL,
  completed_at bigint NOT NULL
);
INSERT INTO inference_charges (request_id, permit_id, offer_id, completed_at)
SELECT id, permit_id, offer_id, completed_at FROM inference_requests
WHERE credits_charged > 0 AND status NOT IN ('pending', 'streaming');
CREATE INDEX inference_charges_permit ON inference_charges (permit_id, completed_at, request_id);
CREATE INDEX inference_charges_offer ON inference_charges (offer_id, completed_at);
DROP INDEX IF EXISTS inference_requests_permit_receipts;
DROP INDEX IF EXISTS inference_requests_offer_charges;

ALTER TABLE inference_requests SET (fillfactor = 45);

-- The functions this migration changed live in ../functions/ (current definitions only).

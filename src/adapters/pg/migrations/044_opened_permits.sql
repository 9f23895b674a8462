-- The permits the chain says a payer opened (PermitOpened, indexed from chain by the catalog
-- indexer, src/adapters/chain/indexer.ts), so that GET /v1/permits lists every permit of a payer
-- that authorized a key for all its permits (issue 38, item 1): the chain has no list of a
-- payer's permits but its events. Balances are still read from the chain (getPermit); a row is
-- written once and never updated (nothing here depends on vacuum). Permits opened before
-- START_BLOCK are not indexed.
CREATE TABLE opened_permits (
  permit_id text PRIMARY KEY,
  payer text NOT NULL,
  model_id text NOT NULL,
  block_number bigint NOT NULL
);
-- A payer's permits, newest first.
CREATE INDEX opened_permits_payer ON opened_permits (payer, block_number DESC, permit_id);

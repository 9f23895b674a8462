-- Settlement (issue 9): the batches the settlement account sends, every signed attempt of each,
-- the account's nonce and flusher lease, permits in their close grace period, and the states a
-- charge goes through: unsettled -> settling (in a batch whose transaction is stored) ->
-- settled (a confirmed receipt carries BatchSettled), or back to unsettled when the batch
-- fails, or unsettleable (the chain will never take it: its permit closed first, ...).

ALTER TABLE inference_requests DROP CONSTRAINT inference_requests_settlement_status_check;
ALTER TABLE inference_requests ADD CONSTRAINT inference_requests_settlement_status_check
  CHECK (settlement_status IN ('unsettled', 'settling', 'settled', 'none', 'unsettleable'));
-- Why a charge is unsettleable (permit_closed, offer_mismatch, ...).
ALTER TABLE inference_requests ADD COLUMN settlement_reason text;

-- Charges waiting to settle, oldest first (the open requests' default 'unsettled' is excluded by
-- the charge condition).
CREATE INDEX inference_requests_settle_queue ON inference_requests (completed_at, id)
  WHERE settlement_status = 'unsettled' AND credits_charged > 0;
CREATE INDEX inference_requests_batch ON inference_requests (batch_id) WHERE batch_id IS NOT NULL;

-- The part of `charged` that can never settle. It stays counted in `charged` (the availability
-- formula does not free it: the payer got it back only if the permit closed with a refund).
ALTER TABLE permit_ledgers ADD COLUMN unsettleable numeric(78, 0) NOT NULL DEFAULT 0
  CHECK (unsettleable >= 0);
ALTER TABLE permit_ledgers ADD CONSTRAINT permit_ledgers_settlement_within_charged
  CHECK (settled + unsettleable <= charged);

-- One row per sending account: the flusher lease (one flusher at a time, on the database clock)
-- and the next nonce the gateway will use (checked against the chain before use).
CREATE TABLE settlement_accounts (
  account text PRIMARY KEY,
  holder text,
  lease_expires_at timestamptz,
  next_nonce bigint NOT NULL DEFAULT 0 CHECK (next_nonce >= 0)
);

CREATE TABLE settlement_batches (
  batch_id text PRIMARY KEY,
  account text NOT NULL,
  status text NOT NULL CHECK (status IN ('pending', 'submitted', 'settled', 'failed')),
  -- The aggregated Charge entries: [{"permit_id","offer_id","amount","requests"}].
  charges jsonb NOT NULL,
  -- The settle(batchId, charges) call data every attempt carries.
  calldata text NOT NULL,
  requests integer NOT NULL CHECK (requests > 0),
  credits numeric(78, 0) NOT NULL CHECK (credits > 0),
  -- The attempt that was mined (settled or reverted).
  tx_hash text,
  block_number bigint,
  gas_used numeric(78, 0),
  error text,
  created_at bigint NOT NULL,
  settled_at bigint
);
CREATE INDEX settlement_batches_in_flight ON settlement_batches (account)
  WHERE status IN ('pending', 'submitted');

-- Every signed transaction that carried a batch, stored before it was broadcast.
CREATE TABLE settlement_attempts (
  tx_hash text PRIMARY KEY,
  batch_id text NOT NULL REFERENCES settlement_batches (batch_id),
  nonce bigint NOT NULL,
  raw_tx text NOT NULL,
  gas_limit numeric(78, 0) NOT NULL,
  max_fee_per_gas numeric(78, 0) NOT NULL,
  max_priority_fee_per_gas numeric(78, 0) NOT NULL,
  -- The chain head when the attempt was made: the replacement rule counts blocks from here.
  head_block bigint NOT NULL,
  created_at bigint NOT NULL
);
CREATE INDEX settlement_attempts_batch ON settlement_attempts (batch_id, created_at);

-- Permits whose payer requested the close (PermitCloseRequested), indexed from chain: their
-- charges settle first, before closable_at.
CREATE TABLE permit_closings (
  permit_id text PRIMARY KEY,
  closable_at bigint NOT NULL,
  block_number bigint NOT NULL
);

-- Provider earnings (issue 22): who may read an offer's earnings, and the index that reads them.
--
-- An offer's operator binds an API key to the offer with an EIP-712 signature (BindOfferKey);
-- the key may then read the offer's earnings until expires_at (Unix seconds), unless revoked by
-- the key that holds it, and only while `operator` is still the offer's operator. The gateway
-- inserts a row only after verifying the operator's signature, which is kept with its nonce as
-- the proof. A nonce is single-use per operator: the unique index makes claiming it and storing
-- the binding one step.
CREATE TABLE offer_key_bindings (
  id text PRIMARY KEY,
  -- Insertion order (several may be made within one second).
  seq bigint GENERATED ALWAYS AS IDENTITY,
  offer_id text NOT NULL,
  api_key_id text NOT NULL REFERENCES api_keys (id),
  operator text NOT NULL,
  expires_at bigint NOT NULL,
  nonce text NOT NULL,
  signature text NOT NULL,
  created_at bigint NOT NULL,
  revoked_at bigint
);

CREATE UNIQUE INDEX offer_key_bindings_operator_nonce ON offer_key_bindings (operator, nonce);
CREATE INDEX offer_key_bindings_key_offer ON offer_key_bindings (api_key_id, offer_id);

-- An offer's charges over a window of completion times (the earnings read), without walking
-- every request of every offer. IF NOT EXISTS: on a large table an operator may build it first
-- with CREATE INDEX CONCURRENTLY (same name and definition; docs/operations.md), since this
-- build, inside the migration's transaction, holds writes to the table until it ends.
CREATE INDEX IF NOT EXISTS inference_requests_offer_charges ON inference_requests (offer_id, completed_at)
  WHERE credits_charged > 0;

-- The recent settlement batches (GET /settlements/batches), newest first.
CREATE INDEX IF NOT EXISTS settlement_batches_recent ON settlement_batches (created_at, batch_id);

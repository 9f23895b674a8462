-- Spending authority (DESIGN.md section 8): a payer's EIP-712 signature lets one API key spend
-- the payer's permits (one permit, or every permit when permit_id is all zeros) until
-- expires_at (Unix seconds), unless revoked, by the key that holds it or on the payer's signed
-- revocation. The gateway inserts a row only after verifying the payer's signature, which is
-- kept with its nonce as the proof. A nonce is single-use per payer: the unique index makes
-- claiming it and storing the authorization one step.
CREATE TABLE permit_authorizations (
  id text PRIMARY KEY,
  -- Insertion order: lists are newest first, and several may be made within one second.
  seq bigint GENERATED ALWAYS AS IDENTITY,
  api_key_id text NOT NULL REFERENCES api_keys (id),
  payer text NOT NULL,
  permit_id text NOT NULL,
  expires_at bigint NOT NULL,
  nonce text NOT NULL,
  signature text NOT NULL,
  created_at bigint NOT NULL,
  revoked_at bigint,
  revoked_by text CHECK (revoked_by IN ('key', 'payer')),
  CHECK ((revoked_at IS NULL) = (revoked_by IS NULL))
);

CREATE UNIQUE INDEX permit_authorizations_payer_nonce ON permit_authorizations (payer, nonce);
-- The API key lookup loads a key's live authorizations with the key (one round trip).
CREATE INDEX permit_authorizations_key ON permit_authorizations (api_key_id, seq);

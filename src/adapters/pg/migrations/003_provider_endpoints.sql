-- Provider endpoints registered through signed EIP-712 challenges, and the
-- single-use nonces those challenges carried.

CREATE TABLE provider_endpoints (
  offer_id text PRIMARY KEY REFERENCES offers (offer_id),
  -- The operator whose signature registered the endpoint (lower-case address).
  operator text NOT NULL,
  -- AES-256-GCM sealed JSON {"url", "token"}: never stored or logged in clear.
  endpoint_sealed bytea NOT NULL,
  registered_at bigint NOT NULL,
  -- Unix seconds; NULL until verification succeeds (re-registration clears them).
  verified_at bigint,
  verification_expires_at bigint,
  -- Code of the check that failed last (NULL after a success).
  verification_error text,
  -- Last liveness verdict of the prober (NULL: never probed) and when it was reached.
  running boolean,
  checked_at bigint
);

CREATE TABLE registration_nonces (
  nonce text PRIMARY KEY,
  offer_id text NOT NULL,
  operator text NOT NULL,
  expires_at bigint NOT NULL,
  used_at timestamptz NOT NULL DEFAULT now()
);

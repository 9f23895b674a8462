-- Quotes, reservations, charges and idempotency: the money path.
-- Amounts are numeric(78,0) in the credit token's base units; times are Unix seconds.

CREATE TABLE quotes (
  quote_id text PRIMARY KEY,
  api_key_id text NOT NULL,
  model text NOT NULL,
  model_id text NOT NULL,
  offer_id text NOT NULL,
  tariff_version numeric(78, 0) NOT NULL,
  input_tokens numeric(78, 0) NOT NULL,
  max_output_tokens numeric(78, 0) NOT NULL,
  wakes_endpoint boolean NOT NULL,
  maximum_credits numeric(78, 0) NOT NULL,
  -- sha256 of the canonical JSON of model, messages, output limit, tools, tool choice, response format
  fingerprint text NOT NULL,
  created_at bigint NOT NULL,
  expires_at bigint NOT NULL,
  -- Made by the gateway for a chat request that brought no quote.
  internal boolean NOT NULL DEFAULT false,
  -- The request that consumed it (single use).
  used_by text
);

-- Per permit: what is held for requests in flight, what has been charged (settled or not),
-- and how much of that the gateway has settled on chain.
CREATE TABLE permit_ledgers (
  permit_id text PRIMARY KEY,
  reserved numeric(78, 0) NOT NULL DEFAULT 0 CHECK (reserved >= 0),
  charged numeric(78, 0) NOT NULL DEFAULT 0 CHECK (charged >= 0),
  settled numeric(78, 0) NOT NULL DEFAULT 0 CHECK (settled >= 0 AND settled <= charged),
  updated_at timestamptz NOT NULL DEFAULT now()
);

-- Requests in flight per offer, shared by every gateway process (max_concurrency).
CREATE TABLE offer_loads (
  offer_id text PRIMARY KEY,
  in_flight integer NOT NULL DEFAULT 0 CHECK (in_flight >= 0)
);

-- Live gateway processes; requests of a process whose heartbeat stopped are orphans.
CREATE TABLE gateway_instances (
  instance_id text PRIMARY KEY,
  started_at bigint NOT NULL,
  heartbeat_at bigint NOT NULL
);

CREATE TABLE inference_requests (
  id text PRIMARY KEY,
  api_key_id text NOT NULL,
  instance_id text NOT NULL,
  model text NOT NULL,
  model_id text NOT NULL,
  offer_id text NOT NULL,
  permit_id text NOT NULL,
  quote_id text NOT NULL,
  stream boolean NOT NULL,
  status text NOT NULL CHECK (status IN ('pending', 'streaming', 'completed', 'failed', 'cancelled')),
  input_tokens numeric(78, 0) NOT NULL DEFAULT 0,
  output_tokens numeric(78, 0) NOT NULL DEFAULT 0,
  -- While pending/streaming this is the reservation held against the permit.
  maximum_credits numeric(78, 0) NOT NULL,
  credits_charged numeric(78, 0) CHECK (credits_charged IS NULL OR credits_charged <= maximum_credits),
  billing text CHECK (billing IN ('billed', 'partial', 'void')),
  usage_source text CHECK (usage_source IN ('provider', 'gateway')),
  tariff_version numeric(78, 0) NOT NULL,
  error text,
  created_at bigint NOT NULL,
  completed_at bigint,
  settlement_status text NOT NULL DEFAULT 'unsettled'
    CHECK (settlement_status IN ('unsettled', 'settling', 'settled', 'none')),
  batch_id text,
  tx_hash text,
  settled_at bigint
);

CREATE INDEX inference_requests_open ON inference_requests (instance_id)
  WHERE status IN ('pending', 'streaming');
CREATE INDEX inference_requests_unsettled ON inference_requests (permit_id)
  WHERE settlement_status = 'unsettled' AND status IN ('completed', 'failed', 'cancelled');

-- Offers whose provider reported more usage than the gateway could account for.
CREATE TABLE offer_flags (
  id bigserial PRIMARY KEY,
  offer_id text NOT NULL,
  request_id text NOT NULL,
  reason text NOT NULL,
  created_at bigint NOT NULL
);

CREATE TABLE idempotency_keys (
  api_key_id text NOT NULL,
  key text NOT NULL,
  -- sha256 of the request (body, permit, quote): the same key with another request is refused.
  fingerprint text NOT NULL,
  state text NOT NULL CHECK (state IN ('in_progress', 'completed')),
  request_id text,
  -- The RPC messages of the result (protobuf binary), replayed as they were sent.
  messages bytea[],
  created_at bigint NOT NULL,
  expires_at bigint NOT NULL,
  PRIMARY KEY (api_key_id, key)
);

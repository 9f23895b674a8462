-- The market as indexed from the chain. Hex values are stored lower-case;
-- uint256 amounts as numeric(78,0) (never floating point).

CREATE TABLE chain_cursors (
  name text PRIMARY KEY,
  block_number bigint NOT NULL,
  updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE models (
  model_id text PRIMARY KEY,
  creator text NOT NULL,
  credit_token text NOT NULL,
  repository text NOT NULL,
  revision text NOT NULL,
  task text NOT NULL,
  pool_id text NOT NULL,
  position_token_id numeric(78, 0) NOT NULL,
  status text NOT NULL CHECK (status IN ('pending', 'active', 'paused', 'retired')),
  indexed_block bigint NOT NULL,
  updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE offers (
  offer_id text PRIMARY KEY,
  model_id text NOT NULL REFERENCES models (model_id),
  owner text NOT NULL,
  operator text NOT NULL,
  payout text NOT NULL,
  status text NOT NULL CHECK (status IN ('active', 'paused', 'retired')),
  tariff_version numeric(78, 0) NOT NULL,
  input_price_per_mtok numeric(78, 0) NOT NULL,
  output_price_per_mtok numeric(78, 0) NOT NULL,
  wake_fee numeric(78, 0) NOT NULL,
  region text NOT NULL,
  hardware text NOT NULL,
  max_concurrency integer NOT NULL,
  capabilities jsonb NOT NULL,
  indexed_block bigint NOT NULL,
  updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX offers_model_id ON offers (model_id);

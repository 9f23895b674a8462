-- API keys issued by the CLI. Only a SHA-256 hash of the key is kept; `prefix` (the first
-- 8 characters) lets an operator recognise and revoke a key without the key itself.
CREATE TABLE api_keys (
  id text PRIMARY KEY,
  name text NOT NULL,
  key_hash bytea NOT NULL UNIQUE,
  prefix text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  revoked_at timestamptz
);

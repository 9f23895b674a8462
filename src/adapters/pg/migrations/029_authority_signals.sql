-- migrate: functions first
-- (The line above makes migrate() apply ../functions/ before this migration: its triggers name
-- gw_authority_signal, which lives there.)
--
-- Issue 28, items 4 and 5.
--
-- Authority signals (docs/decisions/authority-and-signing.md "Authority across processes"): a new permit
-- authorization, a revocation and an API key revocation are announced on `gw_authority` by these
-- triggers at commit, whoever writes them, and every gateway process drops what it cached of
-- the key (functions/authority-signals.sql has the payloads).
CREATE TRIGGER permit_authorizations_signal
  AFTER INSERT OR UPDATE OR DELETE ON permit_authorizations
  FOR EACH ROW EXECUTE FUNCTION gw_authority_signal();
CREATE TRIGGER permit_authorizations_truncate_signal
  AFTER TRUNCATE ON permit_authorizations
  FOR EACH STATEMENT EXECUTE FUNCTION gw_authority_signal();

-- API keys that carry their own check (docs/decisions/authority-and-signing.md "Unknown keys cost nothing"): the
-- last characters of a key issued from now on are a keyed check of the others, under a secret
-- of the deployment kept here, so a gateway refuses a made-up key without asking the database.
-- Keys issued before have no check (key_check false): every process holds their hashes, so a
-- made-up key of their shape is refused from memory as well.
ALTER TABLE api_keys ADD COLUMN key_check boolean NOT NULL DEFAULT false;
CREATE TRIGGER api_keys_signal
  AFTER INSERT OR UPDATE OR DELETE ON api_keys
  FOR EACH ROW EXECUTE FUNCTION gw_authority_signal();
CREATE TRIGGER api_keys_truncate_signal
  AFTER TRUNCATE ON api_keys
  FOR EACH STATEMENT EXECUTE FUNCTION gw_authority_signal();

-- Secrets of the deployment, made once by the first process that needs them and shared by
-- every process on the database (never logged, never answered): `api_key_check`, 32 random
-- bytes, the key of the API keys' check.
CREATE TABLE gateway_secrets (
  name text PRIMARY KEY,
  value bytea NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);

-- Authority signals (migration 029; docs/decisions/authority-and-signing.md "Authority across processes"): every
-- change to what an API key may do is announced on the channel `gw_authority` at its commit, so
-- that every gateway process sharing the database drops what it holds of that key at once
-- (src/adapters/pg/authority-signals.ts listens). The triggers fire whoever writes: a gateway,
-- the CLI, a hand-written SQL statement.
--
-- Payloads: `key:<api key id>` (that key's row, or one of its permit authorizations, changed:
-- its cached lookup and authority are dropped) and `all` (drop every cached key and authority:
-- a TRUNCATE, or an API key written without its check, by an older release, which every process
-- then learns). A transaction's identical notifications are delivered once, at its commit.
CREATE OR REPLACE FUNCTION gw_authority_signal() RETURNS trigger LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan AS $$
BEGIN
  IF TG_LEVEL = 'STATEMENT' THEN
    PERFORM pg_notify('gw_authority', 'all');
  ELSIF TG_TABLE_NAME = 'api_keys' THEN
    IF TG_OP = 'INSERT' THEN
      IF NOT NEW.key_check THEN
        PERFORM pg_notify('gw_authority', 'all');
      END IF;
    ELSIF TG_OP = 'DELETE' THEN
      PERFORM pg_notify('gw_authority', 'key:' || OLD.id);
    ELSE
      PERFORM pg_notify('gw_authority', 'key:' || OLD.id);
      IF NEW.id <> OLD.id THEN
        PERFORM pg_notify('gw_authority', 'key:' || NEW.id);
      END IF;
    END IF;
  ELSE
    IF TG_OP <> 'INSERT' THEN
      PERFORM pg_notify('gw_authority', 'key:' || OLD.api_key_id);
    END IF;
    IF TG_OP <> 'DELETE' AND (TG_OP = 'INSERT' OR NEW.api_key_id <> OLD.api_key_id) THEN
      PERFORM pg_notify('gw_authority', 'key:' || NEW.api_key_id);
    END IF;
  END IF;
  RETURN NULL;
END;
$$;

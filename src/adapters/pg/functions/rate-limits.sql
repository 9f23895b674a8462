-- Fleet-wide per-API-key limits (migration 020; docs/decisions/errors-and-rate-limits.md "Rate limits"). Lock order:
-- a key's rate_budgets row before its rate_streams rows; that row serialises every lease of
-- the key.

-- Takes up to `p_want` whole tokens of a key's fleet bucket (refilled at `p_rps` per second,
-- at most `p_burst`), after giving back `p_return` unused ones. Returns the tokens granted
-- and the (fractional) tokens left in the bucket. A refusal that gives nothing back writes
-- nothing.
CREATE OR REPLACE FUNCTION gw_rate_lease(
  p_key text, p_want integer, p_return integer, p_rps double precision,
  p_burst double precision,
  OUT granted integer, OUT tokens_left double precision
) LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan AS $$
DECLARE
  v_now double precision := extract(epoch from clock_timestamp());
  v_tokens double precision;
BEGIN
  SELECT least(p_burst, b.tokens + greatest(0, v_now - b.at) * p_rps + p_return)
    INTO v_tokens FROM rate_budgets b WHERE b.api_key_id = p_key FOR UPDATE;
  IF NOT FOUND THEN
    INSERT INTO rate_budgets (api_key_id, tokens, at) VALUES (p_key, p_burst, v_now)
      ON CONFLICT (api_key_id) DO NOTHING;
    SELECT least(p_burst, b.tokens + greatest(0, v_now - b.at) * p_rps + p_return)
      INTO v_tokens FROM rate_budgets b WHERE b.api_key_id = p_key FOR UPDATE;
  END IF;
  granted := greatest(0, least(p_want, floor(v_tokens)))::integer;
  tokens_left := v_tokens - granted;
  IF granted > 0 OR p_return > 0 THEN
    UPDATE rate_budgets SET tokens = tokens_left, at = v_now WHERE api_key_id = p_key;
  END IF;
END $$;

-- Sets the stream slots `p_holder` holds of a key to `p_slots` (renewed for `p_ttl` seconds)
-- if the slots every live holder holds then stay within `p_max`; a decrease always succeeds.
-- Returns the slots held after the call (the old count when refused).
CREATE OR REPLACE FUNCTION gw_rate_streams(
  p_key text, p_holder text, p_slots integer, p_max integer, p_ttl double precision
) RETURNS integer LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan AS $$
DECLARE
  v_now double precision := extract(epoch from clock_timestamp());
  v_others integer;
  v_mine integer;
BEGIN
  INSERT INTO rate_budgets (api_key_id, tokens, at) VALUES (p_key, 0, v_now)
    ON CONFLICT (api_key_id) DO NOTHING;
  PERFORM 1 FROM rate_budgets WHERE api_key_id = p_key FOR UPDATE;
  DELETE FROM rate_streams
    WHERE api_key_id = p_key AND instance_id <> p_holder AND expires_at <= v_now;
  SELECT coalesce(sum(slots), 0)::integer INTO v_others FROM rate_streams
    WHERE api_key_id = p_key AND instance_id <> p_holder;
  SELECT CASE WHEN expires_at > v_now THEN slots ELSE 0 END INTO v_mine FROM rate_streams
    WHERE api_key_id = p_key AND instance_id = p_holder;
  v_mine := coalesce(v_mine, 0);
  IF p_slots > v_mine AND v_others + p_slots > p_max THEN
    RETURN v_mine;
  END IF;
  INSERT INTO rate_streams (api_key_id, instance_id, slots, expires_at)
    VALUES (p_key, p_holder, p_slots, v_now + p_ttl)
    ON CONFLICT (api_key_id, instance_id)
    DO UPDATE SET slots = excluded.slots, expires_at = excluded.expires_at;
  RETURN p_slots;
END $$;

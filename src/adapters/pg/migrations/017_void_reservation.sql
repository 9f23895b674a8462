-- Issue 19, item 2: the void close of a reservation whose outcome is unknown (its statement was
-- sent, its answer lost). gw_close_request alone cannot be that close: a reservation still
-- under way (waiting for a lock, or running after the client's query timeout fired) has not
-- committed its request row, so the close finds nothing, and the reservation then lands and
-- holds its credits and offer slot for as long as the process lives (the orphan rule frees
-- only the requests of dead processes).
--
-- gw_void_reservation settles it either way, in one statement:
-- - no row with the request's id: it inserts the request final (`failed`, `void`, charged 0,
--   settlement `none`), so a reservation that arrives later fails on the primary key and rolls
--   back whole (quote, slot, credits): nothing is held;
-- - a row, committed or being inserted (the INSERT waits for that transaction, then sees the
--   conflict): it closes it as gw_close_request does, exactly once (a final row is left as is).
-- Returns gw_close_request's (finalized, credits_charged); a row inserted here is `finalized`
-- false: nothing was held. Lock order: the request row only, then gw_close_request's.
CREATE FUNCTION gw_void_reservation(
  p_request_id text, p_api_key_id text, p_instance_id text, p_model text, p_model_id text,
  p_offer_id text, p_permit_id text, p_quote_id text, p_stream boolean, p_maximum numeric,
  p_tariff_version numeric, p_error text, p_now bigint
) RETURNS TABLE (finalized boolean, credits_charged numeric) LANGUAGE plpgsql AS $$
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'gw_void_reservation needs READ COMMITTED, not %', current_setting('transaction_isolation');
  END IF;
  INSERT INTO inference_requests (id, api_key_id, instance_id, model, model_id, offer_id,
    permit_id, quote_id, stream, status, input_tokens, output_tokens, maximum_credits,
    credits_charged, billing, usage_source, tariff_version, error, created_at, completed_at,
    settlement_status)
  VALUES (p_request_id, p_api_key_id, p_instance_id, p_model, p_model_id, p_offer_id,
    p_permit_id, p_quote_id, p_stream, 'failed', 0, 0, p_maximum, 0, 'void', 'gateway',
    p_tariff_version, p_error, extract(epoch from clock_timestamp())::bigint, p_now, 'none')
  ON CONFLICT (id) DO NOTHING;
  IF FOUND THEN
    RETURN QUERY SELECT false, 0::numeric;
    RETURN;
  END IF;
  -- A new statement, so a new snapshot (READ COMMITTED): it sees the row the INSERT waited for.
  RETURN QUERY SELECT c.finalized, c.credits_charged
    FROM gw_close_request(p_request_id, 'failed', 0, 0, 0, 'void', 'gateway', p_error, p_now, NULL) c;
END
$$;

-- As 011 does for every ledger function.
ALTER FUNCTION gw_void_reservation(text, text, text, text, text, text, text, text, boolean,
  numeric, numeric, text, bigint) SET plan_cache_mode = force_custom_plan;

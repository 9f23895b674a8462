-- gw_reserve with fewer statements on its common path (it runs before every upstream call, so
-- its round trip is part of every request's latency): the same arguments, checks in the same
-- order, refusals, rows written, locks and lock order as 006's.
--
-- - An internal quote is inserted already used by its request (one INSERT instead of INSERT
--   then UPDATE). It is a fresh row nobody else can name, so nothing can use it in between.
-- - The offer's and the permit's rows are admitted by their conditional UPDATE first. Only
--   when that finds nothing is a neutral row inserted (`ON CONFLICT DO NOTHING`, as 006 does
--   unconditionally) and the UPDATE tried once more: under READ COMMITTED the second UPDATE, a
--   new statement, sees a row another transaction committed meanwhile, and one that waits for
--   the row's lock re-checks its WHERE on the newest version. So a refusal still means the row
--   exists and its condition fails, as before; a row that exists (every request after a permit's
--   and an offer's first) costs one statement instead of two.
CREATE OR REPLACE FUNCTION gw_reserve(
  p_request_id text, p_api_key_id text, p_instance_id text, p_model text, p_model_id text,
  p_offer_id text, p_permit_id text, p_quote_id text, p_stream boolean, p_maximum numeric,
  p_tariff_version numeric, p_input_tokens numeric, p_deposit numeric, p_chain_settled numeric,
  p_max_concurrency integer, p_now bigint, p_quote jsonb
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'gw_reserve needs READ COMMITTED, not %', current_setting('transaction_isolation');
  END IF;
  -- Lock order everywhere: quote, request, offers (ascending id), permit.
  IF p_quote IS NOT NULL THEN
    IF p_quote->>'quote_id' IS DISTINCT FROM p_quote_id THEN
      RAISE EXCEPTION 'gw_reserve: the internal quote is not quote %', p_quote_id;
    END IF;
    INSERT INTO quotes
    SELECT * FROM jsonb_populate_record(NULL::quotes,
      p_quote || jsonb_build_object('used_by', p_request_id));
  ELSE
    UPDATE quotes SET used_by = p_request_id WHERE quote_id = p_quote_id AND used_by IS NULL;
    IF NOT FOUND THEN
      RAISE EXCEPTION USING MESSAGE = 'gw:quote_used';
    END IF;
  END IF;
  INSERT INTO inference_requests (id, api_key_id, instance_id, model, model_id, offer_id,
    permit_id, quote_id, stream, status, input_tokens, maximum_credits, tariff_version, created_at)
  VALUES (p_request_id, p_api_key_id, p_instance_id, p_model, p_model_id, p_offer_id,
    p_permit_id, p_quote_id, p_stream, 'pending', p_input_tokens, p_maximum, p_tariff_version, p_now);
  IF p_max_concurrency < 1 THEN
    RAISE EXCEPTION USING MESSAGE = 'gw:offer_at_capacity';
  END IF;
  UPDATE offer_loads SET in_flight = in_flight + 1
  WHERE offer_id = p_offer_id AND in_flight < p_max_concurrency;
  IF NOT FOUND THEN
    INSERT INTO offer_loads (offer_id, in_flight) VALUES (p_offer_id, 0)
    ON CONFLICT (offer_id) DO NOTHING;
    UPDATE offer_loads SET in_flight = in_flight + 1
    WHERE offer_id = p_offer_id AND in_flight < p_max_concurrency;
    IF NOT FOUND THEN
      RAISE EXCEPTION USING MESSAGE = 'gw:offer_at_capacity';
    END IF;
  END IF;
  UPDATE permit_ledgers p SET reserved = p.reserved + p_maximum, updated_at = now()
  WHERE p.permit_id = p_permit_id
    AND p_deposit - (p.charged + GREATEST(0, p_chain_settled - p.settled)) - p.reserved
      >= p_maximum;
  IF NOT FOUND THEN
    -- A missing ledger row is created if a fresh permit could hold this reservation; when it
    -- could not, an existing row could not either (charged >= settled).
    INSERT INTO permit_ledgers (permit_id)
    SELECT p_permit_id WHERE p_deposit - GREATEST(0, p_chain_settled) >= p_maximum
    ON CONFLICT (permit_id) DO NOTHING;
    UPDATE permit_ledgers p SET reserved = p.reserved + p_maximum, updated_at = now()
    WHERE p.permit_id = p_permit_id
      AND p_deposit - (p.charged + GREATEST(0, p_chain_settled - p.settled)) - p.reserved
        >= p_maximum;
    IF NOT FOUND THEN
      RAISE EXCEPTION USING MESSAGE = 'gw:insufficient_credits';
    END IF;
  END IF;
END
$$;

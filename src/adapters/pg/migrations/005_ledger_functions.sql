-- The two per-request ledger transactions as functions, so each is ONE round trip that
-- commits on its own (autocommit). Every request of one permit and one offer updates the same
-- two rows, and their row locks are held until COMMIT: with the statements sent one by one,
-- the lock was held across several network round trips and requests queued behind it. Run as
-- one statement, the lock is held for the function's own work and the commit only.
--
-- Both rely on READ COMMITTED: a conditional UPDATE that waited on a row lock re-checks its
-- WHERE clause on the row's newest version (EvalPlanQual), so two processes can never both
-- pass a check that only one of them fits. A refusal raises `gw:<reason>`, which rolls back
-- everything the call did.

CREATE FUNCTION gw_reserve(
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
    INSERT INTO quotes SELECT * FROM jsonb_populate_record(NULL::quotes, p_quote);
  END IF;
  UPDATE quotes SET used_by = p_request_id WHERE quote_id = p_quote_id AND used_by IS NULL;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING MESSAGE = 'gw:quote_used';
  END IF;
  INSERT INTO inference_requests (id, api_key_id, instance_id, model, model_id, offer_id,
    permit_id, quote_id, stream, status, input_tokens, maximum_credits, tariff_version, created_at)
  VALUES (p_request_id, p_api_key_id, p_instance_id, p_model, p_model_id, p_offer_id,
    p_permit_id, p_quote_id, p_stream, 'pending', p_input_tokens, p_maximum, p_tariff_version, p_now);
  IF p_max_concurrency < 1 THEN
    RAISE EXCEPTION USING MESSAGE = 'gw:offer_at_capacity';
  END IF;
  INSERT INTO offer_loads AS l (offer_id, in_flight) VALUES (p_offer_id, 1)
  ON CONFLICT (offer_id) DO UPDATE SET in_flight = l.in_flight + 1
    WHERE l.in_flight < p_max_concurrency;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING MESSAGE = 'gw:offer_at_capacity';
  END IF;
  -- A missing ledger row is created holding this reservation if a fresh permit could hold it;
  -- when it could not, an existing row could not either (charged >= settled).
  INSERT INTO permit_ledgers AS p (permit_id, reserved)
  SELECT p_permit_id, p_maximum WHERE p_deposit - GREATEST(0, p_chain_settled) >= p_maximum
  ON CONFLICT (permit_id) DO UPDATE
    SET reserved = p.reserved + EXCLUDED.reserved, updated_at = now()
    WHERE p_deposit - (p.charged + GREATEST(0, p_chain_settled - p.settled)) - p.reserved
      >= EXCLUDED.reserved;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING MESSAGE = 'gw:insufficient_credits';
  END IF;
END
$$;

-- Finalises a request exactly once (the status condition), moving its reservation to a
-- charge clamped to its maximum and releasing its offer slot. With p_orphaned_before set, only
-- a request whose process stopped heartbeating before then (the orphan rule) is closed.
CREATE FUNCTION gw_close_request(
  p_request_id text, p_status text, p_input_tokens numeric, p_output_tokens numeric,
  p_credits_charged numeric, p_billing text, p_usage_source text, p_error text, p_now bigint,
  p_orphaned_before bigint
) RETURNS TABLE (finalized boolean, credits_charged numeric) LANGUAGE plpgsql AS $$
DECLARE
  closed record;
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'gw_close_request needs READ COMMITTED, not %', current_setting('transaction_isolation');
  END IF;
  UPDATE inference_requests r SET
    status = p_status,
    input_tokens = COALESCE(p_input_tokens, r.input_tokens),
    output_tokens = COALESCE(p_output_tokens, r.output_tokens),
    credits_charged = LEAST(p_credits_charged, r.maximum_credits),
    billing = p_billing,
    usage_source = p_usage_source,
    error = p_error,
    completed_at = p_now,
    settlement_status = CASE WHEN LEAST(p_credits_charged, r.maximum_credits) > 0
                             THEN 'unsettled' ELSE 'none' END
  WHERE r.id = p_request_id AND r.status IN ('pending', 'streaming')
    AND (p_orphaned_before IS NULL OR GREATEST(
          (SELECT g.heartbeat_at FROM gateway_instances g WHERE g.instance_id = r.instance_id),
          r.created_at) < p_orphaned_before)
  RETURNING r.permit_id, r.offer_id, r.maximum_credits, r.credits_charged INTO closed;
  IF NOT FOUND THEN
    RETURN QUERY SELECT false, COALESCE(
      (SELECT r.credits_charged FROM inference_requests r WHERE r.id = p_request_id), 0::numeric);
    RETURN;
  END IF;
  -- in_flight >= 0 is a CHECK: releasing a slot nobody holds fails rather than drifting.
  UPDATE offer_loads SET in_flight = in_flight - 1 WHERE offer_id = closed.offer_id;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'ledger inconsistency: offer load % is missing', closed.offer_id;
  END IF;
  UPDATE permit_ledgers
    SET reserved = reserved - closed.maximum_credits, charged = charged + closed.credits_charged,
        updated_at = now()
    WHERE permit_id = closed.permit_id;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'ledger inconsistency: permit ledger % is missing', closed.permit_id;
  END IF;
  RETURN QUERY SELECT true, closed.credits_charged;
END
$$;

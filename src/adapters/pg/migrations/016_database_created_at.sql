-- Issue 19, item 6: `created_at` of the rows the orphan rule reads is the database's clock at
-- insert, the clock heartbeats are written with (`extract(epoch from clock_timestamp())`,
-- Unix seconds), never a gateway host's. The rule takes a process's last sign of life as the
-- later of its heartbeat and its open request's (or claim's) creation, so a host clock there
-- let a host running ahead keep its requests and claims from the rule after it died, and one
-- running behind expose a fresh request to it.
--
-- - inference_requests: gw_reserve (and gw_reserve_batch, which calls it) stores the
--   database's clock; `p_now` is NULL from the gateway and only a test places a request in
--   time with it (as heartbeats). A leased request's record is written with the same
--   expression by its open write (src/adapters/pg/leases.ts) and, when its close writes it
--   first, by gw_close_leased_batch below; an Idempotency-Key claim by its INSERT.
-- - The columns default to it as well, for any other writer.
ALTER TABLE inference_requests
  ALTER COLUMN created_at SET DEFAULT extract(epoch from clock_timestamp())::bigint;
ALTER TABLE idempotency_keys
  ALTER COLUMN created_at SET DEFAULT extract(epoch from clock_timestamp())::bigint;

-- 007's gw_reserve, but for `created_at`.
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
    p_permit_id, p_quote_id, p_stream, 'pending', p_input_tokens, p_maximum, p_tariff_version,
    COALESCE(p_now, extract(epoch from clock_timestamp())::bigint));
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

-- 010's gw_close_leased_batch, but for `created_at` of a record its close writes first (the
-- open write was lost or skipped): the database's clock as well, not the item's.
CREATE OR REPLACE FUNCTION gw_close_leased_batch(p_items jsonb)
RETURNS TABLE (idx integer, finalized boolean, credits_charged numeric) LANGUAGE plpgsql AS $$
DECLARE
  item record;
  v_done boolean;
  v_charge numeric;
  v_group record;
  v_ids text[] := '{}';
  v_holders text[] := '{}';
  v_permits text[] := '{}';
  v_charges numeric[] := '{}';
  v_finalized boolean[] := '{}';
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'gw_close_leased_batch needs READ COMMITTED, not %', current_setting('transaction_isolation');
  END IF;
  -- 1. The requests, in item order (fresh ids of this process: nobody else waits on them but
  -- the orphan rule, which locks a request row only).
  FOR item IN
    SELECT a.ord::integer AS i, r.*
    FROM jsonb_array_elements(p_items) WITH ORDINALITY AS a(e, ord)
    CROSS JOIN LATERAL jsonb_to_record(a.e) AS r(
      id text, api_key_id text, holder text, model text, model_id text, offer_id text,
      permit_id text, quote_id text, stream boolean, maximum numeric, tariff_version numeric,
      created_at bigint, status text, input_tokens numeric, output_tokens numeric,
      credits_charged numeric, billing text, usage_source text, error text, now bigint)
    ORDER BY a.ord
  LOOP
    v_charge := LEAST(item.credits_charged, item.maximum);
    UPDATE inference_requests r SET
      status = item.status, offer_id = item.offer_id, maximum_credits = item.maximum,
      tariff_version = item.tariff_version, input_tokens = item.input_tokens,
      output_tokens = item.output_tokens, credits_charged = v_charge, billing = item.billing,
      usage_source = item.usage_source, error = item.error, completed_at = item.now,
      settlement_status = CASE WHEN v_charge > 0 THEN 'unsettled' ELSE 'none' END
    WHERE r.id = item.id AND r.status IN ('pending', 'streaming') AND r.leased;
    v_done := FOUND;
    IF NOT v_done THEN
      INSERT INTO inference_requests (id, api_key_id, instance_id, model, model_id, offer_id,
        permit_id, quote_id, stream, status, input_tokens, output_tokens, maximum_credits,
        credits_charged, billing, usage_source, tariff_version, error, created_at, completed_at,
        settlement_status, leased)
      VALUES (item.id, item.api_key_id, item.holder, item.model, item.model_id, item.offer_id,
        item.permit_id, item.quote_id, item.stream, item.status, item.input_tokens,
        item.output_tokens, item.maximum, v_charge, item.billing, item.usage_source,
        item.tariff_version, item.error, extract(epoch from clock_timestamp())::bigint, item.now,
        CASE WHEN v_charge > 0 THEN 'unsettled' ELSE 'none' END, true)
      ON CONFLICT (id) DO NOTHING;
      v_done := FOUND;
    END IF;
    IF NOT v_done THEN
      v_charge := COALESCE((SELECT r.credits_charged FROM inference_requests r WHERE r.id = item.id), 0);
    END IF;
    v_ids := v_ids || item.id;
    v_holders := v_holders || item.holder;
    v_permits := v_permits || item.permit_id;
    v_charges := v_charges || v_charge;
    v_finalized := v_finalized || v_done;
  END LOOP;

  -- 2. Per (holder, permit), in permit order: the charges move out of the lease.
  FOR v_group IN
    SELECT c.holder, c.permit_id COLLATE "C" AS permit_id, sum(c.charge) AS total,
      array_agg(c.ord) AS ords
    FROM unnest(v_holders, v_permits, v_charges, v_finalized) WITH ORDINALITY
      AS c(holder, permit_id, charge, done, ord)
    WHERE c.done AND c.charge > 0
    GROUP BY 1, 2 ORDER BY 2, 1
  LOOP
    PERFORM 1 FROM permit_ledgers WHERE permit_id = v_group.permit_id FOR UPDATE;
    UPDATE permit_leases SET credits = credits - v_group.total
    WHERE holder = v_group.holder AND permit_id = v_group.permit_id AND credits >= v_group.total;
    IF FOUND THEN
      UPDATE permit_ledgers
        SET reserved = reserved - v_group.total, charged = charged + v_group.total,
            updated_at = now()
      WHERE permit_id = v_group.permit_id;
      IF NOT FOUND THEN
        RAISE EXCEPTION 'ledger inconsistency: permit ledger % is missing', v_group.permit_id;
      END IF;
    ELSE
      -- The lease is gone (or short): these requests were served after their holder was
      -- taken for dead; nothing holds their charge, so they are void.
      UPDATE inference_requests r SET credits_charged = 0, billing = 'void',
        settlement_status = 'none', status = 'failed',
        error = 'its reservation lease was released (the process was taken for stopped)'
      WHERE r.id = ANY (SELECT v_ids[o] FROM unnest(v_group.ords) AS o);
      FOR i IN 1 .. array_length(v_ids, 1) LOOP
        IF i = ANY (v_group.ords) THEN
          v_charges[i] := 0;
        END IF;
      END LOOP;
    END IF;
  END LOOP;

  FOR i IN 1 .. COALESCE(array_length(v_ids, 1), 0) LOOP
    idx := i;
    finalized := v_finalized[i];
    credits_charged := v_charges[i];
    RETURN NEXT;
  END LOOP;
END
$$;

-- CREATE OR REPLACE dropped 011's setting of the two functions: repeat it.
ALTER FUNCTION gw_reserve(text, text, text, text, text, text, text, text, boolean, numeric,
  numeric, numeric, numeric, numeric, integer, bigint, jsonb)
  SET plan_cache_mode = force_custom_plan;
ALTER FUNCTION gw_close_leased_batch(jsonb) SET plan_cache_mode = force_custom_plan;

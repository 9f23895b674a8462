-- Issue 20, item 5: usage details. Of a request's usage as the provider reported it, the input
-- tokens served from the provider's prompt cache (OpenAI's
-- `usage.prompt_tokens_details.cached_tokens`) and the output tokens spent on reasoning
-- (`usage.completion_tokens_details.reasoning_tokens`) are recorded with the request. They are
-- parts of input_tokens and output_tokens, shown and never priced: the charge stays the price
-- of input_tokens and output_tokens (DESIGN.md section 3). The gateway records them only when
-- credible (non-negative, within the totals), else 0; 0 also when the provider reported none,
-- for every close but a completed one with provider usage, and for every row closed before this
-- migration (a constant default: no table rewrite).
--
-- They are written by the statements that close a request, in the same UPDATE (or INSERT) as
-- the rest of its final state, so a close costs no extra write: gw_close_request (two new
-- trailing parameters, default 0, so gw_void_reservation, the orphan rule and a gateway of the
-- previous release call it unchanged), gw_close_batch and gw_close_leased_batch (two new
-- optional members of an item; absent: 0). Otherwise the functions are their latest
-- definitions (010's gw_close_request, 006's gw_close_batch, 016's gw_close_leased_batch).
ALTER TABLE inference_requests
  ADD COLUMN cached_input_tokens numeric(78, 0) NOT NULL DEFAULT 0,
  ADD COLUMN reasoning_tokens numeric(78, 0) NOT NULL DEFAULT 0;

-- A new parameter list is a new function: the old one goes, so one definition stays live.
DROP FUNCTION gw_close_request(text, text, numeric, numeric, numeric, text, text, text, bigint,
  bigint);

-- 010's gw_close_request, and the two details (the orphan rule's void close passes none: 0).
CREATE FUNCTION gw_close_request(
  p_request_id text, p_status text, p_input_tokens numeric, p_output_tokens numeric,
  p_credits_charged numeric, p_billing text, p_usage_source text, p_error text, p_now bigint,
  p_orphaned_before bigint, p_cached_input_tokens numeric DEFAULT 0,
  p_reasoning_tokens numeric DEFAULT 0
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
    cached_input_tokens = COALESCE(p_cached_input_tokens, 0),
    reasoning_tokens = COALESCE(p_reasoning_tokens, 0),
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
  RETURNING r.permit_id, r.offer_id, r.maximum_credits, r.credits_charged, r.leased INTO closed;
  IF NOT FOUND THEN
    RETURN QUERY SELECT false, COALESCE(
      (SELECT r.credits_charged FROM inference_requests r WHERE r.id = p_request_id), 0::numeric);
    RETURN;
  END IF;
  IF closed.leased THEN
    IF closed.credits_charged > 0 THEN
      RAISE EXCEPTION 'a leased request is charged through its lease (gw_close_leased_batch)';
    END IF;
    RETURN QUERY SELECT true, 0::numeric;
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

-- 006's gw_close_batch; an item may also carry cached_input_tokens and reasoning_tokens.
CREATE OR REPLACE FUNCTION gw_close_batch(p_items jsonb)
RETURNS TABLE (idx integer, finalized boolean, credits_charged numeric, error text)
LANGUAGE plpgsql AS $$
DECLARE
  item record;
  closed record;
  v_key text;
  open_ids text[] := '{}';
  v_state text;
  v_message text;
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'gw_close_batch needs READ COMMITTED, not %', current_setting('transaction_isolation');
  END IF;
  IF jsonb_typeof(p_items) IS DISTINCT FROM 'array' THEN
    RAISE EXCEPTION 'gw_close_batch: p_items must be a JSON array';
  END IF;

  -- 1. The open requests. One finalised while we waited for its lock fails the status check
  -- on its newest version and is left alone. A locked request cannot be finalised by anyone
  -- else, nor change its offer (switchOffer locks it first).
  FOR v_key IN
    SELECT DISTINCT (e->>'request_id') COLLATE "C" FROM jsonb_array_elements(p_items) e
    ORDER BY 1
  LOOP
    UPDATE inference_requests r SET status = r.status
    WHERE r.id = v_key AND r.status IN ('pending', 'streaming');
    IF FOUND THEN
      open_ids := open_ids || v_key;
    END IF;
  END LOOP;

  -- 2. Their offers' rows, and 3. their permits' rows (which their reservations made).
  FOR v_key IN
    SELECT DISTINCT r.offer_id COLLATE "C" FROM inference_requests r WHERE r.id = ANY (open_ids)
    ORDER BY 1
  LOOP
    UPDATE offer_loads l SET in_flight = l.in_flight WHERE l.offer_id = v_key;
  END LOOP;
  FOR v_key IN
    SELECT DISTINCT r.permit_id COLLATE "C" FROM inference_requests r WHERE r.id = ANY (open_ids)
    ORDER BY 1
  LOOP
    UPDATE permit_ledgers p SET reserved = p.reserved WHERE p.permit_id = v_key;
  END LOOP;

  -- 4. The items, in order, each in its own subtransaction.
  FOR item IN
    SELECT a.ord::integer AS i, r.*
    FROM jsonb_array_elements(p_items) WITH ORDINALITY AS a(e, ord)
    CROSS JOIN LATERAL jsonb_to_record(a.e) AS r(
      request_id text, status text, input_tokens numeric, output_tokens numeric,
      credits_charged numeric, billing text, usage_source text, error text, now bigint,
      cached_input_tokens numeric, reasoning_tokens numeric)
    ORDER BY a.ord
  LOOP
    idx := item.i;
    finalized := NULL;
    credits_charged := NULL;
    error := NULL;
    IF NOT (item.request_id = ANY (open_ids)) THEN
      finalized := false;
      credits_charged := COALESCE(
        (SELECT r.credits_charged FROM inference_requests r WHERE r.id = item.request_id), 0);
    ELSE
      BEGIN
        SELECT c.finalized, c.credits_charged INTO closed
        FROM gw_close_request(item.request_id, item.status, item.input_tokens,
          item.output_tokens, item.credits_charged, item.billing, item.usage_source, item.error,
          item.now, NULL, item.cached_input_tokens, item.reasoning_tokens) c;
        finalized := closed.finalized;
        credits_charged := closed.credits_charged;
      EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT;
        error := v_state || ': ' || v_message;
      END;
    END IF;
    RETURN NEXT;
  END LOOP;
END
$$;

-- 016's gw_close_leased_batch; an item may also carry cached_input_tokens and reasoning_tokens.
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
      credits_charged numeric, billing text, usage_source text, error text, now bigint,
      cached_input_tokens numeric, reasoning_tokens numeric)
    ORDER BY a.ord
  LOOP
    v_charge := LEAST(item.credits_charged, item.maximum);
    UPDATE inference_requests r SET
      status = item.status, offer_id = item.offer_id, maximum_credits = item.maximum,
      tariff_version = item.tariff_version, input_tokens = item.input_tokens,
      output_tokens = item.output_tokens,
      cached_input_tokens = COALESCE(item.cached_input_tokens, 0),
      reasoning_tokens = COALESCE(item.reasoning_tokens, 0),
      credits_charged = v_charge, billing = item.billing,
      usage_source = item.usage_source, error = item.error, completed_at = item.now,
      settlement_status = CASE WHEN v_charge > 0 THEN 'unsettled' ELSE 'none' END
    WHERE r.id = item.id AND r.status IN ('pending', 'streaming') AND r.leased;
    v_done := FOUND;
    IF NOT v_done THEN
      INSERT INTO inference_requests (id, api_key_id, instance_id, model, model_id, offer_id,
        permit_id, quote_id, stream, status, input_tokens, output_tokens, cached_input_tokens,
        reasoning_tokens, maximum_credits, credits_charged, billing, usage_source,
        tariff_version, error, created_at, completed_at, settlement_status, leased)
      VALUES (item.id, item.api_key_id, item.holder, item.model, item.model_id, item.offer_id,
        item.permit_id, item.quote_id, item.stream, item.status, item.input_tokens,
        item.output_tokens, COALESCE(item.cached_input_tokens, 0),
        COALESCE(item.reasoning_tokens, 0), item.maximum, v_charge, item.billing, item.usage_source,
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

-- 011's rule: every gw_* function plans each call (test/false-capacity.test.ts checks it).
ALTER FUNCTION gw_close_request(text, text, numeric, numeric, numeric, text, text, text, bigint,
  bigint, numeric, numeric) SET plan_cache_mode = force_custom_plan;
ALTER FUNCTION gw_close_batch(jsonb) SET plan_cache_mode = force_custom_plan;
ALTER FUNCTION gw_close_leased_batch(jsonb) SET plan_cache_mode = force_custom_plan;

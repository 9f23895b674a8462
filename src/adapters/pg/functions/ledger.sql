-- The per-request ledger (issue 5 onwards; docs/decisions/chat-quotes-and-money.md "reserve and finalize"): each
-- function is ONE round trip that commits on its own. This file holds the current definition of
-- each; migrate() re-applies every file of this directory after the pending migrations, on every
-- start (CREATE OR REPLACE; a signature change drops the old one here too).
--
-- All of them rely on READ COMMITTED: a conditional UPDATE that waited on a row lock re-checks
-- its WHERE clause on the row's newest version (EvalPlanQual), so two processes can never both
-- pass a check that only one of them fits. A refusal raises `gw:<reason>`, which rolls back
-- everything the call did. Lock order everywhere: quote, request, offers (ascending id), permit,
-- authorization ledger (a capped request's, migration 030; nothing else locks that row: a
-- revocation writes permit_authorizations only, and reads of the cap's use take no lock).
--
-- Every plpgsql gw_* function is defined with `SET plan_cache_mode = force_custom_plan`: PL/pgSQL
-- keeps a generic plan for good after five calls, and one made while a table was small stays a
-- sequential scan as it grows (migration 011, test/false-capacity.test.ts checks it).

-- The availability rule, its one SQL definition: what a permit can still admit, given what the
-- chain holds for it (deposit, and what has settled on chain) and its ledger row (a missing row
-- reads as zeros). `charged` includes what this gateway has settled; settlements on chain beyond
-- this gateway's (another gateway's, or ours not yet confirmed here) count as spent too. The
-- TypeScript twin is availableCredits (src/domain/permit-balance.ts). An SQL-language, IMMUTABLE
-- function of one expression with each parameter used once and no SET clause, so the planner
-- inlines it: a caller costs what the expression written out did (migrate.test.ts checks it).
CREATE OR REPLACE FUNCTION gw_permit_available(
  p_deposit numeric, p_chain_settled numeric, p_charged numeric, p_settled numeric,
  p_reserved numeric
) RETURNS numeric LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT p_deposit - (p_charged + GREATEST(0, p_chain_settled - p_settled)) - p_reserved
$$;

-- 030 added the authorization to gw_reserve's parameters, and 039 the period's start (a new
-- function each time): the old ones go.
DROP FUNCTION IF EXISTS gw_reserve(text, text, text, text, text, text, text, text, boolean, numeric,
  numeric, numeric, numeric, numeric, integer, bigint, jsonb);
DROP FUNCTION IF EXISTS gw_reserve(text, text, text, text, text, text, text, text, boolean, numeric,
  numeric, numeric, numeric, numeric, integer, bigint, jsonb, text, boolean);

-- gw_reserve: admits a request (migrations 005, 006, 007, 016, 030). An internal quote is inserted
-- already used by its request; the offer's and the permit's rows are admitted by their
-- conditional UPDATE first, and only when that finds nothing is a neutral row inserted
-- (`ON CONFLICT DO NOTHING`) and the UPDATE tried once more, so a refusal still means the row
-- exists and its condition fails. `p_now` is NULL from the gateway: created_at is the
-- database's clock (migration 016).
-- Its two admission UPDATEs write gw_permit_available's expression out instead of calling it:
-- they are planned on every call (force_custom_plan), and the planner inlines an SQL function
-- anew at each planning, which measured 10 to 30 us more per call (of about 360). The text
-- written out must be the helper's body, the ledger row's columns for its parameters
-- (migrate.test.ts checks it). Everywhere else the rule is called: PL/pgSQL assignments and
-- conditions (gw_lease_permit) are planned once per session, and the other statements are off
-- the per-request path (a permit's first reservation, a batch's lock pass, switchOffer).
-- p_authorization_id is the authorization that admitted the request, recorded on it (NULL:
-- none recorded). p_capped: it has a total cap, and the maximum is reserved against it too, in
-- its authorization_ledgers row (migration 030), by the same kind of conditional UPDATE, after
-- the permit's (lock order); refused `gw:authorization_cap_exhausted` when the cap less what
-- its requests used and hold cannot cover the maximum. An uncapped request runs exactly the
-- statements it ran before, the request's INSERT carrying the authorization.
-- p_period_start (migration 039, issue 38): the authorization has a periodic cap, and this is
-- the start (Unix seconds, the gateway's clock) of the period the request is admitted in. The
-- same conditional UPDATE also checks the period's cap: a newer period than the row's starts
-- the row's period over (period_reserved and period_used from zero; the open requests of the
-- earlier period no longer count against it), and the request records the period it counts
-- against (the row's, if a process whose clock is behind sends an older start), so that its
-- close charges that period only. Refused `gw:authorization_period_cap_exhausted` when the
-- period's cap, not the total, is what cannot cover the maximum.
CREATE OR REPLACE FUNCTION gw_reserve(
  p_request_id text, p_api_key_id text, p_instance_id text, p_model text, p_model_id text,
  p_offer_id text, p_permit_id text, p_quote_id text, p_stream boolean, p_maximum numeric,
  p_tariff_version numeric, p_input_tokens numeric, p_deposit numeric, p_chain_settled numeric,
  p_max_concurrency integer, p_now bigint, p_quote jsonb, p_authorization_id text,
  p_capped boolean, p_period_start bigint DEFAULT NULL
) RETURNS void LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan AS $$
DECLARE
  v_period_start bigint;
  v_admitted boolean := false;
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'gw_reserve needs READ COMMITTED, not %', current_setting('transaction_isolation');
  END IF;
  -- Lock order everywhere: quote, request, offers (ascending id), permit, authorization.
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
    permit_id, quote_id, stream, status, input_tokens, maximum_credits, tariff_version, created_at,
    authorization_id, authorization_capped, holds_reservation, authorization_period_start)
  VALUES (p_request_id, p_api_key_id, p_instance_id, p_model, p_model_id, p_offer_id,
    p_permit_id, p_quote_id, p_stream, 'pending', p_input_tokens, p_maximum, p_tariff_version,
    COALESCE(p_now, extract(epoch from clock_timestamp())::bigint), p_authorization_id,
    COALESCE(p_capped, false), true, CASE WHEN p_capped THEN p_period_start END);
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
    SELECT p_permit_id WHERE gw_permit_available(p_deposit, p_chain_settled, 0, 0, 0) >= p_maximum
    ON CONFLICT (permit_id) DO NOTHING;
    UPDATE permit_ledgers p SET reserved = p.reserved + p_maximum, updated_at = now()
    WHERE p.permit_id = p_permit_id
      AND p_deposit - (p.charged + GREATEST(0, p_chain_settled - p.settled)) - p.reserved
        >= p_maximum;
    IF NOT FOUND THEN
      RAISE EXCEPTION USING MESSAGE = 'gw:insufficient_credits';
    END IF;
  END IF;
  IF p_capped THEN
    FOR attempt IN 1..2 LOOP
      UPDATE authorization_ledgers l SET
        reserved = l.reserved + p_maximum,
        period_start = CASE
          WHEN p_period_start > l.period_start THEN p_period_start ELSE l.period_start END,
        period_reserved = CASE
          WHEN p_period_start IS NULL THEN l.period_reserved
          WHEN p_period_start > l.period_start THEN p_maximum
          ELSE l.period_reserved + p_maximum END,
        period_used = CASE
          WHEN p_period_start > l.period_start THEN 0 ELSE l.period_used END
      WHERE l.authorization_id = p_authorization_id
        AND (l.total_cap = 0 OR l.total_cap - l.used - l.reserved >= p_maximum)
        AND (l.period_cap = 0 OR l.period_cap - p_maximum >= CASE
          WHEN p_period_start > l.period_start THEN 0
          ELSE l.period_used + l.period_reserved END)
      RETURNING l.period_start INTO v_period_start;
      v_admitted := FOUND;
      EXIT WHEN v_admitted OR attempt = 2;
      -- Its first capped request makes the row (as a permit's first makes its ledger row),
      -- only where the caps could hold this reservation; an authorization without a total or
      -- periodic cap gets none, and a request that says it is capped by one is refused.
      INSERT INTO authorization_ledgers (authorization_id, total_cap, period, period_cap)
      SELECT a.id, a.total_cap, a.period, a.period_cap FROM permit_authorizations a
      WHERE a.id = p_authorization_id AND (a.total_cap > 0 OR a.period_cap > 0)
        AND (a.total_cap = 0 OR a.total_cap >= p_maximum)
        AND (a.period_cap = 0 OR a.period_cap >= p_maximum)
      ON CONFLICT (authorization_id) DO NOTHING;
    END LOOP;
    IF NOT v_admitted THEN
      -- Which cap refused it, read after the fact (no lock: the refusal stands either way): the
      -- period's when the total (if any) could still hold the maximum.
      IF EXISTS (SELECT 1 FROM permit_authorizations a
                 LEFT JOIN authorization_ledgers l ON l.authorization_id = a.id
                 WHERE a.id = p_authorization_id AND a.period_cap > 0
                   AND (a.total_cap = 0
                        OR a.total_cap - COALESCE(l.used, 0) - COALESCE(l.reserved, 0)
                          >= p_maximum)) THEN
        RAISE EXCEPTION USING MESSAGE = 'gw:authorization_period_cap_exhausted';
      END IF;
      RAISE EXCEPTION USING MESSAGE = 'gw:authorization_cap_exhausted';
    END IF;
    IF v_period_start IS DISTINCT FROM p_period_start AND p_period_start IS NOT NULL THEN
      UPDATE inference_requests SET authorization_period_start = v_period_start
      WHERE id = p_request_id;
    END IF;
  END IF;
END
$$;

-- 018 and 026 changed gw_close_request's parameter list (a new function): the old ones go, so one
-- definition stays live.
DROP FUNCTION IF EXISTS gw_close_request(text, text, numeric, numeric, numeric, text, text, text,
  bigint, bigint);
DROP FUNCTION IF EXISTS gw_close_request(text, text, numeric, numeric, numeric, text, text, text,
  bigint, bigint, numeric, numeric);

-- gw_close_request: finalises a request exactly once (the status condition), moving its
-- reservation to a charge clamped to its maximum and releasing its offer slot. With
-- p_orphaned_before set, only a request whose process stopped heartbeating before then (the
-- orphan rule) is closed. A leased request holds no slot and no reservation of its own, so
-- closing it touches no ledger row; only a void close may end one here (its owner's charged
-- close is gw_close_leased_batch). The two usage details default to 0 (migration 018); the
-- provider's claim and the gateway's count (migration 026: `{input_tokens, output_tokens,
-- cached_input_tokens, reasoning_tokens}`, decimal strings) default to NULL: none. A request
-- that holds its maximum against its authorization's total cap (migration 030) gives it back
-- there too, its charge kept as the cap's `used`, after the permit's row (lock order). A close
-- that charges adds the request to inference_charges (migration 031), and the close clears
-- holds_reservation (the orphan rule's index; a leased record never has it).
CREATE OR REPLACE FUNCTION gw_close_request(
  p_request_id text, p_status text, p_input_tokens numeric, p_output_tokens numeric,
  p_credits_charged numeric, p_billing text, p_usage_source text, p_error text, p_now bigint,
  p_orphaned_before bigint, p_cached_input_tokens numeric DEFAULT 0,
  p_reasoning_tokens numeric DEFAULT 0, p_claimed jsonb DEFAULT NULL, p_counted jsonb DEFAULT NULL
) RETURNS TABLE (finalized boolean, credits_charged numeric) LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan AS $$
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
    claimed_input_tokens = (p_claimed->>'input_tokens')::numeric,
    claimed_output_tokens = (p_claimed->>'output_tokens')::numeric,
    claimed_cached_input_tokens = (p_claimed->>'cached_input_tokens')::numeric,
    claimed_reasoning_tokens = (p_claimed->>'reasoning_tokens')::numeric,
    counted_input_tokens = (p_counted->>'input_tokens')::numeric,
    counted_output_tokens = (p_counted->>'output_tokens')::numeric,
    counted_cached_input_tokens = (p_counted->>'cached_input_tokens')::numeric,
    counted_reasoning_tokens = (p_counted->>'reasoning_tokens')::numeric,
    credits_charged = LEAST(p_credits_charged, r.maximum_credits),
    billing = p_billing,
    usage_source = p_usage_source,
    error = p_error,
    completed_at = p_now,
    settlement_status = CASE WHEN LEAST(p_credits_charged, r.maximum_credits) > 0
                             THEN 'unsettled' ELSE 'none' END,
    holds_reservation = false
  WHERE r.id = p_request_id AND r.status IN ('pending', 'streaming')
    AND (p_orphaned_before IS NULL OR GREATEST(
          (SELECT g.heartbeat_at FROM gateway_instances g WHERE g.instance_id = r.instance_id),
          r.created_at) < p_orphaned_before)
  RETURNING r.id, r.permit_id, r.offer_id, r.maximum_credits, r.credits_charged, r.leased,
    r.authorization_id, r.authorization_capped, r.authorization_period_start INTO closed;
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
  IF closed.authorization_capped THEN
    -- A request admitted in an earlier period than the row's (migration 039) leaves the current
    -- period alone: the rollover already started it from zero without it.
    UPDATE authorization_ledgers
      SET reserved = reserved - closed.maximum_credits, used = used + closed.credits_charged,
        period_reserved = CASE WHEN period_start = closed.authorization_period_start
          THEN period_reserved - closed.maximum_credits ELSE period_reserved END,
        period_used = CASE WHEN period_start = closed.authorization_period_start
          THEN period_used + closed.credits_charged ELSE period_used END
      WHERE authorization_id = closed.authorization_id;
    IF NOT FOUND THEN
      RAISE EXCEPTION 'ledger inconsistency: authorization ledger % is missing',
        closed.authorization_id;
    END IF;
  END IF;
  IF closed.credits_charged > 0 THEN
    INSERT INTO inference_charges (request_id, permit_id, offer_id, completed_at)
    VALUES (closed.id, closed.permit_id, closed.offer_id, p_now);
  END IF;
  RETURN QUERY SELECT true, closed.credits_charged;
END
$$;

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
CREATE OR REPLACE FUNCTION gw_void_reservation(
  p_request_id text, p_api_key_id text, p_instance_id text, p_model text, p_model_id text,
  p_offer_id text, p_permit_id text, p_quote_id text, p_stream boolean, p_maximum numeric,
  p_tariff_version numeric, p_error text, p_now bigint
) RETURNS TABLE (finalized boolean, credits_charged numeric) LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan AS $$
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

-- Group commit for the per-request ledger (migration 006, src/adapters/pg/batcher.ts): one call
-- runs many reservations (closes) in ONE transaction, each item in its own subtransaction that
-- calls the single function, so a refusal or error of one item rolls back that item only.
-- Before its first item a batch takes every row lock its items will need, class by class in
-- the global lock order, each class in ascending key order (COLLATE "C"); migration 006 says
-- why in full (lock order, plain UPDATEs instead of FOR UPDATE to avoid MultiXacts, at most 64
-- items for the subtransaction cache).

-- p_items: a JSON array of objects with gw_reserve's arguments, named without the `p_`:
-- request_id, api_key_id, instance_id, model, model_id, offer_id, permit_id, quote_id, stream,
-- maximum, tariff_version, input_tokens, deposit, chain_settled, max_concurrency, now, quote,
-- authorization_id, capped, period_start (migration 039)
-- (amounts as decimal strings; quote as the JSON text of a `quotes` row, or null). One row per
-- item: idx (1-based position in p_items) and outcome: 'ok', the refusal
-- ('quote_used' | 'offer_at_capacity' | 'insufficient_credits' | 'authorization_cap_exhausted'
-- | 'authorization_period_cap_exhausted'),
-- or 'error:<sqlstate>: <message>'.
-- Named gw_reserve_batch before (migration 006 to issue 21): the old name goes, so that exactly
-- one definition starts with "gw_reserve".
DROP FUNCTION IF EXISTS gw_reserve_batch(jsonb);

CREATE OR REPLACE FUNCTION gw_batch_reserve(p_items jsonb)
RETURNS TABLE (idx integer, outcome text) LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan AS $$
DECLARE
  item record;
  v_key text;
  locked_quotes text[] := '{}';
  v_state text;
  v_message text;
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'gw_batch_reserve needs READ COMMITTED, not %', current_setting('transaction_isolation');
  END IF;
  IF jsonb_typeof(p_items) IS DISTINCT FROM 'array' THEN
    RAISE EXCEPTION 'gw_batch_reserve: p_items must be a JSON array';
  END IF;

  -- 1. The stored quotes the items consume (an internal quote is a fresh row of its item's).
  FOR v_key IN
    SELECT DISTINCT (e->>'quote_id') COLLATE "C" FROM jsonb_array_elements(p_items) e
    WHERE e->>'quote' IS NULL ORDER BY 1
  LOOP
    UPDATE quotes q SET used_by = q.used_by WHERE q.quote_id = v_key;
    IF FOUND THEN
      locked_quotes := locked_quotes || v_key;
    END IF;
  END LOOP;

  -- 2. The offers' rows, inserted neutral where missing.
  FOR v_key IN
    SELECT DISTINCT (e->>'offer_id') COLLATE "C" FROM jsonb_array_elements(p_items) e
    WHERE (e->>'max_concurrency')::integer >= 1 ORDER BY 1
  LOOP
    INSERT INTO offer_loads (offer_id, in_flight) VALUES (v_key, 0)
    ON CONFLICT (offer_id) DO NOTHING;
    IF NOT FOUND THEN
      UPDATE offer_loads l SET in_flight = l.in_flight WHERE l.offer_id = v_key;
    END IF;
  END LOOP;

  -- 3. The permits' rows that gw_reserve may write, inserted neutral where missing.
  FOR v_key IN
    SELECT DISTINCT (e->>'permit_id') COLLATE "C" FROM jsonb_array_elements(p_items) e
    WHERE (e->>'max_concurrency')::integer >= 1
      AND gw_permit_available((e->>'deposit')::numeric, (e->>'chain_settled')::numeric, 0, 0, 0)
        >= (e->>'maximum')::numeric
    ORDER BY 1
  LOOP
    INSERT INTO permit_ledgers (permit_id) VALUES (v_key) ON CONFLICT (permit_id) DO NOTHING;
    IF NOT FOUND THEN
      UPDATE permit_ledgers p SET reserved = p.reserved WHERE p.permit_id = v_key;
    END IF;
  END LOOP;

  -- 3b. The authorization ledgers of the capped items (migration 030), made where missing.
  FOR v_key IN
    SELECT DISTINCT (e->>'authorization_id') COLLATE "C" FROM jsonb_array_elements(p_items) e
    WHERE (e->>'capped')::boolean AND (e->>'max_concurrency')::integer >= 1 ORDER BY 1
  LOOP
    INSERT INTO authorization_ledgers (authorization_id, total_cap, period, period_cap)
    SELECT a.id, a.total_cap, a.period, a.period_cap FROM permit_authorizations a
    WHERE a.id = v_key AND (a.total_cap > 0 OR a.period_cap > 0)
    ON CONFLICT (authorization_id) DO NOTHING;
    IF NOT FOUND THEN
      UPDATE authorization_ledgers l SET reserved = l.reserved WHERE l.authorization_id = v_key;
    END IF;
  END LOOP;

  -- 4. The items, in order, each in its own subtransaction.
  FOR item IN
    SELECT a.ord::integer AS i, r.*
    FROM jsonb_array_elements(p_items) WITH ORDINALITY AS a(e, ord)
    CROSS JOIN LATERAL jsonb_to_record(a.e) AS r(
      request_id text, api_key_id text, instance_id text, model text, model_id text,
      offer_id text, permit_id text, quote_id text, stream boolean, maximum numeric,
      tariff_version numeric, input_tokens numeric, deposit numeric, chain_settled numeric,
      max_concurrency integer, now bigint, quote text, authorization_id text, capped boolean,
      period_start bigint)
    ORDER BY a.ord
  LOOP
    idx := item.i;
    IF item.quote IS NULL AND NOT (item.quote_id = ANY (locked_quotes)) THEN
      outcome := 'quote_used';
    ELSE
      BEGIN
        PERFORM gw_reserve(item.request_id, item.api_key_id, item.instance_id, item.model,
          item.model_id, item.offer_id, item.permit_id, item.quote_id, item.stream, item.maximum,
          item.tariff_version, item.input_tokens, item.deposit, item.chain_settled,
          item.max_concurrency, item.now, item.quote::jsonb, item.authorization_id,
          COALESCE(item.capped, false), item.period_start);
        outcome := 'ok';
      EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT;
        outcome := CASE
          WHEN v_message IN ('gw:quote_used', 'gw:offer_at_capacity', 'gw:insufficient_credits',
            'gw:authorization_cap_exhausted', 'gw:authorization_period_cap_exhausted')
            THEN substr(v_message, 4)
          ELSE 'error:' || v_state || ': ' || v_message
        END;
      END;
    END IF;
    RETURN NEXT;
  END LOOP;
END
$$;

-- p_items: a JSON array of objects with gw_close_request's arguments but the orphan rule, named
-- without the `p_`: request_id, status, input_tokens, output_tokens, credits_charged, billing,
-- usage_source, error, now. One row per item: idx (1-based), and either finalized and
-- credits_charged as gw_close_request returns them with error null, or error
-- '<sqlstate>: <message>' with the other two null.
-- An item may also carry cached_input_tokens and reasoning_tokens (migration 018), claimed and
-- counted (migration 026; JSON objects as gw_close_request's p_claimed and p_counted).
CREATE OR REPLACE FUNCTION gw_close_batch(p_items jsonb)
RETURNS TABLE (idx integer, finalized boolean, credits_charged numeric, error text)
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan AS $$
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
  -- 3b. The authorization ledgers their capped reservations hold (migration 030).
  FOR v_key IN
    SELECT DISTINCT r.authorization_id COLLATE "C" FROM inference_requests r
    WHERE r.id = ANY (open_ids) AND r.authorization_capped
    ORDER BY 1
  LOOP
    UPDATE authorization_ledgers l SET reserved = l.reserved WHERE l.authorization_id = v_key;
  END LOOP;

  -- 4. The items, in order, each in its own subtransaction.
  FOR item IN
    SELECT a.ord::integer AS i, r.*
    FROM jsonb_array_elements(p_items) WITH ORDINALITY AS a(e, ord)
    CROSS JOIN LATERAL jsonb_to_record(a.e) AS r(
      request_id text, status text, input_tokens numeric, output_tokens numeric,
      credits_charged numeric, billing text, usage_source text, error text, now bigint,
      cached_input_tokens numeric, reasoning_tokens numeric, claimed jsonb, counted jsonb)
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
          item.now, NULL, item.cached_input_tokens, item.reasoning_tokens, item.claimed,
          item.counted) c;
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

-- Reservation leases (migration 010; docs/decisions/chat-quotes-and-money.md "Reservation leases"): a gateway process
-- takes credits of a permit and slots of an offer in bulk and admits requests against them in
-- memory. A lease counts among the open reservations: permit_ledgers.reserved and
-- offer_loads.in_flight include every lease. Lock order, extending the ledger's: offer_loads
-- and permit_ledgers rows (each class in ascending key order) before the lease rows of the same
-- call, and request rows before all of them.
--
-- Every plpgsql gw_* function is defined with `SET plan_cache_mode = force_custom_plan`: PL/pgSQL
-- keeps a generic plan for good after five calls, and one made while a table was small stays a
-- sequential scan as it grows (migration 011, test/false-capacity.test.ts checks it).

-- Takes credits of a permit for `p_holder`: `p_want` if the permit has that much available,
-- else all that is available if that covers `p_need`, else nothing (the refusal). Returns the
-- credits granted; 0 when refused; -1 when refused now but other holders' leases hold enough
-- that it would fit once they give back what they do not use (they do within about a second
-- of idleness): the caller may ask once more after that. The availability rule is gw_reserve's.
-- `v_available` writes gw_permit_available's body out (migrate.test.ts checks the text). With
-- the helper called there on the record's fields, src/adapters/pg/leases.test.ts ("refuses only
-- when the database refuses to extend") failed in 5 of 8 runs on PostgreSQL 15, and in none of 5
-- with the line written out; test/lease-recall.test.ts failed once either way, so these tests
-- are also timing-sensitive on a loaded machine. Not explained yet: kept written out until it is.
CREATE OR REPLACE FUNCTION gw_lease_permit(
  p_holder text, p_permit_id text, p_need numeric, p_want numeric, p_deposit numeric,
  p_chain_settled numeric
) RETURNS numeric LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan AS $$
DECLARE
  l record;
  v_available numeric;
  v_grant numeric;
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'gw_lease_permit needs READ COMMITTED, not %', current_setting('transaction_isolation');
  END IF;
  IF p_need <= 0 OR p_want < p_need THEN
    RAISE EXCEPTION 'gw_lease_permit: need % and want % are not 0 < need <= want', p_need, p_want;
  END IF;
  SELECT reserved, charged, settled INTO l FROM permit_ledgers WHERE permit_id = p_permit_id FOR UPDATE;
  IF NOT FOUND THEN
    -- A missing row is created only where a fresh permit could cover the need (as gw_reserve).
    IF gw_permit_available(p_deposit, p_chain_settled, 0, 0, 0) < p_need THEN
      RETURN 0;
    END IF;
    INSERT INTO permit_ledgers (permit_id) VALUES (p_permit_id) ON CONFLICT (permit_id) DO NOTHING;
    SELECT reserved, charged, settled INTO l FROM permit_ledgers WHERE permit_id = p_permit_id FOR UPDATE;
  END IF;
  v_available := p_deposit - (l.charged + GREATEST(0, p_chain_settled - l.settled)) - l.reserved;
  IF v_available < p_need THEN
    IF v_available + (SELECT COALESCE(sum(credits), 0) FROM permit_leases
                      WHERE permit_id = p_permit_id AND holder <> p_holder) >= p_need THEN
      RETURN -1;
    END IF;
    RETURN 0;
  END IF;
  v_grant := LEAST(p_want, v_available);
  UPDATE permit_ledgers SET reserved = reserved + v_grant, updated_at = now()
  WHERE permit_id = p_permit_id;
  INSERT INTO permit_leases AS pl (holder, permit_id, credits) VALUES (p_holder, p_permit_id, v_grant)
  ON CONFLICT (holder, permit_id) DO UPDATE SET credits = pl.credits + EXCLUDED.credits;
  RETURN v_grant;
END
$$;

-- Takes slots of an offer for `p_holder`: `p_want`, else all that are free if that covers
-- `p_need`, else none. Returns the slots granted; 0 when refused; -1 as gw_lease_permit.
CREATE OR REPLACE FUNCTION gw_lease_offer(
  p_holder text, p_offer_id text, p_need integer, p_want integer, p_max_concurrency integer
) RETURNS integer LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan AS $$
DECLARE
  v_in_flight integer;
  v_grant integer;
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'gw_lease_offer needs READ COMMITTED, not %', current_setting('transaction_isolation');
  END IF;
  IF p_need <= 0 OR p_want < p_need THEN
    RAISE EXCEPTION 'gw_lease_offer: need % and want % are not 0 < need <= want', p_need, p_want;
  END IF;
  IF p_max_concurrency < p_need THEN
    RETURN 0;
  END IF;
  SELECT in_flight INTO v_in_flight FROM offer_loads WHERE offer_id = p_offer_id FOR UPDATE;
  IF NOT FOUND THEN
    INSERT INTO offer_loads (offer_id, in_flight) VALUES (p_offer_id, 0) ON CONFLICT (offer_id) DO NOTHING;
    SELECT in_flight INTO v_in_flight FROM offer_loads WHERE offer_id = p_offer_id FOR UPDATE;
  END IF;
  IF p_max_concurrency - v_in_flight < p_need THEN
    IF p_max_concurrency - v_in_flight + (SELECT COALESCE(sum(slots), 0) FROM offer_leases
                      WHERE offer_id = p_offer_id AND holder <> p_holder) >= p_need THEN
      RETURN -1;
    END IF;
    RETURN 0;
  END IF;
  v_grant := LEAST(p_want, p_max_concurrency - v_in_flight);
  UPDATE offer_loads SET in_flight = in_flight + v_grant WHERE offer_id = p_offer_id;
  INSERT INTO offer_leases AS ol (holder, offer_id, slots) VALUES (p_holder, p_offer_id, v_grant)
  ON CONFLICT (holder, offer_id) DO UPDATE SET slots = ol.slots + EXCLUDED.slots;
  RETURN v_grant;
END
$$;

-- Gives back `p_credits` of a lease (NULL: all of it, deleting the lease). Returns what was
-- given back; a lease that does not exist (released by the orphan rule) gives back 0.
CREATE OR REPLACE FUNCTION gw_return_permit_lease(p_holder text, p_permit_id text, p_credits numeric)
RETURNS numeric LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan AS $$
DECLARE
  v_credits numeric;
BEGIN
  PERFORM 1 FROM permit_ledgers WHERE permit_id = p_permit_id FOR UPDATE;
  SELECT credits INTO v_credits FROM permit_leases
  WHERE holder = p_holder AND permit_id = p_permit_id FOR UPDATE;
  IF NOT FOUND THEN
    RETURN 0;
  END IF;
  IF p_credits IS NULL OR p_credits >= v_credits THEN
    DELETE FROM permit_leases WHERE holder = p_holder AND permit_id = p_permit_id;
  ELSE
    v_credits := p_credits;
    UPDATE permit_leases SET credits = credits - v_credits
    WHERE holder = p_holder AND permit_id = p_permit_id;
  END IF;
  -- reserved >= 0 is a CHECK: giving back more than the ledger holds fails rather than drifting.
  UPDATE permit_ledgers SET reserved = reserved - v_credits, updated_at = now()
  WHERE permit_id = p_permit_id;
  RETURN v_credits;
END
$$;

-- Gives back `p_slots` of an offer lease (NULL: all of them, deleting the lease).
CREATE OR REPLACE FUNCTION gw_return_offer_lease(p_holder text, p_offer_id text, p_slots integer)
RETURNS integer LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan AS $$
DECLARE
  v_slots integer;
BEGIN
  PERFORM 1 FROM offer_loads WHERE offer_id = p_offer_id FOR UPDATE;
  SELECT slots INTO v_slots FROM offer_leases
  WHERE holder = p_holder AND offer_id = p_offer_id FOR UPDATE;
  IF NOT FOUND THEN
    RETURN 0;
  END IF;
  IF p_slots IS NULL OR p_slots >= v_slots THEN
    DELETE FROM offer_leases WHERE holder = p_holder AND offer_id = p_offer_id;
  ELSE
    v_slots := p_slots;
    UPDATE offer_leases SET slots = slots - v_slots WHERE holder = p_holder AND offer_id = p_offer_id;
  END IF;
  UPDATE offer_loads SET in_flight = in_flight - v_slots WHERE offer_id = p_offer_id;
  RETURN v_slots;
END
$$;

-- Releases every lease of a holder, if it is (still) dead by the orphan rule: its last
-- heartbeat, or its absence, before `p_orphaned_before`. Returns how many leases it released.
-- One transaction per holder: first the holder's open records, each closed void by the orphan
-- rule (gw_close_request: a leased one touches its own row only) so that nothing of it is open
-- once its leases are gone (reconcileOrphans closes them first; this is for those it left,
-- beyond its limit); then offers before permits, each in ascending order. Its open records are
-- found per permit it leases, among that permit's unsettled requests (migration 031: an open
-- record is 'unsettled'; no index names the status).
CREATE OR REPLACE FUNCTION gw_release_holder(p_holder text, p_orphaned_before bigint)
RETURNS integer LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan AS $$
DECLARE
  v_key text;
  v_released integer := 0;
BEGIN
  IF EXISTS (SELECT 1 FROM gateway_instances g
             WHERE g.instance_id = p_holder AND g.heartbeat_at >= p_orphaned_before) THEN
    RETURN 0;
  END IF;
  FOR v_key IN
    SELECT r.id COLLATE "C" FROM permit_leases pl
    JOIN inference_requests r ON r.permit_id = pl.permit_id AND r.settlement_status = 'unsettled'
    WHERE pl.holder = p_holder AND r.instance_id = p_holder AND r.leased
      AND r.status IN ('pending', 'streaming')
    ORDER BY 1
  LOOP
    PERFORM gw_close_request(v_key, 'failed', NULL, NULL, 0, 'void', NULL, 'orphaned',
      extract(epoch from clock_timestamp())::bigint, p_orphaned_before);
  END LOOP;
  FOR v_key IN
    SELECT offer_id COLLATE "C" FROM offer_leases WHERE holder = p_holder ORDER BY 1
  LOOP
    PERFORM gw_return_offer_lease(p_holder, v_key, NULL);
    v_released := v_released + 1;
  END LOOP;
  FOR v_key IN
    SELECT permit_id COLLATE "C" FROM permit_leases WHERE holder = p_holder ORDER BY 1
  LOOP
    PERFORM gw_return_permit_lease(p_holder, v_key, NULL);
    v_released := v_released + 1;
  END LOOP;
  RETURN v_released;
END
$$;

-- Closes leased requests, in one transaction: each request's final state (inserting its row
-- when its record was not written yet), and per (holder, permit) the sum of the charges moved
-- out of the lease into `charged`. Exactly once per request: a request already final is left
-- as it is (finalized false, its stored charge), and so is a second item of the same request in
-- one batch. A lease that cannot cover the charges (it was released by the orphan rule: the
-- holder was taken for dead) charges them nothing: those requests are closed void, as the
-- orphan rule would have closed them.
--
-- p_items: a JSON array of objects: id, api_key_id, holder, model, model_id, offer_id,
-- permit_id, quote_id, stream, maximum, tariff_version, created_at, authorization_id (the
-- record; a request capped by its authorization's total is never leased), and status,
-- input_tokens, output_tokens, credits_charged, billing, usage_source, error, now (the close).
-- One row per item: idx (1-based), finalized, credits_charged.
-- created_at of a record its close writes first is the database's clock (migration 016); an
-- item may also carry cached_input_tokens and reasoning_tokens (migration 018), claimed and
-- counted (migration 026; JSON objects as gw_close_request's p_claimed and p_counted).
--
-- Set-based (issue 35): one UPDATE for every open record of the batch and one INSERT for those
-- not written yet, each planned once per call, instead of two statements planned per item (the
-- per-item planning was most of the close's CPU). The UPDATE is HOT (migration 031: no index of
-- the table names a column it changes); a charged close adds its row to inference_charges.
CREATE OR REPLACE FUNCTION gw_close_leased_batch(p_items jsonb)
RETURNS TABLE (idx integer, finalized boolean, credits_charged numeric) LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan AS $$
DECLARE
  v_group record;
  v_ids text[];
  v_holders text[];
  v_permits text[];
  v_offers text[];
  v_nows bigint[];
  v_charges numeric[];
  v_done text[];
  v_finalized boolean[];
  v_n integer;
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'gw_close_leased_batch needs READ COMMITTED, not %', current_setting('transaction_isolation');
  END IF;
  SELECT array_agg(r.id ORDER BY a.ord), array_agg(r.holder ORDER BY a.ord),
    array_agg(r.permit_id ORDER BY a.ord), array_agg(r.offer_id ORDER BY a.ord),
    array_agg(r.now ORDER BY a.ord), array_agg(LEAST(r.credits_charged, r.maximum) ORDER BY a.ord)
  INTO v_ids, v_holders, v_permits, v_offers, v_nows, v_charges
  FROM jsonb_array_elements(p_items) WITH ORDINALITY AS a(e, ord)
  CROSS JOIN LATERAL jsonb_to_record(a.e) AS r(id text, holder text, permit_id text,
    offer_id text, now bigint, credits_charged numeric, maximum numeric);
  v_n := COALESCE(array_length(v_ids, 1), 0);
  IF v_n = 0 THEN
    RETURN;
  END IF;

  -- 1. The requests: the open records closed, the missing ones inserted final (the first item
  -- of each id). Fresh ids of this process: nobody else waits on them but the orphan rule,
  -- which locks a request row only, so the order the rows are locked in does not matter.
  WITH item AS (
    SELECT DISTINCT ON (r.id) r.*, LEAST(r.credits_charged, r.maximum) AS charge
    FROM jsonb_array_elements(p_items) WITH ORDINALITY AS a(e, ord)
    CROSS JOIN LATERAL jsonb_to_record(a.e) AS r(
      id text, api_key_id text, holder text, model text, model_id text, offer_id text,
      permit_id text, quote_id text, stream boolean, maximum numeric, tariff_version numeric,
      created_at bigint, status text, input_tokens numeric, output_tokens numeric,
      credits_charged numeric, billing text, usage_source text, error text, now bigint,
      cached_input_tokens numeric, reasoning_tokens numeric, claimed jsonb, counted jsonb,
      authorization_id text)
    ORDER BY r.id, a.ord
  ), closed AS (
    UPDATE inference_requests r SET
      status = item.status, offer_id = item.offer_id, maximum_credits = item.maximum,
      tariff_version = item.tariff_version, input_tokens = item.input_tokens,
      output_tokens = item.output_tokens,
      cached_input_tokens = COALESCE(item.cached_input_tokens, 0),
      reasoning_tokens = COALESCE(item.reasoning_tokens, 0),
      claimed_input_tokens = (item.claimed->>'input_tokens')::numeric,
      claimed_output_tokens = (item.claimed->>'output_tokens')::numeric,
      claimed_cached_input_tokens = (item.claimed->>'cached_input_tokens')::numeric,
      claimed_reasoning_tokens = (item.claimed->>'reasoning_tokens')::numeric,
      counted_input_tokens = (item.counted->>'input_tokens')::numeric,
      counted_output_tokens = (item.counted->>'output_tokens')::numeric,
      counted_cached_input_tokens = (item.counted->>'cached_input_tokens')::numeric,
      counted_reasoning_tokens = (item.counted->>'reasoning_tokens')::numeric,
      credits_charged = item.charge, billing = item.billing,
      usage_source = item.usage_source, error = item.error, completed_at = item.now,
      settlement_status = CASE WHEN item.charge > 0 THEN 'unsettled' ELSE 'none' END
    FROM item
    WHERE r.id = item.id AND r.status IN ('pending', 'streaming') AND r.leased
    RETURNING r.id
  ), written AS (
    INSERT INTO inference_requests (id, api_key_id, instance_id, model, model_id, offer_id,
      permit_id, quote_id, stream, status, input_tokens, output_tokens, cached_input_tokens,
      reasoning_tokens, claimed_input_tokens, claimed_output_tokens,
      claimed_cached_input_tokens, claimed_reasoning_tokens, counted_input_tokens,
      counted_output_tokens, counted_cached_input_tokens, counted_reasoning_tokens,
      maximum_credits, credits_charged, billing, usage_source,
      tariff_version, error, created_at, completed_at, settlement_status, leased,
      authorization_id)
    SELECT item.id, item.api_key_id, item.holder, item.model, item.model_id, item.offer_id,
      item.permit_id, item.quote_id, item.stream, item.status, item.input_tokens,
      item.output_tokens, COALESCE(item.cached_input_tokens, 0),
      COALESCE(item.reasoning_tokens, 0), (item.claimed->>'input_tokens')::numeric,
      (item.claimed->>'output_tokens')::numeric,
      (item.claimed->>'cached_input_tokens')::numeric,
      (item.claimed->>'reasoning_tokens')::numeric, (item.counted->>'input_tokens')::numeric,
      (item.counted->>'output_tokens')::numeric,
      (item.counted->>'cached_input_tokens')::numeric,
      (item.counted->>'reasoning_tokens')::numeric, item.maximum, item.charge, item.billing,
      item.usage_source,
      item.tariff_version, item.error, extract(epoch from clock_timestamp())::bigint, item.now,
      CASE WHEN item.charge > 0 THEN 'unsettled' ELSE 'none' END, true, item.authorization_id
    FROM item
    WHERE NOT EXISTS (SELECT 1 FROM closed WHERE closed.id = item.id)
    ORDER BY item.id
    ON CONFLICT (id) DO NOTHING
    RETURNING id
  )
  SELECT COALESCE(array_agg(d.id), '{}') INTO v_done
  FROM (SELECT id FROM closed UNION ALL SELECT id FROM written) d;

  v_finalized := array_fill(false, ARRAY[v_n]);
  FOR i IN 1 .. v_n LOOP
    IF v_ids[i] = ANY (v_done) AND array_position(v_ids, v_ids[i]) = i THEN
      v_finalized[i] := true;
    ELSE
      -- A new statement, so a new snapshot: it sees a close that committed meanwhile.
      v_charges[i] := COALESCE(
        (SELECT r.credits_charged FROM inference_requests r WHERE r.id = v_ids[i]), 0);
    END IF;
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
      FOR i IN 1 .. v_n LOOP
        IF i = ANY (v_group.ords) THEN
          v_charges[i] := 0;
        END IF;
      END LOOP;
    END IF;
  END LOOP;

  -- 3. The charges, for receipts and earnings (migration 031).
  INSERT INTO inference_charges (request_id, permit_id, offer_id, completed_at)
  SELECT c.id, c.permit_id, c.offer_id, c.now
  FROM unnest(v_ids, v_permits, v_offers, v_nows, v_charges, v_finalized)
    AS c(id, permit_id, offer_id, now, charge, done)
  WHERE c.done AND c.charge > 0;

  RETURN QUERY SELECT c.ord::integer, c.done, c.charge
    FROM unnest(v_finalized, v_charges) WITH ORDINALITY AS c(done, charge, ord)
    ORDER BY c.ord;
END
$$;

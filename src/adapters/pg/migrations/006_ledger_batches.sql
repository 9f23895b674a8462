-- Group commit for the two per-request ledger transactions of migration 005: one call of
-- gw_reserve_batch (gw_close_batch) runs many reservations (finalisations) in ONE transaction,
-- so they share one round trip and one COMMIT. Every request of one permit and one offer locks
-- the same two rows until COMMIT, so with one transaction per request the rows admit at most
-- one request per commit; a batch of N admits N per commit. The gateway sends as a batch
-- whatever queued while its previous batch was in flight (src/adapters/pg/batcher.ts); a batch
-- of one, as every request is when unloaded, goes to the single function instead.
--
-- Each request keeps its own semantics. Items run in array order, each in its own
-- subtransaction (a PL/pgSQL block with an EXCEPTION clause) that calls the single function
-- (gw_reserve, gw_close_request), so a refusal or any other error of one item rolls back that
-- item only, as if it had been its own transaction; the others commit together when the call
-- returns. A failure of the whole call (lost connection, cancelled statement: `WHEN OTHERS`
-- does not catch query_canceled) leaves every item's outcome unknown, as for a single call.
--
-- Both rely on READ COMMITTED, as 005 does (every statement sees what committed before it
-- began, and a write that waited for a row lock re-checks its WHERE on the row's newest
-- version), and refuse to run under another level.
--
-- ## Lock order
--
-- The single calls lock in one global order: quote, request, offer_loads rows (ascending offer
-- id), permit_ledgers row. switchOffer follows it too (request, both offers ascending, permit);
-- reconcileOrphans closes each orphan with gw_close_request; markStreaming and heartbeat write
-- one row each (nothing in src/ settles yet; the property test's settlement writes one permit
-- row, which cannot close a cycle either). A batch that ran its items one by one would take
-- several offers' and permits' locks interleaved (item 1: offer B, permit Q; item 2: offer A,
-- permit P) and could deadlock with another batch or a single call that takes them in the
-- other order. So before its first item, a batch takes every row lock its
-- items will need, class by class in the global order, each class in ascending key order (byte
-- order, COLLATE "C", as switchOffer compares ids in JavaScript), one row at a time:
--
--   reserve: the stored quotes the items consume; the offers' rows; the permits' rows.
--   close:   the open requests;                    the offers' rows; the permits' rows.
--
-- A row that does not exist yet cannot be locked, and inserting it when an item gets to it
-- would lock it out of order. So the rows a reservation may create are created first, in the
-- same pass, as neutral rows: an offer_loads row with in_flight 0 (what a missing row means to
-- every reader: catalog.ts reads COALESCE(in_flight, 0)), and a permit_ledgers row with
-- reserved, charged and settled 0 (the defaults of 004; permitLedger and availableCredits read
-- a missing row as zeros). A permit row is created and locked only when some item's deposit
-- could cover its maximum on a fresh permit, which is when gw_reserve creates one; when no
-- item's can, no item's condition can hold on an existing row either (charged >= settled, so
-- charged + max(0, chain_settled - settled) >= max(0, chain_settled)), and an UPDATE whose
-- WHERE fails on the row neither waits for nor locks it. An offer row is made only for items
-- whose offer admits anything (max_concurrency >= 1); the others are refused before gw_reserve
-- touches offer_loads. A neutral row stays behind when its items are refused, which changes
-- nothing anyone reads.
--
-- After that, an item only writes rows its batch holds, or rows nobody else can be waiting for:
-- - a reservation inserts its request row and its internal quote, fresh random ids that no
--   other transaction can name before this one commits (the only wait on an uncommitted insert
--   is another insert of the same key; an id that is already committed fails the item with a
--   unique violation at once);
-- - a reservation that consumes a stored quote runs only if the batch locked that quote; a quote
--   missing when the batch locked the quotes is refused as `quote_used` without touching it,
--   which is what gw_reserve answers for a missing quote (one brought by an earlier item of the
--   batch is used by that item, so it is used either way);
-- - a close runs only for a request the batch locked while it was open; any other is answered
--   `finalized = false`, as gw_close_request answers a request that is final or missing. A
--   request that turns up open only after the batch began is one whose reservation committed
--   after this close started: a single close at that moment would not have seen it either.
-- So every transaction that waits for a lock holds only locks earlier in the order than the one
-- it waits for, and no cycle of waits can form.
--
-- ## Why plain UPDATEs, and gw_reserve without upserts
--
-- The batch locks a row by writing it (a no-op UPDATE, or the neutral INSERT), not with SELECT
-- ... FOR UPDATE, and gw_reserve is redefined below to admit with plain conditional UPDATEs
-- instead of `INSERT ... ON CONFLICT DO UPDATE`. Both for the same reason: an explicit row lock
-- (FOR UPDATE, or the one ON CONFLICT DO UPDATE takes before it updates) is carried over to the
-- new version of the row the same transaction then writes, and when a later subtransaction
-- writes that version, PostgreSQL must record the lock and the update together as a MultiXact:
-- one per item per row, which costs a WAL record and SLRU space each and brings on
-- anti-wraparound vacuums. A row written by this transaction and then by each item in turn
-- carries no lock, so no MultiXact is made.
--
-- ## Batch size
--
-- Every item that writes and commits takes a subtransaction id, and a backend keeps at most 64
-- of them in shared memory (PGPROC_MAX_CACHED_SUBXIDS); beyond that every snapshot in the server
-- becomes "suboverflowed" and slower until the transaction ends. Refused items' subtransactions
-- are rolled back and drop out of that cache. The gateway therefore sends at most 64 items.

-- The same admission as in 005 (same arguments, checks in the same order, same refusals, the
-- same rows written, a missing permit row created only when a fresh permit could hold the
-- reservation), with each limiting row written by a plain conditional UPDATE: a missing row is
-- first inserted neutral (`ON CONFLICT DO NOTHING` leaves an existing row unlocked; it may wait
-- for a transaction writing that row, at the point of the lock order where the upsert waited),
-- and a refusal rolls that insert back with the rest. Under READ COMMITTED the UPDATE, a new
-- statement, sees a row another transaction committed meanwhile, and one that waited for the
-- row's lock re-checks its WHERE on the newest version, as the upsert's WHERE was.
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
  INSERT INTO offer_loads (offer_id, in_flight) VALUES (p_offer_id, 0)
  ON CONFLICT (offer_id) DO NOTHING;
  UPDATE offer_loads SET in_flight = in_flight + 1
  WHERE offer_id = p_offer_id AND in_flight < p_max_concurrency;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING MESSAGE = 'gw:offer_at_capacity';
  END IF;
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
END
$$;

-- p_items: a JSON array of objects with gw_reserve's arguments, named without the `p_`:
-- request_id, api_key_id, instance_id, model, model_id, offer_id, permit_id, quote_id, stream,
-- maximum, tariff_version, input_tokens, deposit, chain_settled, max_concurrency, now, quote
-- (amounts as decimal strings; quote as the JSON text of a `quotes` row, or null). One row per
-- item: idx (1-based position in p_items) and outcome: 'ok', the refusal
-- ('quote_used' | 'offer_at_capacity' | 'insufficient_credits'), or 'error:<sqlstate>: <message>'.
CREATE FUNCTION gw_reserve_batch(p_items jsonb)
RETURNS TABLE (idx integer, outcome text) LANGUAGE plpgsql AS $$
DECLARE
  item record;
  v_key text;
  locked_quotes text[] := '{}';
  v_state text;
  v_message text;
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'gw_reserve_batch needs READ COMMITTED, not %', current_setting('transaction_isolation');
  END IF;
  IF jsonb_typeof(p_items) IS DISTINCT FROM 'array' THEN
    RAISE EXCEPTION 'gw_reserve_batch: p_items must be a JSON array';
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
      AND (e->>'deposit')::numeric - GREATEST(0, (e->>'chain_settled')::numeric)
        >= (e->>'maximum')::numeric
    ORDER BY 1
  LOOP
    INSERT INTO permit_ledgers (permit_id) VALUES (v_key) ON CONFLICT (permit_id) DO NOTHING;
    IF NOT FOUND THEN
      UPDATE permit_ledgers p SET reserved = p.reserved WHERE p.permit_id = v_key;
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
      max_concurrency integer, now bigint, quote text)
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
          item.max_concurrency, item.now, item.quote::jsonb);
        outcome := 'ok';
      EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT;
        outcome := CASE
          WHEN v_message IN ('gw:quote_used', 'gw:offer_at_capacity', 'gw:insufficient_credits')
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
CREATE FUNCTION gw_close_batch(p_items jsonb)
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
      credits_charged numeric, billing text, usage_source text, error text, now bigint)
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
          item.now, NULL) c;
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

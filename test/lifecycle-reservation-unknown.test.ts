import { afterAll, beforeAll, expect, it } from "vitest";
import { describeIfPostgres } from "./helpers/db.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { offerInFlight } from "./helpers/ledger.js";
import { openPermit } from "./helpers/market.js";
import { authed, eventually, json, startChatStack, type TestStack } from "./helpers/stack.js";

/**
 * A reservation whose answer is lost (issue 19, item 2): the database commits it, but the
 * gateway's query times out first (client-side `DB_QUERY_TIMEOUT_MS` below the server's
 * statement timeout, and a reservation that takes longer than it), so the gateway cannot know
 * it landed. The void close that follows is refused as well (the close functions are renamed
 * away). That close waits in the outbox, and housekeeping writes it once the database takes it
 * again: the payer's credits and the offer's slot come back without a restart.
 *
 * Real PostgreSQL only: PGlite has no query timeouts and its one in-process connection never
 * loses an answer.
 */
describeIfPostgres(
  "a reservation whose outcome is unknown, and whose void close is refused",
  () => {
    let stack: TestStack;
    let fake: FakeUpstream;
    let chatOffer: `0x${string}`;

    beforeAll(async () => {
      ({ stack, fake, chatOffer } = await startChatStack({
        PERMIT_CACHE_MS: "0",
        // Every request reserves alone (gw_reserve), as one with a quote or a key does.
        RESERVATION_LEASES: "false",
        DB_STATEMENT_TIMEOUT_MS: "5000",
        DB_QUERY_TIMEOUT_MS: "700",
        HOUSEKEEPING_INTERVAL_MS: "200",
      }));
    });
    afterAll(async () => {
      await fake?.stop();
      await stack?.close();
    });

    const pool = () => stack.database.db.pool;
    const reserveArgs =
      "text, text, text, text, text, text, text, text, boolean, numeric, numeric, numeric, numeric, numeric, integer, bigint, jsonb, text, boolean, bigint";
    const closeFunctions = async (suffix: "" | "_off", to: "" | "_off") => {
      for (const name of ["gw_close_request", "gw_close_batch", "gw_close_leased_batch"]) {
        await pool().query(`ALTER FUNCTION ${name}${suffix} RENAME TO ${name}${to}`);
      }
    };
    /** gw_reserve that commits its reservation, but only after the gateway gave up waiting. */
    const slowReserve = async () => {
      await pool().query(`ALTER FUNCTION gw_reserve(${reserveArgs}) RENAME TO gw_reserve_real`);
      await pool().query(`
      CREATE FUNCTION gw_reserve(
        p_request_id text, p_api_key_id text, p_instance_id text, p_model text, p_model_id text,
        p_offer_id text, p_permit_id text, p_quote_id text, p_stream boolean, p_maximum numeric,
        p_tariff_version numeric, p_input_tokens numeric, p_deposit numeric,
        p_chain_settled numeric, p_max_concurrency integer, p_now bigint, p_quote jsonb,
        p_authorization_id text, p_capped boolean, p_period_start bigint DEFAULT NULL
      ) RETURNS void LANGUAGE plpgsql AS $$
      BEGIN
        PERFORM gw_reserve_real(p_request_id, p_api_key_id, p_instance_id, p_model, p_model_id,
          p_offer_id, p_permit_id, p_quote_id, p_stream, p_maximum, p_tariff_version,
          p_input_tokens, p_deposit, p_chain_settled, p_max_concurrency, p_now, p_quote,
          p_authorization_id, p_capped, p_period_start);
        PERFORM pg_sleep(2);
      END
      $$`);
    };
    const fastReserve = async () => {
      await pool().query(`DROP FUNCTION gw_reserve(${reserveArgs})`);
      await pool().query(`ALTER FUNCTION gw_reserve_real(${reserveArgs}) RENAME TO gw_reserve`);
    };
    const ledger = async (permitId: string) => {
      const { rows } = await pool().query<{ reserved: string; charged: string }>(
        "SELECT reserved, charged FROM permit_ledgers WHERE permit_id = $1",
        [permitId],
      );
      return rows[0];
    };
    const openRequests = async (permitId: string) => {
      const { rows } = await pool().query<{ id: string; maximum_credits: string }>(
        "SELECT id, maximum_credits FROM inference_requests WHERE permit_id = $1 AND status = 'pending'",
        [permitId],
      );
      return rows;
    };

    it("releases the credits and the slot after a housekeeping round, without a restart", async () => {
      const deposit = 10n ** 18n;
      const permitId = await openPermit(stack, { deposit });
      const before = await json(await authed(stack, `/v1/permits/${permitId}`));
      expect(before).toMatchObject({ deposit: deposit.toString(), reserved: "0" });
      expect(await offerInFlight(pool(), chatOffer)).toBe(0);

      const upstreamCalls = fake.requests.length;
      await closeFunctions("", "_off");
      await slowReserve();
      let requestId: string;
      let maximum: string;
      try {
        const res = await authed(stack, "/v1/chat/completions", {
          method: "POST",
          headers: { "content-type": "application/json", "x-gateway-permit": permitId },
          body: JSON.stringify({
            model: "demo-chat",
            messages: [{ role: "user", content: "is it there?" }],
            max_tokens: 16,
          }),
        });
        expect(res.status).toBe(503);
        expect((await json(res)).error.code).toBe("database_unavailable");
        expect(fake.requests).toHaveLength(upstreamCalls);
        // The reservation lands after the gateway gave up on it: held, with nothing to close it
        // but the void close the database refused.
        await eventually(async () => (await openRequests(permitId)).length === 1, 10_000);
        [{ id: requestId, maximum_credits: maximum }] = (await openRequests(permitId)) as [
          { id: string; maximum_credits: string },
        ];
        expect(await ledger(permitId)).toEqual({ reserved: maximum, charged: "0" });
        expect(await offerInFlight(pool(), chatOffer)).toBe(1);
        // Rounds meanwhile keep it: the close is still refused.
        await new Promise((r) => setTimeout(r, 600));
        expect((await stack.gateway.housekeeping.runOnce()).closesPending).toBe(1);
      } finally {
        await fastReserve();
        await closeFunctions("_off", "");
      }

      // The database takes closes again: the next round of the running process writes it.
      await eventually(async () => (await ledger(permitId))?.reserved === "0", 10_000);
      expect(await ledger(permitId)).toEqual({ reserved: "0", charged: "0" });
      expect(await offerInFlight(pool(), chatOffer)).toBe(0);
      const { rows } = await pool().query(
        "SELECT status, billing, credits_charged, error, settlement_status FROM inference_requests WHERE id = $1",
        [requestId],
      );
      expect(rows).toEqual([
        {
          status: "failed",
          billing: "void",
          credits_charged: "0",
          error: "reservation failed",
          settlement_status: "none",
        },
      ]);
      const after = await json(await authed(stack, `/v1/permits/${permitId}`));
      expect(after).toMatchObject({ reserved: "0", available: before.available });
      expect((await stack.gateway.housekeeping.runOnce()).closesPending).toBe(0);
    });

    it("releases a reservation that lands after its void close was written", async () => {
      // The database takes every close, so the void close is written at once, while the
      // reservation whose answer was lost is still under way: it must not land afterwards and
      // stay held.
      const deposit = 10n ** 18n;
      const permitId = await openPermit(stack, { deposit });
      const before = await json(await authed(stack, `/v1/permits/${permitId}`));
      const upstreamCalls = fake.requests.length;
      await slowReserve();
      try {
        const res = await authed(stack, "/v1/chat/completions", {
          method: "POST",
          headers: { "content-type": "application/json", "x-gateway-permit": permitId },
          body: JSON.stringify({
            model: "demo-chat",
            messages: [{ role: "user", content: "too late?" }],
            max_tokens: 16,
          }),
        });
        expect(res.status).toBe(503);
        expect((await json(res)).error.code).toBe("database_unavailable");
        expect(fake.requests).toHaveLength(upstreamCalls);
        // Whatever the order, the request ends void and holds nothing.
        const final = async () => {
          const { rows } = await pool().query<{ status: string }>(
            "SELECT status FROM inference_requests WHERE permit_id = $1",
            [permitId],
          );
          return rows.length === 1 && rows[0]!.status === "failed";
        };
        await eventually(
          async () =>
            (await final()) &&
            (await ledger(permitId))?.reserved === "0" &&
            (await offerInFlight(pool(), chatOffer)) === 0,
          10_000,
        );
      } finally {
        await fastReserve();
      }
      const { rows } = await pool().query(
        "SELECT status, billing, credits_charged, error, settlement_status FROM inference_requests WHERE permit_id = $1",
        [permitId],
      );
      expect(rows).toEqual([
        {
          status: "failed",
          billing: "void",
          credits_charged: "0",
          error: "reservation failed",
          settlement_status: "none",
        },
      ]);
      // Nothing lands later either.
      await new Promise((r) => setTimeout(r, 2500));
      expect(await ledger(permitId)).toMatchObject({ reserved: "0", charged: "0" });
      expect(await offerInFlight(pool(), chatOffer)).toBe(0);
      const after = await json(await authed(stack, `/v1/permits/${permitId}`));
      expect(after).toMatchObject({ reserved: "0", available: before.available });
    });
  },
);

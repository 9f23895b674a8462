import { afterAll, beforeAll, expect, it, describe } from "vitest";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { offerInFlight } from "./helpers/ledger.js";
import { openPermit } from "./helpers/market.js";
import { chatOn } from "./helpers/settlement.js";
import { authed, eventually, json, startChatStack, type TestStack } from "./helpers/stack.js";

/**
 * The database refuses every request close for a while (its close functions are renamed away),
 * then takes them again. The gateway answers meanwhile; the closes wait in its outbox and
 * housekeeping writes them: reservation and offer slot released, the charge recorded once, the
 * permit's availability back, without a restart.
 */
describe("request closes refused by the database, then taken", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let chatOffer: `0x${string}`;

  beforeAll(async () => {
    ({ stack, fake, chatOffer } = await startChatStack({ PERMIT_CACHE_MS: "0" }));
  });
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  const closeFunctions = async (suffix: "" | "_off", to: "" | "_off") => {
    for (const name of ["gw_close_request", "gw_close_batch", "gw_close_leased_batch"]) {
      await stack.database.db.pool.query(`ALTER FUNCTION ${name}${suffix} RENAME TO ${name}${to}`);
    }
  };
  const ledger = async (permitId: string) => {
    const { rows } = await stack.database.db.pool.query<{ reserved: string; charged: string }>(
      "SELECT reserved, charged FROM permit_ledgers WHERE permit_id = $1",
      [permitId],
    );
    return rows[0]!;
  };

  it("releases the reservation and slot and records the charge once, once the database is back", async () => {
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    const before = await json(await authed(stack, `/v1/permits/${permitId}`));
    await closeFunctions("", "_off");
    let chat: Awaited<ReturnType<typeof chatOn>> | undefined;
    try {
      const res = await authed(stack, "/v1/chat/completions", {
        method: "POST",
        headers: { "content-type": "application/json", "x-gateway-permit": permitId },
        body: JSON.stringify({
          model: "demo-chat",
          messages: [{ role: "user", content: "hold on" }],
          max_tokens: 16,
        }),
      });
      expect(res.status).toBe(200);
      const charged = BigInt(res.headers.get("x-gateway-credits-charged")!);
      chat = { id: res.headers.get("x-gateway-request-id")!, charged, offerId: chatOffer };
      await res.text();
      // Refused: the credits still held, nothing charged yet.
      await new Promise((r) => setTimeout(r, 1500));
      expect(BigInt((await ledger(permitId)).reserved)).toBeGreaterThan(0n);
      // Its offer slot is free already: the provider is done with it (a leased request's slot
      // is freed when its close starts); only the credits wait for the charge.
      expect((await stack.gateway.housekeeping.runOnce()).closesPending).toBe(1);
    } finally {
      await closeFunctions("_off", "");
    }
    const round = await stack.gateway.housekeeping.runOnce();
    expect(round).toMatchObject({ closesWritten: 1, closesPending: 0, orphans: 0 });
    expect((await ledger(permitId)).charged).toBe(chat.charged.toString());
    // The lease, idle now, goes back within about a second.
    await eventually(
      async () =>
        (await ledger(permitId)).reserved === "0" &&
        (await offerInFlight(stack.database.db.pool, chatOffer)) === 0,
    );
    const record = await json(await authed(stack, `/v1/requests/${chat.id}`));
    expect(record).toMatchObject({ status: "completed", credits_charged: chat.charged.toString() });
    const after = await json(await authed(stack, `/v1/permits/${permitId}`));
    expect(BigInt(after.available)).toBe(BigInt(before.available) - chat.charged);
    // Written once: another round changes nothing.
    await stack.gateway.housekeeping.runOnce();
    expect(await ledger(permitId)).toEqual({ reserved: "0", charged: chat.charged.toString() });
  });
});

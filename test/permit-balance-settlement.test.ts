import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { openPermit } from "./helpers/market.js";
import { chainPermit, chatOn, flush, settlingEnv } from "./helpers/settlement.js";
import { authed, eventually, json, startChatStack, type TestStack } from "./helpers/stack.js";

/**
 * The permit view right after this gateway's own settlement (issue 19, item 11): the flusher
 * drops the cached chain reads of the permits it has just settled, so `settled` (the chain's)
 * and `charged_unsettled` (the ledger's) move together and the four amounts add up to the
 * deposit at once, not only once the indexer sees `ChargeSettled`.
 */
describe("permit balance right after a flush", () => {
  let stack: TestStack;
  let fake: FakeUpstream;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack({
      ...settlingEnv,
      // A permit read is served for a minute, and the indexer (whose ChargeSettled also drops
      // it) does not look again within the test: only the flusher can make the view fresh.
      PERMIT_CACHE_MS: "60000",
      POLL_INTERVAL_MS: "3600000",
    }));
  });
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  const balance = async (permitId: string) => {
    const res = await authed(stack, `/v1/permits/${permitId}`);
    const body = await json(res);
    expect(res.status, JSON.stringify(body)).toBe(200);
    return body as Record<string, string>;
  };
  const sum = (b: Record<string, string>) =>
    BigInt(b.settled!) + BigInt(b.charged_unsettled!) + BigInt(b.reserved!) + BigInt(b.available!);

  it("shows the charge settled and the four amounts adding up to the deposit as soon as the flush answers", async () => {
    const deposit = 10n ** 18n;
    const permitId = await openPermit(stack, { deposit });
    const { charged } = await chatOn(stack, permitId);
    expect(charged).toBeGreaterThan(0n);

    // Before the flush: charged, not settled; the permit's chain read is now cached.
    let before: Record<string, string> = {};
    // (the lease this process held on the permit goes back once it is idle)
    await eventually(async () => {
      before = await balance(permitId);
      return before.reserved === "0";
    });
    expect(before).toMatchObject({
      deposit: deposit.toString(),
      settled: "0",
      charged_unsettled: charged.toString(),
      reserved: "0",
      available: (deposit - charged).toString(),
    });
    expect(sum(before)).toBe(deposit);

    const { status, body } = await flush(stack);
    expect(status).toBe(200);
    expect(body).toMatchObject({
      busy: false,
      settled_requests: 1,
      settled_credits: charged.toString(),
    });
    expect(body.batches).toHaveLength(1);
    expect(body.batches[0]).toMatchObject({ status: "settled", credits: charged.toString() });
    expect((await chainPermit(stack, permitId)).settled).toBe(charged);

    // At once, no waiting: the chain's settled and the ledger's agree.
    const after = await balance(permitId);
    expect(after).toMatchObject({
      state: "open",
      deposit: deposit.toString(),
      settled: charged.toString(),
      charged_unsettled: "0",
      reserved: "0",
      available: (deposit - charged).toString(),
    });
    expect(sum(after)).toBe(deposit);
  });
});

import type { Hex } from "viem";
import { afterAll, beforeAll, expect, it } from "vitest";
import { startGateway, type Gateway } from "../src/app.js";
import { permitLedger } from "../src/adapters/pg/ledger/index.js";
import { describeIfPostgres } from "./helpers/db.js";
import { startFakeUpstream, type FakeUpstream } from "./helpers/fake-upstream.js";
import { onboard, openPermit } from "./helpers/market.js";
import { eventually, json, startTestStack, type TestStack } from "./helpers/stack.js";

describeIfPostgres("two gateway processes sharing one PostgreSQL and one permit", () => {
  let stack: TestStack;
  let second: Gateway;
  let fake: FakeUpstream;
  const K = 4;

  beforeAll(async () => {
    stack = await startTestStack({
      ALLOW_PRIVATE_ENDPOINTS: "true",
      PROBE_INTERVAL_MS: "600000",
      PERMIT_CACHE_MS: "0",
    });
    second = await startGateway(stack.config, {
      logger: stack.logger,
      database: stack.database.db,
    });
    // Slow answers, so that every request of the burst is admitted or refused while the admitted
    // ones still hold their maxima (the gateway charges its own count, below the maximum, so an
    // answer that ended would free credit for a later request).
    fake = await startFakeUpstream({ models: ["demo-chat"], delayMs: 3_000 });
    const chatOffer = stack.demo.offers.find(
      (o) => o.status === "active" && o.modelId === stack.demo.models[0]!.modelId,
    )!.offerId;
    await onboard(stack, chatOffer, fake.url);
  });
  afterAll(async () => {
    await second?.close();
    await fake?.stop();
    await stack?.close();
  });

  it("admits at most K of 10·K concurrent requests when the deposit covers exactly K maxima", async () => {
    const body = JSON.stringify({
      model: "demo-chat",
      messages: [{ role: "user", content: "race" }],
      max_tokens: 8,
    });
    const quote = await json(
      await fetch(`${stack.gateway.url}/v1/quotes`, {
        method: "POST",
        headers: { authorization: `Bearer ${stack.apiKey}`, "content-type": "application/json" },
        body,
      }),
    );
    const maximum = BigInt(quote.maximum_credits);
    fake.setOptions({ usage: { prompt_tokens: 1_000_000, completion_tokens: 1_000_000 } });
    const permitId: Hex = await openPermit(stack, { deposit: maximum * BigInt(K) });

    let peak = 0n;
    let watching = true;
    const watcher = (async () => {
      while (watching) {
        const ledger = await permitLedger(stack.database.db.pool, permitId);
        if (ledger.charged + ledger.reserved > peak) peak = ledger.charged + ledger.reserved;
        await new Promise((r) => setTimeout(r, 5));
      }
    })();

    const bases = [stack.gateway.url, second.url];
    const results = await Promise.all(
      Array.from({ length: 10 * K }, (_, i) =>
        fetch(`${bases[i % 2]}/v1/chat/completions`, {
          method: "POST",
          headers: {
            authorization: `Bearer ${stack.apiKey}`,
            "content-type": "application/json",
            "x-gateway-permit": permitId,
          },
          body,
        }).then(async (res) => ({ status: res.status, body: await json(res) })),
      ),
    );
    watching = false;
    await watcher;

    const admitted = results.filter((r) => r.status === 200);
    const refused = results.filter((r) => r.status !== 200);
    expect(admitted.length).toBeGreaterThan(0);
    expect(admitted.length).toBeLessThanOrEqual(K);
    expect(
      refused.every((r) => r.status === 402 && r.body.error.code === "insufficient_credits"),
    ).toBe(true);
    // An answer goes out before its charge is committed (src/domain/chat/call.ts), and a
    // finalisation may wait for the batch in flight before it: let the last commits land.
    let ledger = await permitLedger(stack.database.db.pool, permitId);
    for (const until = Date.now() + 5_000; ledger.reserved !== 0n && Date.now() < until;) {
      await new Promise((r) => setTimeout(r, 10));
      ledger = await permitLedger(stack.database.db.pool, permitId);
    }
    expect(ledger.reserved).toBe(0n);
    expect(ledger.charged).toBeLessThanOrEqual(maximum * BigInt(admitted.length));
    expect(ledger.charged).toBeLessThanOrEqual(maximum * BigInt(K));
    expect(peak).toBeLessThanOrEqual(maximum * BigInt(K));
    const { rows } = await stack.database.db.pool.query<{ total: string }>(
      "SELECT COALESCE(sum(credits_charged), 0)::text AS total FROM inference_requests WHERE permit_id = $1",
      [permitId],
    );
    expect(BigInt(rows[0]!.total)).toBe(ledger.charged);

    // No credit stranded: once the burst's leases are given back, a sequential run alternating
    // between the processes spends the rest of the deposit, to within one request's maximum.
    await eventually(
      async () => (await permitLedger(stack.database.db.pool, permitId)).reserved === 0n,
    );
    fake.setOptions({ delayMs: 0 });
    let last: { status: number; body: unknown } | undefined;
    for (let i = 0; i < 100 * K; i++) {
      const res = await fetch(`${bases[i % 2]}/v1/chat/completions`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${stack.apiKey}`,
          "content-type": "application/json",
          "x-gateway-permit": permitId,
        },
        body,
      });
      last = { status: res.status, body: await json(res) };
      if (res.status !== 200) break;
    }
    expect(last).toMatchObject({ status: 402, body: { error: { code: "insufficient_credits" } } });
    await eventually(
      async () => (await permitLedger(stack.database.db.pool, permitId)).reserved === 0n,
    );
    const spent = await permitLedger(stack.database.db.pool, permitId);
    expect(maximum * BigInt(K) - spent.charged).toBeLessThan(maximum);
  });
});

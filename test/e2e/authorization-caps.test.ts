import pg from "pg";
import type { Hex } from "viem";
import { afterAll, beforeAll, expect, it } from "vitest";
import { createApiKey } from "../../src/adapters/pg/api-keys.js";
import { permitLedger } from "../../src/adapters/pg/ledger/index.js";
import { authorizeKey, type AuthorizationView } from "../helpers/authorize.js";
import { describeIfPostgres } from "../helpers/db.js";
import type { FakeUpstream } from "../helpers/fake-upstream.js";
import { auditSecret } from "../helpers/log-audit.js";
import { openPermit } from "../helpers/market.js";
import {
  killProcess,
  serveProcess,
  stopProcess,
  type GatewayProcess,
} from "../helpers/processes.js";
import { authed, eventually, json, startChatStack, type TestStack } from "../helpers/stack.js";

/**
 * Narrowed delegation (issue 28, item 7): a payer gives an agent's API key "at most this much of
 * this permit, at most that much per call". Two real gateway processes on one PostgreSQL serve
 * the agent; the cap is the database's (adapters/pg/ledger/index.ts, "Authorization caps").
 */
describeIfPostgres("credit caps on a payer's authorization, across two gateway processes", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let other: GatewayProcess | undefined;
  let doomed: GatewayProcess | undefined;
  // The survivor's housekeeping voids a dead process's requests 3 s after its last heartbeat.
  const orphanEnv = { ORPHAN_AFTER_SECONDS: "3", HOUSEKEEPING_INTERVAL_MS: "300" };
  /** A chat request's maximum credits (its quote's), the same for every request of `body`. */
  let maximum: bigint;
  const K = 4;
  let agent: string;
  /** Capped: K requests' maxima in all, one per request. */
  let capped: AuthorizationView;
  /** Capped per request just below this request's maximum. */
  let narrow: AuthorizationView;
  /** No cap, on another permit of the same payer. */
  let uncapped: AuthorizationView;
  /** Capped, for the void and the orphan. */
  let spare: AuthorizationView;

  const body = JSON.stringify({
    model: "demo-chat",
    messages: [{ role: "user", content: "an agent's call" }],
    max_tokens: 16,
  });
  const chat = (base: string, permitId: Hex) =>
    fetch(`${base}/v1/chat/completions`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${agent}`,
        "content-type": "application/json",
        "x-gateway-permit": permitId,
      },
      body,
    });
  const pool = () => stack.database.db.pool;
  const capLedger = async (authorizationId: string, client: pg.Client | pg.Pool = pool()) => {
    const { rows } = await client.query<{ reserved: string; used: string }>(
      "SELECT reserved, used FROM authorization_ledgers WHERE authorization_id = $1",
      [authorizationId],
    );
    const row = rows[0];
    return row === undefined
      ? { reserved: 0n, used: 0n }
      : { reserved: BigInt(row.reserved), used: BigInt(row.used) };
  };
  /** The requests an authorization admitted: how many, how many open, what they were charged. */
  const requestsOf = async (authorizationId: string) => {
    const { rows } = await pool().query<{ n: number; open: number; charged: string }>(
      `SELECT count(*)::int AS n,
              count(*) FILTER (WHERE status IN ('pending', 'streaming'))::int AS open,
              COALESCE(sum(credits_charged), 0)::text AS charged
       FROM inference_requests WHERE authorization_id = $1`,
      [authorizationId],
    );
    return { n: rows[0]!.n, open: rows[0]!.open, charged: BigInt(rows[0]!.charged) };
  };
  const listing = async (): Promise<AuthorizationView[]> => {
    const res = await fetch(`${stack.gateway.url}/v1/permit-authorizations`, {
      headers: { authorization: `Bearer ${agent}` },
    });
    expect(res.status).toBe(200);
    return (await json(res)).data as AuthorizationView[];
  };

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack({ PERMIT_CACHE_MS: "60000", ...orphanEnv }));
    const quote = await json(
      await authed(stack, "/v1/quotes", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body,
      }),
    );
    maximum = BigInt(quote.maximum_credits);
    agent = (await createApiKey(pool(), "agent")).key;
    auditSecret("api key", agent);
    const payer = stack.roles.payer.privateKey;
    const deposit = 100n * maximum;
    const authorize = async (caps: { totalCap?: bigint; perRequestCap?: bigint }) =>
      authorizeKey(stack.gateway.url, agent, payer, {
        permitId: await openPermit(stack, { deposit }),
        ...(caps.totalCap === undefined ? {} : { totalCap: caps.totalCap.toString() }),
        ...(caps.perRequestCap === undefined
          ? {}
          : { perRequestCap: caps.perRequestCap.toString() }),
      });
    capped = await authorize({ totalCap: BigInt(K) * maximum, perRequestCap: maximum });
    narrow = await authorize({ totalCap: 10n * maximum, perRequestCap: maximum - 1n });
    uncapped = await authorize({});
    spare = await authorize({ totalCap: 2n * maximum });
    // Started after the authorizations exist: its first look at the agent's key sees them all.
    other = await serveProcess(stack, orphanEnv);
  }, 120_000);
  afterAll(async () => {
    await stopProcess(other);
    await killProcess(doomed);
    await fake?.stop();
    await stack?.close();
  });

  it("a burst across two processes admits exactly the requests that fit the total cap, never more; the use is then the sum of the charges, shown in the listing", async () => {
    const cap = BigInt(K) * maximum;
    expect(capped.total_cap).toBe(cap.toString());
    // Both processes have served the agent before (its key, the model's tokenizer, the permit
    // read from the chain), so the burst's requests reach their reservations together.
    for (const base of [stack.gateway.url, other!.url]) {
      const warm = await chat(base, uncapped.permit_id);
      expect(warm.status).toBe(200);
      await warm.text();
    }
    // Admitted requests are held by the provider until the whole burst is decided: none of
    // them closes (and frees part of its maximum) before every other request is answered.
    fake.setOptions({ stallBeforeHeadersMs: 60_000 });
    const watcher = new pg.Client({ connectionString: stack.database.url! });
    await watcher.connect();
    let peak = 0n;
    let watching = true;
    const watch = (async () => {
      while (watching) {
        const l = await capLedger(capped.id, watcher);
        if (l.reserved + l.used > peak) peak = l.reserved + l.used;
      }
    })();
    const calls = fake.calls("/v1/chat/completions");
    let refusedSoFar = 0;
    let answers: { status: number; code: string | undefined }[];
    try {
      const burst = Promise.all(
        Array.from({ length: 3 * K }, async (_, i) => {
          const res = await chat(i % 2 === 0 ? stack.gateway.url : other!.url, capped.permit_id);
          const text = await res.text();
          if (res.status !== 200) refusedSoFar++;
          return {
            status: res.status,
            code:
              res.status === 200
                ? undefined
                : (JSON.parse(text) as { error: { code: string } }).error.code,
          };
        }),
      );
      await eventually(
        async () => refusedSoFar === 2 * K && fake.calls("/v1/chat/completions") === calls + K,
        20_000,
      );
      // A moment more: nothing else reaches the provider.
      await new Promise((r) => setTimeout(r, 300));
      expect(fake.calls("/v1/chat/completions")).toBe(calls + K);
      expect(await capLedger(capped.id)).toEqual({ reserved: cap, used: 0n });
      // The cap is spent, and the same key's uncapped authorization (another permit of the same
      // payer) is still admitted on both processes.
      const free = [stack.gateway.url, other!.url].map(async (base) => {
        const res = await chat(base, uncapped.permit_id);
        await res.text();
        return res.status;
      });
      await eventually(async () => fake.calls("/v1/chat/completions") === calls + K + 2, 10_000);
      fake.setOptions({ stallBeforeHeadersMs: undefined });
      fake.releaseHolds();
      answers = await burst;
      expect(await Promise.all(free)).toEqual([200, 200]);
    } finally {
      fake.setOptions({ stallBeforeHeadersMs: undefined });
      fake.releaseHolds();
      watching = false;
      await watch;
      await watcher.end();
    }
    expect(answers.filter((a) => a.status === 200)).toHaveLength(K);
    expect(answers.filter((a) => a.status !== 200)).toEqual(
      Array.from({ length: 2 * K }, () => ({ status: 402, code: "authorization_cap_exhausted" })),
    );
    expect(fake.calls("/v1/chat/completions")).toBe(calls + K + 2);
    expect(peak).toBeLessThanOrEqual(cap);
    expect(peak).toBe(cap);

    // The closes are written: the cap's use is exactly what its requests were charged.
    await eventually(async () => (await requestsOf(capped.id)).open === 0, 10_000);
    const requests = await requestsOf(capped.id);
    expect(requests.n).toBe(K);
    expect(requests.charged).toBeGreaterThan(0n);
    expect(await capLedger(capped.id)).toEqual({ reserved: 0n, used: requests.charged });
    const shown = (await listing()).find((a) => a.id === capped.id)!;
    expect(shown).toMatchObject({
      total_cap: cap.toString(),
      per_request_cap: maximum.toString(),
      credits_used: requests.charged.toString(),
      credits_reserved: "0",
    });
    expect(typeof shown.last_used_at).toBe("number");
    expect(Math.abs(shown.last_used_at! - Date.now() / 1000)).toBeLessThan(60);
  }, 60_000);

  it("a request whose maximum is above the per-request cap is refused on either process before any provider call, with nothing reserved", async () => {
    const calls = fake.calls("/v1/chat/completions");
    for (const base of [stack.gateway.url, other!.url]) {
      const res = await chat(base, narrow.permit_id);
      expect(res.status).toBe(403);
      const error = (await json(res)).error;
      expect(error.code).toBe("authorization_per_request_cap_exceeded");
      expect(error.message).toContain(`maximum of ${maximum} credits`);
      expect(error.message).toContain(`per-request cap of ${maximum - 1n} credits`);
    }
    expect(fake.calls("/v1/chat/completions")).toBe(calls);
    expect(await requestsOf(narrow.id)).toEqual({ n: 0, open: 0, charged: 0n });
    expect(await permitLedger(pool(), narrow.permit_id)).toMatchObject({
      reserved: 0n,
      charged: 0n,
    });
    const { rows } = await pool().query(
      "SELECT 1 FROM authorization_ledgers WHERE authorization_id = $1",
      [narrow.id],
    );
    expect(rows).toEqual([]);
  });

  it("the listing shows an uncapped authorization's use, and nothing for one never used", async () => {
    await eventually(async () => {
      const r = await requestsOf(uncapped.id);
      // Two warm-up requests and two served while the cap was spent, all closed.
      return r.n === 4 && r.open === 0;
    }, 10_000);
    const { charged } = await requestsOf(uncapped.id);
    const shown = (await listing()).find((a) => a.id === uncapped.id)!;
    expect(shown).toMatchObject({
      total_cap: "0",
      credits_used: charged.toString(),
      credits_reserved: "0",
    });
    expect(typeof shown.last_used_at).toBe("number");
    // Never used: nothing shown as used, no last use.
    expect((await listing()).find((a) => a.id === narrow.id)).toMatchObject({
      credits_used: "0",
      credits_reserved: "0",
      last_used_at: null,
    });
  });

  it("a failed request gives its cap reservation back whole", async () => {
    fake.setOptions({ failStatus: 500 });
    try {
      const res = await chat(other!.url, spare.permit_id);
      expect(res.status).toBe(502);
      await res.text();
    } finally {
      fake.setOptions({ failStatus: undefined });
    }
    await eventually(async () => (await requestsOf(spare.id)).open === 0, 10_000);
    expect(await requestsOf(spare.id)).toEqual({ n: 1, open: 0, charged: 0n });
    expect(await capLedger(spare.id)).toEqual({ reserved: 0n, used: 0n });
  });

  it("a process killed while it holds a capped request: the survivor's orphan rule gives the cap back", async () => {
    doomed = await serveProcess(stack, orphanEnv);
    fake.setOptions({ delayMs: 10_000 });
    try {
      const calls = fake.calls("/v1/chat/completions");
      const pending = chat(doomed.url, spare.permit_id).catch(() => undefined);
      await eventually(async () => fake.calls("/v1/chat/completions") === calls + 1, 10_000);
      expect(await capLedger(spare.id)).toEqual({ reserved: maximum, used: 0n });
      await killProcess(doomed);
      await pending;
      await eventually(async () => (await capLedger(spare.id)).reserved === 0n, 15_000);
    } finally {
      fake.setOptions({ delayMs: 0 });
    }
    expect(await capLedger(spare.id)).toEqual({ reserved: 0n, used: 0n });
    expect(await requestsOf(spare.id)).toEqual({ n: 2, open: 0, charged: 0n });
    // What it held is usable again: the cap (2 requests' maxima) admits a request.
    const res = await chat(stack.gateway.url, spare.permit_id);
    expect(res.status).toBe(200);
    await res.text();
  }, 60_000);
});

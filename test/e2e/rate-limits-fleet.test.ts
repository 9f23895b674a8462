import type { Hex } from "viem";
import { afterAll, beforeAll, expect, it } from "vitest";
import { createApiKey } from "../../src/adapters/pg/api-keys.js";
import { describeIfPostgres } from "../helpers/db.js";
import type { FakeUpstream } from "../helpers/fake-upstream.js";
import { auditSecret } from "../helpers/log-audit.js";
import {
  killProcess,
  serveProcess,
  stopProcess,
  type GatewayProcess,
} from "../helpers/processes.js";
import { eventually, startChatStack, type TestStack } from "../helpers/stack.js";

/**
 * Fleet-wide per-API-key limits (issue 21, item 7): the database is the arbiter, so one, two
 * and three gateway processes together admit the configured rate (not N times it), and the
 * configured streams (a killed process's slots come back once RATE_LIMIT_STREAM_TTL_MS passed).
 *
 * Tolerance (docs/decisions/errors-and-rate-limits.md, "Rate limits"): over a window of W seconds the fleet admits at
 * most BURST + RPS x W (+1 for the clock granularity; the database bucket never grants more),
 * and at least 85 % of it (tokens a replica leased and has not used yet are back within 0.5 s).
 */
const RPS = 40;
const BURST = 40;
const STREAMS = 3;
const TTL_MS = 2000;
const env = {
  RATE_LIMIT_RPS: String(RPS),
  RATE_LIMIT_BURST: String(BURST),
  MAX_STREAMS_PER_KEY: String(STREAMS),
  RATE_LIMIT_STREAM_TTL_MS: String(TTL_MS),
  PERMIT_CACHE_MS: "60000",
};

describeIfPostgres("rate limits across processes (fleet-wide through PostgreSQL)", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let permitId: Hex;
  const children: GatewayProcess[] = [];

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack(env, { chunks: 4 }));
    permitId = stack.demo.permitId;
    children.push(await serveProcess(stack, env), await serveProcess(stack, env));
  }, 90_000);
  afterAll(async () => {
    for (const child of children) await stopProcess(child);
    await fake?.stop();
    await stack?.close();
  });

  const urls = (replicas: number) =>
    [stack.gateway.url, ...children.map((c) => c.url)].slice(0, replicas);
  const newKey = async (): Promise<string> => {
    const { key } = await createApiKey(stack.database.db.pool, "fleet");
    auditSecret("api key", key);
    return key;
  };
  const chat = (base: string, signal?: AbortSignal) =>
    fetch(`${base}/v1/chat/completions`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${stack.apiKey}`,
        "content-type": "application/json",
        "x-gateway-permit": permitId,
      },
      body: JSON.stringify({
        model: "demo-chat",
        messages: [{ role: "user", content: "hi" }],
        max_tokens: 16,
        stream: true,
      }),
      ...(signal === undefined ? {} : { signal }),
    });

  /** Four clients per replica ask as fast as they can for `seconds`: what was admitted. */
  const hammer = async (replicas: number, seconds: number) => {
    const key = await newKey();
    const bases = urls(replicas);
    let admitted = 0;
    let refused = 0;
    const started = performance.now();
    const until = started + seconds * 1000;
    await Promise.all(
      bases.flatMap((base) =>
        Array.from({ length: 4 }, async () => {
          while (performance.now() < until) {
            const res = await fetch(`${base}/v1/models`, {
              headers: { authorization: `Bearer ${key}` },
            });
            await res.arrayBuffer();
            if (res.status === 200) admitted++;
            else if (res.status === 429) refused++;
            else throw new Error(`unexpected status ${res.status}`);
          }
        }),
      ),
    );
    const window = (performance.now() - started) / 1000;
    return { admitted, refused, window, allowed: BURST + RPS * window };
  };

  const budgetUpdates = async () => {
    const { rows } = await stack.database.db.pool.query<{ upd: string; hot: string }>(
      "SELECT n_tup_upd::text AS upd, n_tup_hot_upd::text AS hot FROM pg_stat_user_tables WHERE relname = 'rate_budgets'",
    );
    return { upd: Number(rows[0]?.upd ?? 0), hot: Number(rows[0]?.hot ?? 0) };
  };

  for (const replicas of [1, 2, 3]) {
    it(`${replicas} replica(s): the fleet admits BURST + RPS x window within tolerance`, async () => {
      const before = await budgetUpdates();
      const { admitted, refused, window, allowed } = await hammer(replicas, 3);
      console.log(
        `fleet rate, ${replicas} replica(s): admitted ${admitted} of ${allowed.toFixed(1)} allowed in ${window.toFixed(2)} s (${refused} refused)`,
      );
      expect(refused).toBeGreaterThan(0);
      expect(admitted).toBeLessThanOrEqual(Math.floor(allowed) + 1);
      expect(admitted).toBeGreaterThanOrEqual(Math.floor(0.85 * allowed));
      // Leases in chunks, never a row per request; updated in place (HOT: no vacuum needed).
      await new Promise((r) => setTimeout(r, 1500)); // statistics are flushed about once a second
      const after = await budgetUpdates();
      const updates = after.upd - before.upd;
      console.log(
        `rate_budgets updates: ${updates} for ${admitted + refused} requests (${after.hot - before.hot} HOT)`,
      );
      // At most one per lease (a refusal writes nothing; each lease grants at least a token).
      expect(updates).toBeLessThan(admitted);
    }, 30_000);
  }

  it(`streams: ${STREAMS} at once across three replicas, and a killed replica's come back after the TTL`, async () => {
    fake.setOptions({ delayMs: 400, chunks: 40 });
    const bases = urls(3);
    const holders = new AbortController();
    const open: Response[] = [];
    // One stream on each replica in turn: the fleet admits exactly STREAMS.
    const statuses: number[] = [];
    for (let i = 0; i < STREAMS + 3; i++) {
      const res = await chat(bases[i % 3]!, holders.signal);
      statuses.push(res.status);
      if (res.status === 200) {
        open.push(res);
        await res.body!.getReader().read(); // under way
      } else {
        expect(res.headers.get("retry-after")).toBe("1");
        await res.arrayBuffer();
      }
    }
    expect(statuses).toEqual([200, 200, 200, 429, 429, 429]);

    // The third replica (children[1]) holds one of them: killed, it never gives it back itself.
    await killProcess(children[1]);
    holders.abort();
    const killedAt = performance.now();
    // The two live replicas' streams end (client gone): two slots come back at once.
    await eventually(
      async () => {
        const res = await chat(bases[0]!);
        const ok = res.status === 200;
        await res.body?.cancel().catch(() => undefined);
        return ok;
      },
      5000,
      100,
    );
    // Three at once: the dead replica's slot counts until its TTL passes.
    const held = new AbortController();
    let third: number | undefined;
    const streams: Response[] = [];
    await eventually(
      async () => {
        for (const s of streams) await s.body?.cancel().catch(() => undefined);
        streams.length = 0;
        for (let i = 0; i < STREAMS; i++) {
          const res = await chat(bases[i % 2]!, held.signal);
          if (res.status === 200) streams.push(res);
          else await res.arrayBuffer();
        }
        if (streams.length === STREAMS) third = performance.now() - killedAt;
        return streams.length === STREAMS;
      },
      TTL_MS + 5000,
      200,
    );
    held.abort();
    console.log(`a killed replica's stream slot came back after ${Math.round(third!)} ms`);
    expect(third!).toBeGreaterThan(TTL_MS - 1000);
    expect(third!).toBeLessThan(TTL_MS + 2500);
  }, 60_000);
});

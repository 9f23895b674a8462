import { randomBytes, randomInt } from "node:crypto";
import pg from "pg";
import type { Hex } from "viem";
import { afterAll, beforeAll, expect, it } from "vitest";
import { openDatabase, type Database } from "../src/adapters/pg/database.js";
import {
  finalize,
  heartbeat,
  permitLedger,
  reconcileOrphans,
  reserve,
  switchOffer,
  type ReserveInput,
  type ReserveResult,
} from "../src/adapters/pg/ledger.js";
import { createTestDatabase, describeIfPostgres, type TestDatabase } from "./helpers/db.js";

// Two pools on one fresh database stand for two gateway processes: each has its own
// connections, so their transactions really interleave in PostgreSQL. Only a real PostgreSQL
// can show this (PGlite has a single connection).

const NOW = 1_700_000_000;

function hex32(): Hex {
  return `0x${randomBytes(32).toString("hex")}`;
}

function reservation(
  input: Pick<ReserveInput, "permitId" | "offerId" | "maximumCredits" | "deposit"> &
    Partial<ReserveInput>,
): ReserveInput {
  const requestId = `req_${randomBytes(8).toString("hex")}`;
  const quoteId = `qt_${randomBytes(8).toString("hex")}`;
  const modelId: Hex = `0x${"11".repeat(32)}`;
  return {
    requestId,
    apiKeyId: "key_concurrency",
    instanceId: "instance_a",
    model: "org/model",
    modelId,
    quoteId,
    stream: false,
    tariffVersion: 1n,
    inputTokens: 10n,
    chainSettled: 0n,
    maxConcurrency: 1_000_000,
    now: NOW,
    quote: {
      quoteId,
      apiKeyId: "key_concurrency",
      model: "org/model",
      modelId,
      offerId: input.offerId,
      tariffVersion: 1n,
      inputTokens: 10n,
      maxOutputTokens: 10n,
      wakesEndpoint: false,
      maximumCredits: input.maximumCredits,
      fingerprint: "0".repeat(64),
      createdAt: NOW,
      expiresAt: NOW + 60,
      internal: true,
    },
    ...input,
  };
}

/**
 * Polls the permit's ledger from its own connection while `work` runs and returns what `work`
 * returns, failing if any observation had charged + reserved above the deposit.
 */
async function watchingPermit<T>(
  url: string,
  permitId: Hex,
  deposit: bigint,
  work: () => Promise<T>,
): Promise<T> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  const violations: string[] = [];
  let observations = 0;
  let stop = false;
  const poll = (async () => {
    while (!stop) {
      const { rows } = await client.query<{ reserved: string; charged: string }>(
        "SELECT reserved, charged FROM permit_ledgers WHERE permit_id = $1",
        [permitId],
      );
      const row = rows[0];
      if (row && BigInt(row.reserved) + BigInt(row.charged) > deposit) {
        violations.push(`reserved ${row.reserved} + charged ${row.charged} > ${deposit}`);
      }
      observations++;
    }
  })();
  try {
    return await work();
  } finally {
    stop = true;
    await poll;
    await client.end();
    expect(violations).toEqual([]);
    expect(observations).toBeGreaterThan(0);
  }
}

describeIfPostgres("the ledger shared by two gateway processes", () => {
  let test: TestDatabase;
  let a: Database;
  let b: Database;
  let url: string;

  beforeAll(async () => {
    test = await createTestDatabase();
    url = test.url!;
    a = test.db;
    b = await openDatabase({ url });
  });

  afterAll(async () => {
    await b?.close();
    await test?.drop();
  });

  const poolOf = (i: number): pg.Pool => (i % 2 === 0 ? a.pool : b.pool);

  it("admits exactly K of 10·K concurrent requests when the deposit covers K", async () => {
    const K = 20;
    const maximum = 1_000n;
    const deposit = maximum * BigInt(K);
    const permitId = hex32();
    // One offer per request: on a shared offer its row lock would serialize the transactions
    // and hide a race on the permit.
    const inputs = Array.from({ length: 10 * K }, () =>
      reservation({ permitId, offerId: hex32(), maximumCredits: maximum, deposit }),
    );
    const results = await watchingPermit(url, permitId, deposit, () =>
      Promise.all(inputs.map((input, i) => reserve(poolOf(i), input))),
    );

    const admitted = inputs.filter((_, i) => results[i]!.ok);
    expect(admitted).toHaveLength(K);
    const refusals = results.filter((r): r is Extract<ReserveResult, { ok: false }> => !r.ok);
    expect(new Set(refusals.map((r) => r.reason))).toEqual(new Set(["insufficient_credits"]));
    // Both processes got some in.
    expect(new Set(admitted.map((x) => inputs.indexOf(x) % 2)).size).toBe(2);
    expect(await permitLedger(a.pool, permitId)).toEqual({
      reserved: deposit,
      charged: 0n,
      settled: 0n,
    });
    const { rows } = await a.pool.query<{ n: string; in_flight: string }>(
      `SELECT (SELECT count(*) FROM inference_requests WHERE permit_id = $1) AS n,
              (SELECT sum(in_flight) FROM offer_loads WHERE offer_id = ANY($2)) AS in_flight`,
      [permitId, inputs.map((x) => x.offerId)],
    );
    expect(rows[0]).toEqual({ n: String(K), in_flight: String(K) });

    // Finalize them all concurrently, each one twice (once from each process), with random
    // charges, some above the maximum.
    const charges = admitted.map(() => BigInt(randomInt(0, 1_500)));
    const finalizations = await watchingPermit(url, permitId, deposit, () =>
      Promise.all(
        admitted.flatMap((input, i) =>
          [0, 1].map((process) =>
            finalize(poolOf(i + process), {
              requestId: input.requestId,
              status: "completed",
              inputTokens: 10n,
              outputTokens: 10n,
              creditsCharged: charges[i]!,
              billing: "billed",
              usageSource: "provider",
              now: NOW + 1,
            }),
          ),
        ),
      ),
    );
    const clamped = charges.map((c) => (c < maximum ? c : maximum));
    for (const [i] of admitted.entries()) {
      const pair = finalizations.slice(2 * i, 2 * i + 2);
      expect(pair.filter((f) => f.finalized)).toHaveLength(1);
      expect(pair.map((f) => f.creditsCharged)).toEqual([clamped[i], clamped[i]]);
    }
    const total = clamped.reduce((s, c) => s + c, 0n);
    const ledger = await permitLedger(a.pool, permitId);
    expect(ledger).toEqual({ reserved: 0n, charged: total, settled: 0n });
    expect(ledger.charged + ledger.reserved <= deposit).toBe(true);
  });

  it("keeps the deposit while reservations and charges interleave across processes", async () => {
    const deposit = 50_000n;
    const permitId = hex32();
    let charged = 0n;

    await watchingPermit(url, permitId, deposit, () =>
      Promise.all(
        Array.from({ length: 16 }, async (_, worker) => {
          const pool = poolOf(worker);
          for (let n = 0; n < 15; n++) {
            const maximumCredits = BigInt(randomInt(100, 3_000));
            const input = reservation({ permitId, offerId: hex32(), maximumCredits, deposit });
            const result = await reserve(pool, input);
            if (!result.ok) continue;
            const charge = BigInt(randomInt(0, 4_000));
            const done = await finalize(poolOf(worker + n), {
              requestId: input.requestId,
              status: "completed",
              inputTokens: 1n,
              outputTokens: 1n,
              creditsCharged: charge,
              billing: "billed",
              usageSource: "provider",
              now: NOW,
            });
            expect(done.finalized).toBe(true);
            charged += done.creditsCharged;
          }
        }),
      ),
    );
    const ledger = await permitLedger(a.pool, permitId);
    expect(ledger).toEqual({ reserved: 0n, charged, settled: 0n });
    expect(charged <= deposit).toBe(true);
  });

  it("enforces max_concurrency across processes", async () => {
    const N = 60;
    const M = 5;
    const offerId = hex32();
    const inputs = Array.from({ length: N }, () =>
      reservation({
        permitId: hex32(),
        offerId,
        maximumCredits: 10n,
        deposit: 1_000n,
        maxConcurrency: M,
      }),
    );
    const results = await Promise.all(inputs.map((input, i) => reserve(poolOf(i), input)));
    expect(results.filter((r) => r.ok)).toHaveLength(M);
    expect(results.filter((r) => !r.ok && r.reason === "offer_at_capacity")).toHaveLength(N - M);
    const load = async (): Promise<number | undefined> =>
      (
        await a.pool.query<{ in_flight: number }>(
          "SELECT in_flight FROM offer_loads WHERE offer_id = $1",
          [offerId],
        )
      ).rows[0]?.in_flight;
    expect(await load()).toBe(M);

    // Requests coming and going from both processes never push the load above M.
    let peak = 0;
    let stop = false;
    const watcher = (async () => {
      while (!stop) peak = Math.max(peak, (await load()) ?? 0);
    })();
    const admitted = inputs.filter((_, i) => results[i]!.ok);
    await Promise.all([
      ...admitted.map((input, i) =>
        finalize(poolOf(i), {
          requestId: input.requestId,
          status: "cancelled",
          inputTokens: 1n,
          outputTokens: 0n,
          creditsCharged: 1n,
          billing: "partial",
          usageSource: "gateway",
          now: NOW,
        }),
      ),
      ...Array.from({ length: 8 }, async (_, worker) => {
        for (let n = 0; n < 10; n++) {
          const input = reservation({
            permitId: hex32(),
            offerId,
            maximumCredits: 10n,
            deposit: 1_000n,
            maxConcurrency: M,
          });
          if ((await reserve(poolOf(worker), input)).ok) {
            await finalize(poolOf(worker + 1), {
              requestId: input.requestId,
              status: "completed",
              inputTokens: 1n,
              outputTokens: 1n,
              creditsCharged: 1n,
              billing: "billed",
              usageSource: "provider",
              now: NOW,
            });
          }
        }
      }),
    ]);
    stop = true;
    await watcher;
    expect(peak).toBeLessThanOrEqual(M);
    expect(await load()).toBe(0);
  });

  it("reconciles each orphan once when both processes reconcile at the same time", async () => {
    const dead = `dead_${randomBytes(4).toString("hex")}`;
    await heartbeat(a.pool, dead, NOW - 600);
    const permitId = hex32();
    const offerId = hex32();
    const inputs = Array.from({ length: 30 }, () =>
      reservation({
        permitId,
        offerId,
        maximumCredits: 100n,
        deposit: 10_000n,
        instanceId: dead,
        now: NOW - 600,
      }),
    );
    for (const input of inputs) expect(await reserve(a.pool, input)).toEqual({ ok: true });

    // The owner also wakes up and tries to finalize some of them at the same moment.
    const counts = await Promise.all([
      ...Array.from({ length: 6 }, (_, i) =>
        reconcileOrphans(poolOf(i), { now: NOW, staleAfterSeconds: 60, limit: 100 }),
      ),
      ...inputs.slice(0, 10).map((input, i) =>
        finalize(poolOf(i), {
          requestId: input.requestId,
          status: "completed",
          inputTokens: 1n,
          outputTokens: 1n,
          creditsCharged: 50n,
          billing: "billed",
          usageSource: "provider",
          now: NOW,
        }).then((r) => (r.finalized ? 1_000 : 0)),
      ),
    ]);
    const reconciled = counts.slice(0, 6).reduce((s, n) => s + n, 0);
    const finalizedByOwner = counts.slice(6).reduce((s, n) => s + n, 0) / 1_000;
    expect(reconciled + finalizedByOwner).toBe(inputs.length);

    const ledger = await permitLedger(a.pool, permitId);
    expect(ledger).toEqual({ reserved: 0n, charged: 50n * BigInt(finalizedByOwner), settled: 0n });
    const { rows } = await a.pool.query<{ in_flight: number; orphaned: string }>(
      `SELECT (SELECT in_flight FROM offer_loads WHERE offer_id = $1) AS in_flight,
              (SELECT count(*) FROM inference_requests
               WHERE permit_id = $2 AND error = 'orphaned' AND billing = 'void'
                 AND credits_charged = 0) AS orphaned`,
      [offerId, permitId],
    );
    expect(rows[0]).toEqual({ in_flight: 0, orphaned: String(reconciled) });
  });

  it("does not deadlock when failovers cross between two offers", async () => {
    const deposit = 1_000_000n;
    const permitId = hex32();
    const offers = [hex32(), hex32()];
    const inputs = Array.from({ length: 40 }, (_, i) =>
      reservation({ permitId, offerId: offers[i % 2]!, maximumCredits: 100n, deposit }),
    );
    await Promise.all(inputs.map((input, i) => reserve(poolOf(i), input)));

    // Every request switches to the other offer, and back, while new requests come and go.
    const switches = inputs.flatMap((input, i) =>
      [1, 0].map(
        (k) => () =>
          switchOffer(poolOf(i + k), {
            requestId: input.requestId,
            offerId: offers[(i + k) % 2]!,
            maximumCredits: BigInt(randomInt(50, 200)),
            tariffVersion: 2n,
            maxConcurrency: 1_000,
            deposit,
            chainSettled: 0n,
          }),
      ),
    );
    const traffic = Array.from({ length: 20 }, (_, i) => async () => {
      const input = reservation({
        permitId,
        offerId: offers[i % 2]!,
        maximumCredits: 100n,
        deposit,
      });
      await reserve(poolOf(i), input);
      await finalize(poolOf(i + 1), {
        requestId: input.requestId,
        status: "completed",
        inputTokens: 1n,
        outputTokens: 1n,
        creditsCharged: 10n,
        billing: "billed",
        usageSource: "provider",
        now: NOW,
      });
    });
    await Promise.all([...switches, ...traffic].map((f) => f()));

    const { rows } = await a.pool.query<{ offer_id: string; in_flight: number; open: string }>(
      `SELECT l.offer_id, l.in_flight,
              (SELECT count(*) FROM inference_requests r
               WHERE r.offer_id = l.offer_id AND r.status = 'pending') AS open
       FROM offer_loads l WHERE l.offer_id = ANY($1)`,
      [offers],
    );
    for (const row of rows) expect(row.in_flight).toBe(Number(row.open));
    expect(rows.reduce((s, r) => s + r.in_flight, 0)).toBe(inputs.length);
    const { rows: sums } = await a.pool.query<{ open: string }>(
      `SELECT COALESCE(sum(maximum_credits), 0)::text AS open FROM inference_requests
       WHERE permit_id = $1 AND status = 'pending'`,
      [permitId],
    );
    expect((await permitLedger(a.pool, permitId)).reserved).toBe(BigInt(sums[0]!.open));
  });
});

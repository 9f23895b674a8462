import { randomBytes, randomInt } from "node:crypto";
import { setTimeout } from "node:timers/promises";
import pg from "pg";
import type { Hex } from "viem";
import { afterAll, beforeAll, expect, it } from "vitest";
import { createApiKey } from "../src/adapters/pg/api-keys.js";
import { openDatabase, type Database } from "../src/adapters/pg/database.js";
import {
  createLedgerBatcher,
  finalize,
  heartbeat,
  permitLedger,
  reconcileOrphans,
  reserve,
  switchOffer,
  type FinalizeInput,
  type FinalizeResult,
  type ReserveInput,
} from "../src/adapters/pg/ledger/index.js";
import type { ReserveResult } from "../src/domain/chat/ports.js";
import { insertPermitAuthorization } from "../src/adapters/pg/permit-authorizations.js";
import { describeIfPostgres, useTestDatabase } from "./helpers/db.js";
import {
  completion,
  hex32,
  NOW,
  offerInFlight,
  reservation as sharedReservation,
} from "./helpers/ledger.js";

// Two pools on one fresh database stand for two gateway processes: each has its own
// connections, so their transactions really interleave in PostgreSQL. Only a real PostgreSQL
// can show this (PGlite has a single connection).

/** A reservation as one of these processes makes it: no capacity limit unless the test sets one. */
function reservation(
  input: Pick<ReserveInput, "permitId" | "offerId" | "maximumCredits" | "deposit"> &
    Partial<ReserveInput>,
): ReserveInput {
  return sharedReservation({
    apiKeyId: "key_concurrency",
    instanceId: "instance_a",
    maxConcurrency: 1_000_000,
    ...input,
  });
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

/** The pool of process `i % 2` of a suite's two. */
function poolOf(p: { readonly a: Database; readonly b: Database }, i: number): pg.Pool {
  return i % 2 === 0 ? p.a.pool : p.b.pool;
}

/** One fresh database with two handles on it, as two gateway processes have, for a suite. */
function twoProcesses(): { readonly a: Database; readonly b: Database; readonly url: string } {
  const test = useTestDatabase();
  let b: Database | undefined;
  beforeAll(async () => {
    b = await openDatabase({ url: test.url! });
  });
  afterAll(async () => {
    await b?.close();
  });
  return {
    get a() {
      return test.db;
    },
    get b() {
      return b!;
    },
    get url() {
      return test.url!;
    },
  };
}

describeIfPostgres("the ledger shared by two gateway processes", () => {
  const p = twoProcesses();

  const poolOf = (i: number): pg.Pool => (i % 2 === 0 ? p.a.pool : p.b.pool);

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
    const results = await watchingPermit(p.url, permitId, deposit, () =>
      Promise.all(inputs.map((input, i) => reserve(poolOf(i), input))),
    );

    const admitted = inputs.filter((_, i) => results[i]!.ok);
    expect(admitted).toHaveLength(K);
    const refusals = results.filter((r): r is Extract<ReserveResult, { ok: false }> => !r.ok);
    expect(new Set(refusals.map((r) => r.reason))).toEqual(new Set(["insufficient_credits"]));
    // Both processes got some in.
    expect(new Set(admitted.map((x) => inputs.indexOf(x) % 2)).size).toBe(2);
    expect(await permitLedger(p.a.pool, permitId)).toEqual({
      reserved: deposit,
      charged: 0n,
      settled: 0n,
      unsettleable: 0n,
    });
    const { rows } = await p.a.pool.query<{ n: string; in_flight: string }>(
      `SELECT (SELECT count(*) FROM inference_requests WHERE permit_id = $1) AS n,
              (SELECT sum(in_flight) FROM offer_loads WHERE offer_id = ANY($2)) AS in_flight`,
      [permitId, inputs.map((x) => x.offerId)],
    );
    expect(rows[0]).toEqual({ n: String(K), in_flight: String(K) });

    // Finalize them all concurrently, each one twice (once from each process), with random
    // charges, some above the maximum.
    const charges = admitted.map(() => BigInt(randomInt(0, 1_500)));
    const finalizations = await watchingPermit(p.url, permitId, deposit, () =>
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
    const ledger = await permitLedger(p.a.pool, permitId);
    expect(ledger).toEqual({ reserved: 0n, charged: total, settled: 0n, unsettleable: 0n });
    expect(ledger.charged + ledger.reserved <= deposit).toBe(true);
  });

  it("keeps the deposit while reservations and charges interleave across processes", async () => {
    const deposit = 50_000n;
    const permitId = hex32();
    let charged = 0n;

    await watchingPermit(p.url, permitId, deposit, () =>
      Promise.all(
        Array.from({ length: 16 }, async (_, worker) => {
          const pool = poolOf(worker);
          for (let n = 0; n < 15; n++) {
            const maximumCredits = BigInt(randomInt(100, 3_000));
            const input = reservation({ permitId, offerId: hex32(), maximumCredits, deposit });
            const result = await reserve(pool, input);
            if (!result.ok) continue;
            const charge = BigInt(randomInt(0, 4_000));
            const done = await finalize(poolOf(worker + n), completion(input.requestId, charge));
            expect(done.finalized).toBe(true);
            charged += done.creditsCharged;
          }
        }),
      ),
    );
    const ledger = await permitLedger(p.a.pool, permitId);
    expect(ledger).toEqual({ reserved: 0n, charged, settled: 0n, unsettleable: 0n });
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
    const load = (): Promise<number> => offerInFlight(p.a.pool, offerId);
    expect(await load()).toBe(M);

    // Requests coming and going from both processes never push the load above M.
    let peak = 0;
    let stop = false;
    const watcher = (async () => {
      while (!stop) peak = Math.max(peak, await load());
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
    await heartbeat(p.a.pool, dead, NOW - 600);
    const permitId = hex32();
    const offerId = hex32();
    const inputs = Array.from({ length: 30 }, () =>
      reservation({
        permitId,
        offerId,
        maximumCredits: 100n,
        deposit: 10_000n,
        instanceId: dead,
        createdAt: NOW - 600,
      }),
    );
    for (const input of inputs) expect(await reserve(p.a.pool, input)).toEqual({ ok: true });

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

    const ledger = await permitLedger(p.a.pool, permitId);
    expect(ledger).toEqual({
      reserved: 0n,
      charged: 50n * BigInt(finalizedByOwner),
      settled: 0n,
      unsettleable: 0n,
    });
    const { rows } = await p.a.pool.query<{ in_flight: number; orphaned: string }>(
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

    const { rows } = await p.a.pool.query<{ offer_id: string; in_flight: number; open: string }>(
      `SELECT l.offer_id, l.in_flight,
              (SELECT count(*) FROM inference_requests r
               WHERE r.offer_id = l.offer_id AND r.status = 'pending') AS open
       FROM offer_loads l WHERE l.offer_id = ANY($1)`,
      [offers],
    );
    for (const row of rows) expect(row.in_flight).toBe(Number(row.open));
    expect(rows.reduce((s, r) => s + r.in_flight, 0)).toBe(inputs.length);
    const { rows: sums } = await p.a.pool.query<{ open: string }>(
      `SELECT COALESCE(sum(maximum_credits), 0)::text AS open FROM inference_requests
       WHERE permit_id = $1 AND status = 'pending'`,
      [permitId],
    );
    expect((await permitLedger(p.a.pool, permitId)).reserved).toBe(BigInt(sums[0]!.open));
  });
});

describeIfPostgres("batched reservations and finalisations from two gateway processes", () => {
  const p = twoProcesses();

  it("does not deadlock and keeps the invariants on two shared permits and offers", async () => {
    const M = 12;
    const deposit = 15_000n;
    const permits = [hex32(), hex32()];
    const offers = [hex32(), hex32()];
    // Two batchers per process, one of them with several batches in flight; the single calls
    // and failovers run alongside.
    const batchers = [
      createLedgerBatcher(p.a.pool),
      createLedgerBatcher(p.b.pool),
      createLedgerBatcher(p.a.pool, { maxInFlight: 3 }),
      createLedgerBatcher(p.b.pool, { maxInFlight: 2, maxBatch: 8 }),
    ];
    const singles = [p.a.pool, p.b.pool];
    type Ledger = {
      reserve(input: ReserveInput): Promise<ReserveResult>;
      finalize(input: FinalizeInput): Promise<FinalizeResult>;
    };
    const ledgers: Ledger[] = [
      ...batchers,
      ...singles.map((pool) => ({
        reserve: (input: ReserveInput) => reserve(pool, input),
        finalize: (input: FinalizeInput) => finalize(pool, input),
      })),
    ];
    // Mostly batched.
    const pick = (): Ledger => ledgers[randomInt(0, 10) < 8 ? randomInt(0, 4) : randomInt(4, 6)]!;

    const errors: unknown[] = [];
    const violations: string[] = [];
    const admitted: { requestId: string; charge: bigint; results: FinalizeResult[] }[] = [];
    const refusals = new Map<string, number>();

    const watcher = new pg.Client({ connectionString: p.url });
    await watcher.connect();
    let watching = true;
    let observations = 0;
    const watch = (async () => {
      while (watching) {
        const { rows } = await watcher.query<{ kind: string; id: string; a: string; b: string }>(
          `SELECT 'permit' AS kind, permit_id AS id, reserved::text AS a, charged::text AS b
             FROM permit_ledgers WHERE permit_id = ANY($1)
           UNION ALL
           SELECT 'offer', offer_id, in_flight::text, '0' FROM offer_loads WHERE offer_id = ANY($2)`,
          [permits, offers],
        );
        for (const row of rows) {
          if (row.kind === "permit" && BigInt(row.a) + BigInt(row.b) > deposit) {
            violations.push(`permit ${row.id}: reserved ${row.a} + charged ${row.b} > ${deposit}`);
          }
          if (row.kind === "offer" && Number(row.a) > M) {
            violations.push(`offer ${row.id}: ${row.a} in flight > ${M}`);
          }
        }
        observations++;
      }
    })();

    const deadline = Date.now() + 3_000;
    const worker = async (): Promise<void> => {
      while (Date.now() < deadline) {
        const pi = randomInt(0, 2);
        const o = randomInt(0, 2);
        const maximumCredits = BigInt(randomInt(100, 1_000));
        const input = reservation({
          permitId: permits[pi]!,
          offerId: offers[o]!,
          maximumCredits,
          deposit,
          maxConcurrency: M,
        });
        let result: ReserveResult;
        try {
          result = await pick().reserve(input);
        } catch (error) {
          errors.push(error);
          continue;
        }
        if (!result.ok) {
          refusals.set(result.reason, (refusals.get(result.reason) ?? 0) + 1);
          await setTimeout(randomInt(0, 3));
          continue;
        }
        let maximum = maximumCredits;
        if (randomInt(0, 5) === 0) {
          // Failover to the other offer, which locks both offers' rows.
          const grown = BigInt(randomInt(100, 1_000));
          try {
            const moved = await switchOffer(singles[randomInt(0, 2)]!, {
              requestId: input.requestId,
              offerId: offers[1 - o]!,
              maximumCredits: grown,
              tariffVersion: 2n,
              maxConcurrency: M,
              deposit,
              chainSettled: 0n,
            });
            if (moved) maximum = grown;
          } catch (error) {
            errors.push(error);
          }
        }
        await setTimeout(randomInt(0, 5));
        const charge = (maximum * BigInt(randomInt(0, 1_000))) / 4_000n;
        const closing = completion(input.requestId, charge);
        // Sometimes twice at once, through two different ledgers.
        const times = randomInt(0, 4) === 0 ? 2 : 1;
        const results = await Promise.allSettled(
          Array.from({ length: times }, () => pick().finalize(closing)),
        );
        const done: FinalizeResult[] = [];
        for (const r of results) {
          if (r.status === "fulfilled") done.push(r.value);
          else errors.push(r.reason);
        }
        admitted.push({ requestId: input.requestId, charge, results: done });
      }
    };
    try {
      await Promise.all(Array.from({ length: 48 }, worker));
    } finally {
      watching = false;
      await watch;
      await watcher.end();
    }

    expect(errors).toEqual([]);
    expect(violations).toEqual([]);
    expect(observations).toBeGreaterThan(0);
    expect(admitted.length).toBeGreaterThan(100);
    expect(refusals.get("offer_at_capacity") ?? 0).toBeGreaterThan(0);
    // The batchers did batch.
    const sent = batchers.map((x) => x.stats());
    const items = sent.reduce((n, s) => n + s.reserve.items + s.finalize.items, 0);
    const batches = sent.reduce((n, s) => n + s.reserve.batches + s.finalize.batches, 0);
    expect(items / batches).toBeGreaterThan(1.5);

    // Each admitted request was finalized exactly once, by one of its finalize calls.
    let charged = 0n;
    for (const x of admitted) {
      expect(x.results.filter((r) => r.finalized)).toHaveLength(1);
      const first = x.results.find((r) => r.finalized)!;
      for (const r of x.results) expect(r.creditsCharged).toBe(first.creditsCharged);
      expect(first.creditsCharged).toBe(x.charge);
      charged += first.creditsCharged;
    }
    const { rows: open } = await p.a.pool.query<{ n: string; final: string }>(
      `SELECT count(*) FILTER (WHERE status IN ('pending', 'streaming')) AS n,
              count(*) FILTER (WHERE status = 'completed') AS final
       FROM inference_requests WHERE permit_id = ANY($1)`,
      [permits],
    );
    expect(open[0]).toEqual({ n: "0", final: String(admitted.length) });
    const permitLedgers = await Promise.all(
      permits.map((permit) => permitLedger(p.a.pool, permit)),
    );
    for (const l of permitLedgers) {
      expect(l.reserved).toBe(0n);
      expect(l.charged <= deposit).toBe(true);
    }
    expect(permitLedgers.reduce((s, l) => s + l.charged, 0n)).toBe(charged);
    const { rows: loads } = await p.a.pool.query<{ in_flight: number }>(
      "SELECT in_flight FROM offer_loads WHERE offer_id = ANY($1)",
      [offers],
    );
    expect(loads.map((l) => l.in_flight)).toEqual([0, 0]);
  });
});

describeIfPostgres(
  "an authorization's total cap shared by two gateway processes (issue 28, item 7)",
  () => {
    const p = twoProcesses();

    /** The cap's ledger row, read from its own connection. */
    async function capLedger(client: pg.Client | pg.Pool, authorizationId: string) {
      const { rows } = await client.query<{ reserved: string; used: string }>(
        "SELECT reserved, used FROM authorization_ledgers WHERE authorization_id = $1",
        [authorizationId],
      );
      const row = rows[0];
      return row === undefined
        ? { reserved: 0n, used: 0n }
        : { reserved: BigInt(row.reserved), used: BigInt(row.used) };
    }

    it("admits exactly K of 8·K concurrent capped requests when the cap covers K, single and batched, and its use ends as the sum of the charges", async () => {
      const K = 12;
      const maximum = 1_000n;
      const cap = maximum * BigInt(K);
      const key = await createApiKey(p.a.pool, "caps");
      const authorizationId = `pauth_${randomBytes(12).toString("hex")}`;
      await insertPermitAuthorization(
        p.a.pool,
        {
          id: authorizationId,
          apiKeyId: key.id,
          payer: `0x${"aa".repeat(20)}`,
          permitId: hex32().toLowerCase() as Hex,
          expiresAt: NOW + 3600,
          issuedAt: NOW,
          totalCap: cap,
          perRequestCap: maximum,
          period: "",
          periodCap: 0n,
          warnAt: 0n,
          createdAt: NOW,
          revokedAt: null,
          revokedBy: null,
        },
        { nonce: randomBytes(8).toString("hex"), signature: `0x${"11".repeat(65)}` },
      );
      const batchers = [createLedgerBatcher(p.a.pool), createLedgerBatcher(p.b.pool)];
      // One permit and one offer per request, each with ample credit: their row locks would
      // serialize the transactions and hide a race on the cap's row, the one thing they share.
      const inputs = Array.from({ length: 8 * K }, () =>
        reservation({
          permitId: hex32(),
          offerId: hex32(),
          maximumCredits: maximum,
          deposit: 10n * maximum,
          authorizationId,
          capped: true,
        }),
      );
      const watcher = new pg.Client({ connectionString: p.url });
      await watcher.connect();
      const violations: string[] = [];
      let stop = false;
      const watching = (async () => {
        while (!stop) {
          const l = await capLedger(watcher, authorizationId);
          if (l.reserved + l.used > cap) violations.push(`${l.reserved} + ${l.used} > ${cap}`);
        }
      })();
      try {
        const results = await Promise.all(
          inputs.map((input, i) =>
            // Alternately each process's single call and its batcher (group commit).
            i % 4 < 2 ? reserve(poolOf(p, i), input) : batchers[i % 2]!.reserve(input),
          ),
        );
        const admitted = inputs.filter((_, i) => results[i]!.ok);
        expect(admitted).toHaveLength(K);
        expect(new Set(results.filter((r) => !r.ok).map((r) => !r.ok && r.reason))).toEqual(
          new Set(["authorization_cap_exhausted"]),
        );
        expect(await capLedger(p.a.pool, authorizationId)).toEqual({ reserved: cap, used: 0n });
        const { rows } = await p.a.pool.query<{ n: string }>(
          "SELECT count(*) AS n FROM inference_requests WHERE authorization_id = $1 AND authorization_capped",
          [authorizationId],
        );
        expect(rows[0]!.n).toBe(String(K));

        // Closed concurrently, each twice (once from each process), with random charges.
        const charges = admitted.map(() => BigInt(randomInt(0, 1_200)));
        await Promise.all(
          admitted.flatMap((input, i) =>
            [0, 1].map((process) =>
              process === 0
                ? finalize(poolOf(p, i), completion(input.requestId, charges[i]!))
                : batchers[(i + 1) % 2]!.finalize(completion(input.requestId, charges[i]!)),
            ),
          ),
        );
        const used = charges.reduce((s, c) => s + (c < maximum ? c : maximum), 0n);
        expect(await capLedger(p.a.pool, authorizationId)).toEqual({ reserved: 0n, used });
      } finally {
        stop = true;
        await watching;
        await watcher.end();
      }
      expect(violations).toEqual([]);
    });
  },
);

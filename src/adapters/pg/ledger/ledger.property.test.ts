import { randomBytes } from "node:crypto";
import fc from "fast-check";
import type { Hex } from "viem";
import { expect, it } from "vitest";
import { useTestDatabase } from "../../../../test/helpers/db.js";
import {
  finalize,
  heartbeat,
  markStreaming,
  reconcileOrphans,
  reserve,
  switchOffer,
} from "./index.js";
import type { ReserveResult } from "../../../domain/chat/ports.js";
import type { Billing, FinalRequestStatus, RequestStatus } from "../requests.js";

// Drives the ledger with random sequences of operations against a small model of it, and after
// every step checks the database against the model and the invariants of DESIGN.md section 3.
// Each run uses its own permits, offers, instances and request ids, so runs (and fast-check's
// shrinking, which replays runs) do not see each other's rows.

const test = useTestDatabase();

const NOW = 1_800_000_000;
const STALE_AFTER = 60;
/** Requests are made this long before `NOW`, so that those of the dead process are stale. */
const CREATED_AT = NOW - 1_000;

type Op =
  | { kind: "reserve"; permit: number; offer: number; max: bigint; dead: boolean }
  | { kind: "reuseQuote"; target: number }
  | { kind: "stream"; target: number }
  | {
      kind: "finalize";
      target: number;
      charge: bigint;
      status: FinalRequestStatus;
      billing: Billing;
    }
  | { kind: "switch"; target: number; offer: number; max: bigint }
  | { kind: "reconcile" }
  | { kind: "settle"; permit: number };

const PERMITS = 2;
const OFFERS = 2;

const opArb: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 4,
    arbitrary: fc.record({
      kind: fc.constant("reserve" as const),
      permit: fc.nat({ max: PERMITS - 1 }),
      offer: fc.nat({ max: OFFERS - 1 }),
      max: fc.bigInt({ min: 0n, max: 3_000n }),
      dead: fc.boolean(),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({ kind: fc.constant("reuseQuote" as const), target: fc.nat() }),
  },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("stream" as const), target: fc.nat() }) },
  {
    weight: 4,
    arbitrary: fc.record({
      kind: fc.constant("finalize" as const),
      target: fc.nat(),
      // Often above the maximum, to exercise the clamp.
      charge: fc.bigInt({ min: 0n, max: 4_000n }),
      status: fc.constantFrom<FinalRequestStatus>("completed", "failed", "cancelled"),
      billing: fc.constantFrom<Billing>("billed", "partial", "void"),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      kind: fc.constant("switch" as const),
      target: fc.nat(),
      offer: fc.nat({ max: OFFERS - 1 }),
      max: fc.bigInt({ min: 0n, max: 3_000n }),
    }),
  },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("reconcile" as const) }) },
  {
    weight: 1,
    arbitrary: fc.record({ kind: fc.constant("settle" as const), permit: fc.nat({ max: 1 }) }),
  },
);

const permitArb = fc
  .bigInt({ min: 0n, max: 6_000n })
  .chain((deposit) =>
    fc.record({ deposit: fc.constant(deposit), external: fc.bigInt({ min: 0n, max: deposit }) }),
  );

const scenarioArb = fc.record({
  permits: fc.array(permitArb, { minLength: PERMITS, maxLength: PERMITS }),
  maxConcurrency: fc.array(fc.integer({ min: 0, max: 4 }), {
    minLength: OFFERS,
    maxLength: OFFERS,
  }),
  ops: fc.array(opArb, { minLength: 1, maxLength: 20 }),
});

interface ModelPermit {
  id: Hex;
  deposit: bigint;
  /** Settled on chain: by other gateways (`external`) plus what this gateway settled. */
  chainSettled: bigint;
  reserved: bigint;
  charged: bigint;
  settled: bigint;
}

interface ModelRequest {
  id: string;
  quoteId: string;
  permit: number;
  offer: number;
  status: RequestStatus;
  maximum: bigint;
  charged: bigint | null;
  dead: boolean;
  finalizations: number;
}

interface Scenario {
  permits: { deposit: bigint; external: bigint }[];
  maxConcurrency: number[];
  ops: Op[];
}

function hex32(): Hex {
  return `0x${randomBytes(32).toString("hex")}`;
}

function describeOp(op: Op): string {
  return JSON.stringify(op, (_, v: unknown) => (typeof v === "bigint" ? `${v}n` : v));
}

const isOpen = (r: ModelRequest): boolean => r.status === "pending" || r.status === "streaming";

function available(p: ModelPermit): bigint {
  const beyond = p.chainSettled - p.settled;
  return p.deposit - (p.charged + (beyond > 0n ? beyond : 0n)) - p.reserved;
}

async function runScenario(scenario: Scenario): Promise<void> {
  const pool = test.db.pool;
  const run = randomBytes(6).toString("hex");
  const live = `live_${run}`;
  const dead = `dead_${run}`;
  await heartbeat(pool, live, NOW);
  await heartbeat(pool, dead, CREATED_AT);

  const permits: ModelPermit[] = scenario.permits.map((p) => ({
    id: hex32(),
    deposit: p.deposit,
    chainSettled: p.external,
    reserved: 0n,
    charged: 0n,
    settled: 0n,
  }));
  const offers = scenario.maxConcurrency.map((max) => ({ id: hex32(), max }));
  const requests: ModelRequest[] = [];
  const openOn = (offer: number): number =>
    requests.filter((r) => isOpen(r) && r.offer === offer).length;
  const pick = (target: number): ModelRequest | undefined => requests[target % requests.length];

  for (const [step, op] of scenario.ops.entries()) {
    const where = `step ${step}: ${describeOp(op)}`;
    switch (op.kind) {
      case "reserve": {
        const permit = permits[op.permit]!;
        const offer = offers[op.offer]!;
        const id = `req_${run}_${requests.length}`;
        const quoteId = `qt_${run}_${requests.length}`;
        const modelId = hex32();
        const expected: ReserveResult =
          openOn(op.offer) >= offer.max
            ? { ok: false, reason: "offer_at_capacity" }
            : available(permit) < op.max
              ? { ok: false, reason: "insufficient_credits" }
              : { ok: true };
        const result = await reserve(pool, {
          requestId: id,
          apiKeyId: "key_prop",
          instanceId: op.dead ? dead : live,
          model: "org/model",
          modelId,
          offerId: offer.id,
          permitId: permit.id,
          quoteId,
          stream: true,
          maximumCredits: op.max,
          tariffVersion: 1n,
          inputTokens: 10n,
          deposit: permit.deposit,
          chainSettled: permit.chainSettled,
          maxConcurrency: offer.max,
          createdAt: CREATED_AT,
          quote: {
            quoteId,
            apiKeyId: "key_prop",
            model: "org/model",
            modelId,
            offerId: offer.id,
            tariffVersion: 1n,
            inputTokens: 10n,
            maxOutputTokens: 10n,
            wakesEndpoint: false,
            maximumCredits: op.max,
            fingerprint: "0".repeat(64),
            createdAt: CREATED_AT,
            expiresAt: CREATED_AT + 60,
            internal: true,
          },
        });
        expect(result, where).toEqual(expected);
        if (result.ok) {
          permit.reserved += op.max;
          requests.push({
            id,
            quoteId,
            permit: op.permit,
            offer: op.offer,
            status: "pending",
            maximum: op.max,
            charged: null,
            dead: op.dead,
            finalizations: 0,
          });
        }
        break;
      }
      case "reuseQuote": {
        const used = pick(op.target);
        if (!used) break;
        const result = await reserve(pool, {
          requestId: `req_${run}_reuse_${step}`,
          apiKeyId: "key_prop",
          instanceId: live,
          model: "org/model",
          modelId: hex32(),
          offerId: offers[used.offer]!.id,
          permitId: permits[used.permit]!.id,
          quoteId: used.quoteId,
          stream: false,
          maximumCredits: 0n,
          tariffVersion: 1n,
          inputTokens: 10n,
          deposit: permits[used.permit]!.deposit,
          chainSettled: permits[used.permit]!.chainSettled,
          maxConcurrency: 100,
          createdAt: CREATED_AT,
        });
        expect(result, where).toEqual({ ok: false, reason: "quote_used" });
        break;
      }
      case "stream": {
        const request = pick(op.target);
        if (!request) break;
        const expected = request.status === "pending";
        expect(await markStreaming(pool, request.id), where).toBe(expected);
        if (expected) request.status = "streaming";
        break;
      }
      case "finalize": {
        const request = pick(op.target);
        if (!request) break;
        const charge = op.billing === "void" ? 0n : op.charge;
        const result = await finalize(pool, {
          requestId: request.id,
          status: op.status,
          inputTokens: 10n,
          outputTokens: 20n,
          creditsCharged: charge,
          billing: op.billing,
          usageSource: "provider",
          now: NOW,
        });
        if (isOpen(request)) {
          const clamped = charge < request.maximum ? charge : request.maximum;
          expect(result, where).toEqual({ finalized: true, creditsCharged: clamped });
          const permit = permits[request.permit]!;
          permit.reserved -= request.maximum;
          permit.charged += clamped;
          request.status = op.status;
          request.charged = clamped;
          request.finalizations++;
        } else {
          expect(result, where).toEqual({ finalized: false, creditsCharged: request.charged });
        }
        break;
      }
      case "switch": {
        const request = pick(op.target);
        if (!request) break;
        const permit = permits[request.permit]!;
        const offer = offers[op.offer]!;
        const growth = op.max - request.maximum;
        const expected =
          request.status === "pending" &&
          (op.offer === request.offer || openOn(op.offer) < offer.max) &&
          (growth <= 0n || available(permit) >= growth);
        const result = await switchOffer(pool, {
          requestId: request.id,
          offerId: offer.id,
          maximumCredits: op.max,
          tariffVersion: 2n,
          maxConcurrency: offer.max,
          deposit: permit.deposit,
          chainSettled: permit.chainSettled,
        });
        expect(result, where).toBe(expected);
        if (expected) {
          permit.reserved += growth;
          request.offer = op.offer;
          request.maximum = op.max;
        }
        break;
      }
      case "reconcile": {
        const orphans = requests.filter((r) => isOpen(r) && r.dead);
        // Other runs' orphans may be reconciled by this call too, hence "at least".
        const count = await reconcileOrphans(pool, { now: NOW, staleAfterSeconds: STALE_AFTER });
        expect(count, where).toBeGreaterThanOrEqual(orphans.length);
        for (const r of orphans) {
          permits[r.permit]!.reserved -= r.maximum;
          r.status = "failed";
          r.charged = 0n;
          r.finalizations++;
        }
        break;
      }
      case "settle": {
        // This gateway's settlement of everything charged lands on chain.
        const permit = permits[op.permit]!;
        await pool.query("UPDATE permit_ledgers SET settled = charged WHERE permit_id = $1", [
          permit.id,
        ]);
        permit.chainSettled += permit.charged - permit.settled;
        permit.settled = permit.charged;
        break;
      }
    }
    await checkInvariants(run, permits, offers, requests, where);
  }
}

async function checkInvariants(
  run: string,
  permits: ModelPermit[],
  offers: { id: Hex; max: number }[],
  requests: ModelRequest[],
  where: string,
): Promise<void> {
  // One query for everything, as it runs after every step.
  const { rows } = await test.db.pool.query<{
    state: {
      ledgers: { permit_id: string; reserved: string; charged: string; settled: string }[] | null;
      loads: { offer_id: string; in_flight: number }[] | null;
      requests:
        | {
            id: string;
            permit_id: string;
            offer_id: string;
            status: RequestStatus;
            maximum_credits: string;
            credits_charged: string | null;
          }[]
        | null;
    };
  }>(
    `SELECT json_build_object(
       'ledgers', (SELECT json_agg(json_build_object('permit_id', permit_id,
                     'reserved', reserved::text, 'charged', charged::text,
                     'settled', settled::text))
                   FROM permit_ledgers WHERE permit_id = ANY($1)),
       'loads', (SELECT json_agg(json_build_object('offer_id', offer_id, 'in_flight', in_flight))
                 FROM offer_loads WHERE offer_id = ANY($2)),
       'requests', (SELECT json_agg(json_build_object('id', id, 'permit_id', permit_id,
                      'offer_id', offer_id, 'status', status,
                      'maximum_credits', maximum_credits::text,
                      'credits_charged', credits_charged::text))
                    FROM inference_requests WHERE id LIKE $3)
     ) AS state`,
    [permits.map((p) => p.id), offers.map((o) => o.id), `req\\_${run}\\_%`],
  );
  const state = rows[0]!.state;
  const dbRequests = state.requests ?? [];

  // Only admitted requests exist, each as the model has it, never charged above its maximum.
  expect(dbRequests.length, where).toBe(requests.length);
  for (const r of requests) {
    const row = dbRequests.find((x) => x.id === r.id);
    expect(row, where).toBeDefined();
    expect(row!.status, where).toBe(r.status);
    expect(BigInt(row!.maximum_credits), where).toBe(r.maximum);
    expect(row!.credits_charged === null ? null : BigInt(row!.credits_charged), where).toBe(
      r.charged,
    );
    expect(row!.offer_id, where).toBe(offers[r.offer]!.id);
    if (row!.credits_charged !== null) {
      expect(BigInt(row!.credits_charged) <= BigInt(row!.maximum_credits), where).toBe(true);
    }
    expect(r.finalizations, where).toBeLessThanOrEqual(1);
    expect(r.finalizations === 1, where).toBe(!isOpen(r));
  }

  for (const [index, permit] of permits.entries()) {
    const row = state.ledgers?.find((l) => l.permit_id === permit.id);
    const ledger = {
      reserved: BigInt(row?.reserved ?? 0),
      charged: BigInt(row?.charged ?? 0),
      settled: BigInt(row?.settled ?? 0),
    };
    expect(ledger, where).toEqual({
      reserved: permit.reserved,
      charged: permit.charged,
      settled: permit.settled,
    });
    const mine = dbRequests.filter((r) => r.permit_id === permit.id);
    const open = mine.filter((r) => r.status === "pending" || r.status === "streaming");
    const final = mine.filter((r) => r.status !== "pending" && r.status !== "streaming");
    // reserved == the open requests' maxima; charged == the final requests' charges.
    expect(ledger.reserved, where).toBe(open.reduce((s, r) => s + BigInt(r.maximum_credits), 0n));
    expect(ledger.charged, where).toBe(
      final.reduce((s, r) => s + BigInt(r.credits_charged ?? 0), 0n),
    );
    expect(requests.filter((r) => r.permit === index && isOpen(r)).length, where).toBe(open.length);
    // Settled on chain + unsettled charges + open reservations <= deposit.
    expect(
      permit.chainSettled + (ledger.charged - ledger.settled) + ledger.reserved <= permit.deposit,
      where,
    ).toBe(true);
  }

  for (const [index, offer] of offers.entries()) {
    const inFlight = state.loads?.find((l) => l.offer_id === offer.id)?.in_flight ?? 0;
    const open = dbRequests.filter(
      (r) => r.offer_id === offer.id && (r.status === "pending" || r.status === "streaming"),
    ).length;
    expect(inFlight, where).toBe(open);
    expect(inFlight, where).toBe(requests.filter((r) => r.offer === index && isOpen(r)).length);
    // Never above max_concurrency.
    expect(inFlight, where).toBeLessThanOrEqual(offer.max);
  }
}

it("keeps the ledger's invariants under random sequences of operations", async () => {
  // PGlite takes ~10 ms a statement: fewer runs there, many more on a real PostgreSQL.
  const numRuns = test.db.kind === "pglite" ? 20 : 150;
  await fc.assert(fc.asyncProperty(scenarioArb, runScenario), { numRuns });
}, 120_000);

import { chatEvents } from "../../../test/helpers/chat-events.js";
import fc from "fast-check";
import type { Hex } from "viem";
import { expect, it } from "vitest";
import {
  now,
  offerA,
  permitId,
  testCatalog,
  testOffer,
  testPermit,
  upstreamReply,
  payerAuthority,
} from "../../../test/helpers/chat-market.js";
import { createInference, type ChatEvent, type Ledger } from "./index.js";

// The request lifecycle under random interleavings of client aborts, upstream failures, database
// failures and recovery, and the loss of the serving process (the orphan rule closing its
// requests), against an in-memory ledger with the SQL ledger's semantics. After each run and a
// recovery (housekeeping writes the outbox): every request closed exactly once, every
// reservation and offer slot released, 0 <= charge <= maximum, and the permit never promised
// beyond its deposit at any moment.

const deposit = 5_000n;
const offer = testOffer(offerA, {
  // 1 credit per input token and 10 per output token (per MTok = 1e6).
  tariff: {
    version: 1n,
    inputPricePerMTok: 1_000_000n,
    outputPricePerMTok: 10_000_000n,
    wakeFee: 0n,
  },
  maxConcurrency: 3,
  capabilities: { max_output_tokens: 8 },
});

interface Scenario {
  readonly stream: boolean;
  readonly upstream: "ok" | "fail_before" | "fail_mid" | "no_usage";
  readonly chunks: number;
  /** When the client leaves: never, during the reservation, or after this many chunks. */
  readonly abort: "never" | "reserving" | number;
  /** Database failures: the reservation throws; the first n close attempts throw. */
  readonly reserveFails: boolean;
  readonly closeFailures: number;
  /** The serving process looks dead after this many chunks: the orphan rule closes it. */
  readonly orphanAfter: number | undefined;
}

const scenarioArb: fc.Arbitrary<Scenario> = fc.record({
  stream: fc.boolean(),
  upstream: fc.constantFrom(
    "ok" as const,
    "fail_before" as const,
    "fail_mid" as const,
    "no_usage" as const,
  ),
  chunks: fc.integer({ min: 1, max: 4 }),
  abort: fc.oneof(
    fc.constant("never" as const),
    fc.constant("reserving" as const),
    fc.integer({ min: 0, max: 4 }),
  ),
  reserveFails: fc.boolean(),
  closeFailures: fc.integer({ min: 0, max: 6 }),
  orphanAfter: fc.option(fc.integer({ min: 0, max: 3 }), { nil: undefined }),
});

interface Row {
  maximum: bigint;
  open: boolean;
  status: "pending" | "streaming" | "closed";
  charge: bigint | undefined;
  closes: number;
}

/** The SQL ledger's semantics in memory: conditional admission, exactly-once close. */
function memoryLedger() {
  const rows = new Map<Hex, Row>();
  let reserved = 0n;
  let charged = 0n;
  let inFlight = 0;
  const violations: string[] = [];
  const check = () => {
    if (charged + reserved > deposit) violations.push(`charged ${charged} + reserved ${reserved}`);
    if (inFlight < 0 || inFlight > offer.maxConcurrency) violations.push(`in flight ${inFlight}`);
  };
  const close = (
    requestId: Hex,
    credits: bigint,
  ): { finalized: boolean; creditsCharged: bigint } => {
    const row = rows.get(requestId);
    if (row === undefined || !row.open)
      return { finalized: false, creditsCharged: row?.charge ?? 0n };
    const charge = credits < row.maximum ? credits : row.maximum;
    row.open = false;
    row.status = "closed";
    row.charge = charge;
    row.closes++;
    reserved -= row.maximum;
    charged += charge;
    inFlight--;
    check();
    return { finalized: true, creditsCharged: charge };
  };
  return {
    rows,
    violations,
    totals: () => ({ reserved, charged, inFlight }),
    reserve(
      requestId: Hex,
      maximum: bigint,
    ): { ok: true } | { ok: false; reason: "insufficient_credits" | "offer_at_capacity" } {
      if (inFlight >= offer.maxConcurrency) return { ok: false, reason: "offer_at_capacity" };
      if (deposit - charged - reserved < maximum)
        return { ok: false, reason: "insufficient_credits" };
      rows.set(requestId, { maximum, open: true, status: "pending", charge: undefined, closes: 0 });
      reserved += maximum;
      inFlight++;
      check();
      return { ok: true };
    },
    markStreaming(requestId: Hex): boolean {
      const row = rows.get(requestId);
      if (row === undefined || !row.open) return false;
      row.status = "streaming";
      return true;
    },
    close,
    /** The orphan rule: another process closes a dead process's request void. */
    orphan: (requestId: Hex) => close(requestId, 0n),
  };
}

async function runScenarios(scenarios: readonly Scenario[]): Promise<void> {
  const db = memoryLedger();
  const client = scenarios.map(() => new AbortController());
  const closeFailures = scenarios.map((s) => s.closeFailures);
  // Which scenario a request id belongs to (set when it reserves).
  const owner = new Map<Hex, number>();
  let reserving = 0;
  const ledger: Ledger = {
    reserve: async (input) => {
      const index = reserving++;
      const s = scenarios[index]!;
      owner.set(input.requestId, index);
      if (s.abort === "reserving") client[index]!.abort(new Error("client left"));
      if (s.reserveFails) throw new Error("connection reset");
      return db.reserve(input.requestId, input.maximumCredits);
    },
    markStreaming: async (requestId) => db.markStreaming(requestId),
    finalize: async (input) => {
      const index = owner.get(input.requestId)!;
      if (closeFailures[index]! > 0) {
        closeFailures[index]!--;
        throw new Error("the database refuses writes");
      }
      if (input.billing === "void" && input.creditsCharged !== 0n)
        throw new Error("void with a charge");
      return db.close(input.requestId, input.creditsCharged);
    },
    switchOffer: async () => false,
    recordOfferFlag: async () => undefined,
  };

  const completion = (s: Scenario) =>
    s.upstream === "no_usage"
      ? { choices: [{ message: { content: "x".repeat(8 * s.chunks) } }] }
      : {
          choices: [{ message: { content: "hi" } }],
          usage: { prompt_tokens: 3, completion_tokens: s.chunks },
        };
  const inference = createInference({
    catalog: testCatalog(() => [offer]),
    permits: { get: async () => testPermit(deposit), invalidate: () => undefined },
    quotes: { insert: async () => undefined, get: async () => undefined },
    ledger,
    endpoints: async () => ({ url: "http://provider.test" }),
    upstream: async (_endpoint, body, { signal }) => {
      const { user } = JSON.parse(new TextDecoder().decode(body)) as { user: string };
      const index = Number(user);
      const s = scenarios[index]!;
      if (signal.aborted) throw new Error("aborted");
      if (s.upstream === "fail_before")
        return upstreamReply(
          503,
          async () => "{}",
          async function* () {},
        );
      const requestId = [...owner].find(([, i]) => i === index)![0];
      return upstreamReply(
        200,
        async () => JSON.stringify(completion(s)),
        async function* () {
          for (let i = 0; i < s.chunks; i++) {
            if (s.orphanAfter === i) db.orphan(requestId);
            if (s.abort === i) client[index]!.abort(new Error("client left"));
            if (s.upstream === "fail_mid" && i === s.chunks - 1) throw new Error("reset");
            yield JSON.stringify({ choices: [{ delta: { content: "t" } }] });
            await Promise.resolve();
          }
          if (s.upstream !== "no_usage")
            yield JSON.stringify({
              choices: [],
              usage: { prompt_tokens: 3, completion_tokens: s.chunks },
            });
          yield "[DONE]";
        },
      );
    },
    idempotency: {
      claim: async () => ({ state: "claimed" }),
      begin: async () => undefined,
      complete: async () => undefined,
      release: async () => undefined,
    },
    clock: () => now,
    bodyLimitBytes: 1 << 20,
  });

  // Every request at once: their steps interleave on the event loop.
  await Promise.all(
    scenarios.map(async (s, index) => {
      const events: ChatEvent[] = [];
      try {
        for await (const event of chatEvents(inference, {
          apiKeyId: "key",
          authority: payerAuthority,
          body: new TextEncoder().encode(
            JSON.stringify({
              model: "m",
              messages: [{ role: "user", content: "hello" }],
              stream: s.stream,
              user: String(index),
            }),
          ),
          permitId,
          quoteId: undefined,
          idempotencyKey: undefined,
          signal: client[index]!.signal,
        })) {
          events.push(event);
          if (client[index]!.signal.aborted) break;
        }
      } catch {
        // An error answer is an outcome like any other; the ledger is what is checked.
      }
      const done = events.find((e) => e.type === "completed");
      if (done?.type === "completed") {
        expect(done.creditsCharged).toBeGreaterThanOrEqual(0n);
        expect(done.creditsCharged).toBeLessThanOrEqual(
          (events[0] as Extract<ChatEvent, { type: "started" }>).maximumCredits,
        );
      }
    }),
  );

  // Recovery: the database takes writes again and housekeeping writes the outbox.
  closeFailures.fill(0);
  expect(await inference.retryCloses()).toMatchObject({ pending: 0 });

  expect(db.violations).toEqual([]);
  for (const [requestId, row] of db.rows) {
    expect({ requestId, open: row.open, closes: row.closes }).toEqual({
      requestId,
      open: false,
      closes: 1,
    });
    expect(row.charge! >= 0n && row.charge! <= row.maximum).toBe(true);
  }
  expect(db.totals()).toMatchObject({ reserved: 0n, inFlight: 0 });
}

it("closes every request exactly once and releases everything, whatever fails and when", async () => {
  await fc.assert(
    fc.asyncProperty(fc.array(scenarioArb, { minLength: 1, maxLength: 4 }), runScenarios),
    { numRuns: 50 },
  );
}, 60_000);

import { chatEvents } from "../../../test/helpers/chat-events.js";
import type { Hex } from "viem";
import { httpStatusOf } from "../../connect/error-codes.js";
import { describe, expect, it, vi } from "vitest";
import type { OfferRecord } from "../catalog.js";
import {
  modelId,
  now,
  offerA,
  offerB,
  permitId,
  testCatalog,
  testOffer,
  testPermit,
  upstreamReply,
  payer,
  payerAuthority,
} from "../../../test/helpers/chat-market.js";
import { BatcherOverloadError } from "../../adapters/pg/batcher.js";
import { GatewayError } from "../errors.js";
import {
  anyPermit,
  createKeyAuthorities,
  periodEnd,
  periodStart,
  type AuthorizationPeriod,
  type SpendingAuthority,
} from "../permit-authorization/index.js";
import { CheckedSink } from "../../../test/helpers/checked-sink.js";
import {
  createInference,
  type AnswerController,
  type ChatChunk,
  type ChatCompleted,
  type ChatEvent,
  type ChatInput,
  type Ledger,
  type QuoteRecord,
  type QuoteStore,
  type UpstreamChat,
  type UpstreamReply,
} from "./index.js";
import { parseChatRequest } from "./request/index.js";
import type { WakeFees } from "./wake-fees.js";
import { flowFromEvents } from "../../../test/helpers/upstream-flow.js";
import { countersOf, perCharacter, runsCounter } from "../../../test/helpers/exact-counter.js";
import type { PermitReader as PermitSource } from "../permits.js";
import type { TokenCounters } from "../tokens.js";

// The pipeline against in-memory ports: what the integration suites cannot provoke on demand.

function offer(offerId: Hex, inputPrice: bigint): OfferRecord {
  return testOffer(offerId, {
    tariff: { version: 1n, inputPricePerMTok: inputPrice, outputPricePerMTok: 1n, wakeFee: 0n },
  });
}

function reply(status: number, body: object): UpstreamReply {
  return upstreamReply(status, async () => JSON.stringify(body));
}

/** A chat request of the test model on the test permit, as the service hands it over. */
function chatInput(stream = false, body?: object): ChatInput {
  return {
    apiKeyId: "key",
    authority: payerAuthority,
    body: new TextEncoder().encode(
      JSON.stringify(body ?? { model: "m", messages: [{ role: "user", content: "hi" }], stream }),
    ),
    permitId,
    quoteId: undefined,
    idempotencyKey: undefined,
    signal: new AbortController().signal,
  };
}

function setup(
  overrides: {
    ledger?: Partial<Ledger>;
    upstream?: UpstreamChat;
    stream?: boolean;
    quotes?: QuoteStore;
    offers?: OfferRecord[];
    authority?: SpendingAuthority;
    wakeFees?: WakeFees;
    acquireStream?: (apiKeyId: string) => () => void;
    tokens?: TokenCounters;
    permits?: PermitSource;
    body?: object;
  } = {},
) {
  const finalized: Parameters<Ledger["finalize"]>[0][] = [];
  const called: string[] = [];
  const ledger: Ledger = {
    reserve: async () => ({ ok: true }),
    markStreaming: async () => true,
    finalize: async (input) => {
      finalized.push(input);
      return { finalized: true, creditsCharged: input.creditsCharged };
    },
    switchOffer: async () => true,
    recordOfferFlag: async () => undefined,
    ...overrides.ledger,
  };
  const completion = {
    id: "c",
    object: "chat.completion",
    choices: [{ message: { role: "assistant", content: "hi" } }],
    usage: { prompt_tokens: 3, completion_tokens: 1 },
  };
  const inference = createInference({
    // A is cheaper, so routing tries it first.
    catalog: testCatalog(() => overrides.offers ?? [offer(offerA, 1n), offer(offerB, 2n)]),
    permits: overrides.permits ?? { get: async () => testPermit(), invalidate: () => undefined },
    quotes: overrides.quotes ?? { insert: async () => undefined, get: async () => undefined },
    ledger,
    endpoints: async (offerId) => ({ url: `http://${offerId.slice(2, 6)}.test` }),
    upstream:
      overrides.upstream ??
      (async (endpoint) => {
        called.push(endpoint.url);
        return reply(200, completion);
      }),
    idempotency: {
      claim: async () => ({ state: "claimed" }),
      begin: async () => undefined,
      complete: async () => undefined,
      release: async () => undefined,
    },
    clock: () => now,
    bodyLimitBytes: 1 << 20,
    wakeFees: overrides.wakeFees,
    acquireStream: overrides.acquireStream,
    tokens: overrides.tokens,
  });
  const chat = async (stopAfterChunks = Infinity): Promise<ChatEvent[]> => {
    const events: ChatEvent[] = [];
    let chunks = 0;
    const input = chatInput(overrides.stream === true, overrides.body);
    for await (const event of chatEvents(
      inference,
      overrides.authority === undefined ? input : { ...input, authority: overrides.authority },
    )) {
      events.push(event);
      if (event.type === "chunk" && ++chunks >= stopAfterChunks) break;
    }
    return events;
  };
  return { chat, finalized, called, inference };
}

describe("inference pipeline", () => {
  it("refuses 403 permit_not_authorized a key the permit's payer did not authorize, before reserving or calling a provider", async () => {
    const reserved: unknown[] = [];
    const held = createKeyAuthorities({ ttlMs: 60_000 });
    const base = {
      id: "pauth_000000000000000000000002",
      apiKeyId: "key",
      expiresAt: now + 3600,
      issuedAt: now,
      totalCap: 0n,
      perRequestCap: 0n,
      period: "" as const,
      periodCap: 0n,
      warnAt: 0n,
      createdAt: now,
      revokedAt: null,
      revokedBy: null,
    };
    for (const authority of [
      held.load("nothing", [], 0),
      // Another payer's every permit; the right payer's other permit; the right one, expired.
      held.load(
        "other payer",
        [{ ...base, payer: `0x${"06".repeat(20)}`, permitId: anyPermit }],
        0,
      ),
      held.load("other permit", [{ ...base, payer, permitId: `0x${"34".repeat(32)}` }], 0),
      held.load("expired", [{ ...base, payer, permitId, expiresAt: now }], 0),
    ]) {
      const { chat, finalized, called } = setup({
        authority,
        ledger: {
          reserve: async (input) => {
            reserved.push(input);
            return { ok: true };
          },
        },
      });
      const error = await chat().catch((e: unknown) => e);
      expect(error).toBeInstanceOf(GatewayError);
      expect((error as GatewayError).code).toBe("permit_not_authorized");
      expect(httpStatusOf((error as GatewayError).code)).toBe(403);
      expect(called).toEqual([]);
      expect(finalized).toEqual([]);
    }
    expect(reserved).toEqual([]);
  });

  it("answers 503 database_unavailable when the reservation fails, voids it, and calls no provider", async () => {
    const { chat, finalized, called } = setup({
      ledger: {
        reserve: async () => {
          throw new Error("connection reset");
        },
      },
    });
    const error = await chat().catch((e: unknown) => e);
    expect(error).toBeInstanceOf(GatewayError);
    expect((error as GatewayError).code).toBe("database_unavailable");
    expect(called).toEqual([]);
    expect(finalized).toHaveLength(1);
    expect(finalized[0]).toMatchObject({ status: "failed", billing: "void", creditsCharged: 0n });
  });

  it("answers 503 database_unavailable without a void close when the reservation was never sent", async () => {
    const { chat, finalized, called } = setup({
      ledger: {
        reserve: async () => {
          // What the ledger's bounded batcher throws for backpressure.
          throw new BatcherOverloadError("wait_timeout");
        },
      },
    });
    const error = await chat().catch((e: unknown) => e);
    expect(error).toBeInstanceOf(GatewayError);
    expect((error as GatewayError).code).toBe("database_unavailable");
    expect(called).toEqual([]);
    expect(finalized).toEqual([]);
  });

  it("fails over on a 5xx before the first byte and bills the offer that answered", async () => {
    const called: number[] = [];
    const { chat, finalized } = setup({
      upstream: async (endpoint) => {
        const first = endpoint.url.includes("0a0a");
        called.push(first ? 1 : 2);
        return first
          ? reply(503, {})
          : reply(200, {
              choices: [{ message: { content: "ok" } }],
              usage: { prompt_tokens: 2, completion_tokens: 1 },
            });
      },
    });
    const events = await chat();
    expect(called).toEqual([1, 2]);
    expect(events.at(-1)).toMatchObject({ type: "completed", offerId: offerB, billing: "billed" });
    expect(finalized).toHaveLength(1);
  });

  it("does not fail over on a 4xx: the provider refused the request itself", async () => {
    const called: number[] = [];
    const { chat, finalized } = setup({
      upstream: async (endpoint) => {
        called.push(endpoint.url.includes("0a0a") ? 1 : 2);
        return reply(400, { error: "bad" });
      },
    });
    const error = await chat().catch((e: unknown) => e);
    expect((error as GatewayError).code).toBe("upstream_error");
    expect(called).toEqual([1]);
    expect(finalized[0]).toMatchObject({ status: "failed", billing: "void", creditsCharged: 0n });
  });

  it("charges input plus the output sent when the consumer stops reading mid-stream", async () => {
    const chunk = (content: string) =>
      JSON.stringify({
        id: "c",
        object: "chat.completion.chunk",
        choices: [{ delta: { content } }],
      });
    const { chat, finalized } = setup({
      stream: true,
      upstream: async () => ({
        status: 200,
        text: async () => "",
        stream: (into: (data: string) => boolean) =>
          flowFromEvents(
            (async function* () {
              yield chunk("one");
              yield chunk("two");
              yield chunk("three");
              yield "[DONE]";
            })(),
            into,
          ),
        discard: async () => undefined,
      }),
    });
    const events = await chat(2);
    expect(events.filter((e) => e.type === "chunk")).toHaveLength(2);
    expect(finalized).toHaveLength(1);
    // The output sent, by the gateway's count: without a tokenizer, the byte bound of "one" and
    // "two".
    expect(finalized[0]).toMatchObject({
      status: "cancelled",
      billing: "partial",
      outputTokens: 6n,
    });
    expect(finalized[0]!.creditsCharged).toBeGreaterThan(0n);
  });

  it("gives a stream's admission back before the client's last event (completed or failed), while its close is still being recorded", async () => {
    // A client that has read its whole answer may open its next stream at once: the key's
    // stream limit must not still count the one whose charge is being written.
    const chunk = JSON.stringify({
      id: "c",
      object: "chat.completion.chunk",
      choices: [{ delta: { content: "hi" } }],
    });
    let status = 200;
    let open = 0;
    const commits: (() => void)[] = [];
    const { inference } = setup({
      stream: true,
      acquireStream: () => {
        open += 1;
        return () => {
          open -= 1;
        };
      },
      ledger: {
        finalize: (input) =>
          new Promise((resolve) =>
            commits.push(() => resolve({ finalized: true, creditsCharged: input.creditsCharged })),
          ),
      },
      upstream: async () =>
        status === 200
          ? upstreamReply(
              200,
              async () => "",
              async function* () {
                yield chunk;
                yield "[DONE]";
              },
            )
          : reply(status, { error: { message: "down" } }),
    });
    const openAtEnd = async (): Promise<{ end: string; open: number }> => {
      let seen: { end: string; open: number } | undefined;
      const running = inference.chatInto(chatInput(true), {
        started: () => undefined,
        chunk: () => undefined,
        completed: () => void (seen = { end: "completed", open }),
        failed: () => void (seen = { end: "failed", open }),
        cancelled: () => void (seen = { end: "cancelled", open }),
      });
      // A failed call's void close is written before its failure is handed on; a completed
      // answer's charge is held until the client has its last event.
      await vi.waitFor(() => {
        if (status !== 200) for (const commit of commits.splice(0)) commit();
        expect(seen).toBeDefined();
      });
      for (const commit of commits.splice(0)) commit();
      await running;
      return seen!;
    };
    expect(await openAtEnd()).toEqual({ end: "completed", open: 0 });
    status = 500;
    expect(await openAtEnd()).toEqual({ end: "failed", open: 0 });
    expect(open).toBe(0);
  });

  it("hands the completed answer on before its charge is committed, and reports it recorded after", async () => {
    let commit: (() => void) | undefined;
    const committed: string[] = [];
    const { inference } = setup({
      ledger: {
        finalize: (input) =>
          new Promise((resolve) => {
            commit = () => {
              committed.push(input.status);
              resolve({ finalized: true, creditsCharged: input.creditsCharged });
            };
          }),
      },
    });
    const events = chatEvents(inference, chatInput());
    const seen: ChatEvent[] = [];
    for (;;) {
      const next = await events.next();
      if (next.done === true) throw new Error("ended before completing");
      seen.push(next.value);
      if (next.value.type === "completed") break;
    }
    // The answer and its charge are out while the ledger has not committed anything.
    const done = seen.at(-1) as Extract<ChatEvent, { type: "completed" }>;
    expect(done.creditsCharged).toBeGreaterThan(0n);
    expect(committed).toEqual([]);
    // The consumer asks for the rest: the call ends once the charge is recorded.
    const rest = events.next();
    let recorded = false;
    const whenRecorded = inference.whenRecorded(done.requestId).then(() => (recorded = true));
    // A list of the key's records (ListRequests) waits for it as well.
    let allRecorded = false;
    const whenAll = inference.whenAllRecorded().then(() => (allRecorded = true));
    let drained = false;
    const drain = inference.drain().then(() => (drained = true));
    await new Promise((resolve) => setTimeout(resolve, 10));
    expect(commit).toBeDefined();
    expect(recorded).toBe(false);
    expect(allRecorded).toBe(false);
    // A graceful shutdown waits for it too.
    expect(drained).toBe(false);
    commit!();
    expect((await rest).done).toBe(true);
    await whenRecorded;
    await whenAll;
    await drain;
    expect(committed).toEqual(["completed"]);
  });

  it("drain waits for a call still under way (shutdown cuts it), and its close is written first", async () => {
    let upstreamCalled = () => {};
    const called = new Promise<void>((resolve) => (upstreamCalled = resolve));
    const { finalized, inference } = setup({
      upstream: (_endpoint, _body, { signal }) => {
        upstreamCalled();
        return new Promise((_, reject) =>
          signal.addEventListener("abort", () => reject(signal.reason as Error)),
        );
      },
    });
    const shutdown = new AbortController();
    const call = (async () => {
      for await (const event of chatEvents(inference, { ...chatInput(), signal: shutdown.signal }))
        void event;
    })().catch((e: unknown) => e);
    await called;
    let drained = false;
    const drain = inference.drain().then(() => (drained = true));
    await new Promise((resolve) => setTimeout(resolve, 10));
    expect(drained).toBe(false);
    shutdown.abort(new GatewayError("shutting_down", "the gateway is shutting down"));
    await drain;
    expect(finalized).toHaveLength(1);
    expect(finalized[0]).toMatchObject({
      status: "cancelled",
      error: "cut by the gateway's shutdown",
    });
    expect(await call).toBeInstanceOf(GatewayError);
  });

  it("records a completed answer as completed even when the consumer stops right after it", async () => {
    const { inference, finalized } = setup();
    for await (const event of chatEvents(inference, chatInput())) {
      if (event.type === "completed") break;
    }
    expect(finalized).toHaveLength(1);
    expect(finalized[0]).toMatchObject({ status: "completed", billing: "billed" });
  });

  it("retries recording a completed answer's charge until the ledger takes it, once", async () => {
    let failures = 2;
    const finalized: bigint[] = [];
    const { chat } = setup({
      ledger: {
        finalize: async (input) => {
          if (failures-- > 0) throw new Error("connection reset");
          finalized.push(input.creditsCharged);
          return { finalized: true, creditsCharged: input.creditsCharged };
        },
      },
    });
    const events = await chat();
    const done = events.at(-1) as Extract<ChatEvent, { type: "completed" }>;
    expect(finalized).toEqual([done.creditsCharged]);
  });
});

describe("request lifecycle defects (issue 10)", () => {
  const quoted = (wakesEndpoint: boolean, createdAt: number, expiresAt: number) => {
    const req = parseChatRequest(chatInput().body, { maxBytes: 1 << 20 });
    const quote: QuoteRecord = {
      quoteId: `0x${"99".repeat(32)}`,
      apiKeyId: "key",
      model: "m",
      modelId,
      offerId: offerA,
      tariffVersion: 1n,
      inputTokens: 100n,
      maxOutputTokens: 16n,
      wakesEndpoint,
      maximumCredits: 10n ** 12n,
      fingerprint: req.fingerprint,
      createdAt,
      expiresAt,
      internal: false,
      usedBy: null,
    };
    return { insert: async () => undefined, get: async () => quote };
  };
  const withQuote = (input: ChatInput): ChatInput => ({
    ...input,
    quoteId: `0x${"99".repeat(32)}`,
  });
  const drain = async (events: AsyncIterable<ChatEvent>) => {
    const out: ChatEvent[] = [];
    for await (const e of events) out.push(e);
    return out;
  };

  it("a client gone during the reservation is void: nothing charged, no provider called", async () => {
    const client = new AbortController();
    const { finalized, called, inference } = setup({
      ledger: {
        reserve: async () => {
          client.abort(new Error("client left"));
          return { ok: true };
        },
      },
    });
    await drain(chatEvents(inference, { ...chatInput(), signal: client.signal })).catch(
      () => undefined,
    );
    expect(called).toEqual([]);
    expect(finalized).toHaveLength(1);
    expect(finalized[0]).toMatchObject({
      status: "cancelled",
      billing: "void",
      creditsCharged: 0n,
      inputTokens: 0n,
    });
  });

  it("takes the wake fee from the quote, not from what the prober saw since", async () => {
    const sleeping = { ...offer(offerA, 1n), endpointRunning: false };
    sleeping.tariff = { ...sleeping.tariff, wakeFee: 5_000n };
    const { finalized, inference } = setup({
      quotes: quoted(false, now - 5, now + 55),
      offers: [sleeping],
    });
    const events = await drain(chatEvents(inference, withQuote(chatInput())));
    const done = events.at(-1) as ChatCompleted;
    expect(done.type).toBe("completed");
    // 3 input tokens and 1 output token at 1 per MTok: 1 + 1, no wake fee.
    expect(done.creditsCharged).toBe(2n);
    expect(finalized[0]?.creditsCharged).toBe(2n);
  });

  it("charges the wake fee only when the request claims it (the gateway saw the endpoint asleep)", async () => {
    const sleeping = { ...offer(offerA, 1n), endpointRunning: false };
    sleeping.tariff = { ...sleeping.tariff, wakeFee: 5_000n };
    const claims = [true, false];
    const claimed: Hex[] = [];
    const { finalized, inference } = setup({
      offers: [sleeping],
      wakeFees: {
        claim: async (offerId) => {
          claimed.push(offerId);
          return claims.shift() ?? false;
        },
      },
    });
    const charged = async () =>
      ((await drain(chatEvents(inference, chatInput()))).at(-1) as ChatCompleted).creditsCharged;
    // 3 input tokens and 1 output token at 1 per MTok: 1 + 1, and the fee when claimed.
    expect([await charged(), await charged()]).toEqual([5_002n, 2n]);
    expect(finalized.map((f) => f.creditsCharged)).toEqual([5_002n, 2n]);
    expect(claimed).toEqual([offerA, offerA]);
  });

  it("claims no wake fee for an endpoint the prober saw running, nor charges one without wakeFees", async () => {
    const sleeping = { ...offer(offerA, 1n), endpointRunning: false };
    sleeping.tariff = { ...sleeping.tariff, wakeFee: 5_000n };
    const claimed: Hex[] = [];
    const wakeFees = { claim: async (offerId: Hex) => (claimed.push(offerId), true) };
    const running = setup({ offers: [{ ...sleeping, endpointRunning: true }], wakeFees });
    expect(((await running.chat()).at(-1) as ChatCompleted).creditsCharged).toBe(2n);
    expect(claimed).toEqual([]);
    const without = setup({ offers: [sleeping] });
    expect(((await without.chat()).at(-1) as ChatCompleted).creditsCharged).toBe(2n);
  });

  it("charges no wake fee on the offer a request failed over to: none was claimed for it", async () => {
    const sleeping = { ...offer(offerB, 2n), endpointRunning: false };
    sleeping.tariff = { ...sleeping.tariff, wakeFee: 5_000n };
    const claimed: Hex[] = [];
    const { chat } = setup({
      offers: [offer(offerA, 1n), sleeping],
      wakeFees: { claim: async (offerId) => (claimed.push(offerId), true) },
      upstream: async (endpoint) =>
        endpoint.url.includes("0a0a")
          ? reply(503, {})
          : reply(200, {
              choices: [{ message: { content: "ok" } }],
              usage: { prompt_tokens: 3, completion_tokens: 1 },
            }),
    });
    const done = (await chat()).at(-1) as ChatCompleted;
    expect(done).toMatchObject({ offerId: offerB, creditsCharged: 2n });
    expect(claimed).toEqual([]);
  });

  it("refuses a quote whose maximum, wake fee included, is above max_price, before reserving or calling a provider", async () => {
    // The quote priced the wake fee; the prober has seen the endpoint running since.
    const base = offer(offerA, 1n);
    const awake = { ...base, tariff: { ...base.tariff, wakeFee: 5_000n } };
    const body = { model: "m", messages: [{ role: "user", content: "hi" }], max_tokens: 16 };
    const req = parseChatRequest(new TextEncoder().encode(JSON.stringify(body)), {
      maxBytes: 1 << 20,
    });
    const quote: QuoteRecord = {
      quoteId: `0x${"99".repeat(32)}`,
      apiKeyId: "key",
      model: "m",
      modelId,
      offerId: offerA,
      tariffVersion: 1n,
      inputTokens: 100n,
      maxOutputTokens: 16n,
      wakesEndpoint: true,
      maximumCredits: 5_002n,
      fingerprint: req.fingerprint,
      createdAt: now - 5,
      expiresAt: now + 55,
      internal: false,
      usedBy: null,
    };
    const reserved: unknown[] = [];
    const { called, inference } = setup({
      offers: [awake],
      quotes: { insert: async () => undefined, get: async () => quote },
      ledger: { reserve: async (input) => (reserved.push(input), { ok: true }) },
    });
    const input = (maxPrice: object): ChatInput => ({
      ...withQuote(chatInput()),
      body: new TextEncoder().encode(
        JSON.stringify({ ...body, provider: { max_price: maxPrice } }),
      ),
    });
    const error = await drain(chatEvents(inference, input({ prompt: "1", completion: "1" }))).catch(
      (e: unknown) => e,
    );
    expect((error as GatewayError).code).toBe("no_eligible_offer");
    expect((error as GatewayError).message).toContain("costs up to 5002 credits");
    expect(reserved).toEqual([]);
    expect(called).toEqual([]);
    // Room for the fee: 16 output tokens at 10^9 per million is 16,000.
    const events = await drain(
      chatEvents(inference, input({ prompt: "1", completion: "1000000000" })),
    );
    expect(events.at(-1)).toMatchObject({ type: "completed" });
    expect(called).toHaveLength(1);
  });

  it("refuses a quote past its stored expiry, whatever its creation time says", async () => {
    const { called, inference } = setup({ quotes: quoted(false, now - 5, now - 1) });
    const error = await drain(chatEvents(inference, withQuote(chatInput()))).catch(
      (e: unknown) => e,
    );
    expect((error as GatewayError).code).toBe("quote_expired");
    expect(called).toEqual([]);
  });

  it("stops serving a stream the orphan rule closed meanwhile, and reports no charge", async () => {
    const chunk = (content: string) => JSON.stringify({ choices: [{ delta: { content } }] });
    const { finalized, inference } = setup({
      stream: true,
      ledger: { markStreaming: async () => false },
      upstream: async () => ({
        status: 200,
        text: async () => "",
        stream: (into: (data: string) => boolean) =>
          flowFromEvents(
            (async function* () {
              yield chunk("a");
              yield chunk("b");
              yield JSON.stringify({
                choices: [],
                usage: { prompt_tokens: 3, completion_tokens: 2 },
              });
              yield "[DONE]";
            })(),
            into,
          ),
        discard: async () => undefined,
      }),
    });
    const events: ChatEvent[] = [];
    const error = await (async () => {
      for await (const e of chatEvents(inference, chatInput(true))) events.push(e);
    })().catch((e: unknown) => e);
    expect((error as GatewayError).code).toBe("internal_error");
    expect(events.some((e) => e.type === "completed")).toBe(false);
    // The close it tried found the request already closed (the orphan rule's void stands).
    expect(finalized.every((f) => f.billing !== "billed")).toBe(true);
  });

  it("keeps a close the ledger refuses in the outbox until housekeeping writes it, once, on every path", async () => {
    let down = true;
    const written: Parameters<Ledger["finalize"]>[0][] = [];
    const { inference } = setup({
      ledger: {
        finalize: async (input) => {
          if (down) throw new Error("the database refuses writes");
          written.push(input);
          return { finalized: true, creditsCharged: input.creditsCharged };
        },
      },
    });
    // A completed answer whose close the ledger refuses (after the quick retries).
    const events = await drain(chatEvents(inference, chatInput()));
    const done = events.at(-1) as ChatCompleted;
    expect(done.creditsCharged).toBeGreaterThan(0n);
    expect(await inference.retryCloses()).toEqual({ written: 0, pending: 1 });
    expect(written).toEqual([]);
    down = false;
    expect(await inference.retryCloses()).toEqual({ written: 1, pending: 0 });
    expect(written).toHaveLength(1);
    expect(written[0]).toMatchObject({ status: "completed", creditsCharged: done.creditsCharged });
    expect(await inference.retryCloses()).toEqual({ written: 0, pending: 0 });
    expect(written).toHaveLength(1);
  });
});

describe("authorization credit caps (issue 28, item 7)", () => {
  const grant = (n: number, caps: { totalCap?: bigint; perRequestCap?: bigint } = {}) => ({
    id: `pauth_${n.toString(16).padStart(24, "0")}`,
    apiKeyId: "key",
    payer,
    permitId,
    expiresAt: now + 3600,
    issuedAt: now,
    totalCap: caps.totalCap ?? 0n,
    perRequestCap: caps.perRequestCap ?? 0n,
    period: "" as AuthorizationPeriod,
    periodCap: 0n,
    warnAt: 0n,
    createdAt: now + n,
    revokedAt: null,
    revokedBy: null,
  });
  const authorityOf = (...grants: ReturnType<typeof grant>[]) =>
    createKeyAuthorities({ ttlMs: 60_000 }).load("key", grants, 0);
  type Reservation = Parameters<Ledger["reserve"]>[0];
  // Priced so that the two offers' maxima for the test request differ (B's is the larger).
  const offers = [offer(offerA, 1_000_000n), offer(offerB, 2_000_000n)];

  /** Each offer's maximum for the test request, as the pipeline reserves it. */
  const maxima = async (): Promise<Map<Hex, bigint>> => {
    const seen = new Map<Hex, bigint>();
    const { chat } = setup({
      offers,
      ledger: {
        reserve: async (input) => {
          seen.set(input.offerId, input.maximumCredits);
          // Refused at capacity: the pipeline tries every offer.
          return { ok: false, reason: "offer_at_capacity" };
        },
      },
    });
    await chat().catch(() => undefined);
    return seen;
  };

  it("refuses 403 authorization_per_request_cap_exceeded a request whose maximum fits no offer under the cap, before reserving or calling a provider", async () => {
    const maximum = await maxima();
    const cheapest = maximum.get(offerA)!;
    expect(cheapest).toBeLessThan(maximum.get(offerB)!);
    const reserved: Reservation[] = [];
    const { chat, called, finalized } = setup({
      offers,
      authority: authorityOf(grant(1, { totalCap: cheapest * 10n, perRequestCap: cheapest - 1n })),
      ledger: {
        reserve: async (input) => {
          reserved.push(input);
          return { ok: true };
        },
      },
    });
    const error = (await chat().catch((e: unknown) => e)) as GatewayError;
    expect(error).toBeInstanceOf(GatewayError);
    expect(error.code).toBe("authorization_per_request_cap_exceeded");
    expect(httpStatusOf(error.code)).toBe(403);
    expect(error.message).toContain(`maximum of ${cheapest} credits`);
    expect(error.message).toContain(`per-request cap of ${cheapest - 1n} credits`);
    expect(error.message).toContain(grant(1).id);
    expect(reserved).toEqual([]);
    expect(called).toEqual([]);
    expect(finalized).toEqual([]);
  });

  it("routes only to offers within the per-request cap, reserves through the authorization with its cap, and never fails over above the cap", async () => {
    const maximum = await maxima();
    const a = maximum.get(offerA)!;
    const reserved: Reservation[] = [];
    const calledOffers: string[] = [];
    const { chat, finalized } = setup({
      offers,
      authority: authorityOf(grant(1, { totalCap: a * 10n, perRequestCap: a })),
      ledger: {
        reserve: async (input) => {
          reserved.push(input);
          return { ok: true };
        },
      },
      // A fails before the first byte; B would take over, but its maximum is above the cap.
      upstream: async (endpoint) => {
        calledOffers.push(endpoint.url);
        return reply(503, {});
      },
    });
    const error = (await chat().catch((e: unknown) => e)) as GatewayError;
    expect(error.code).toBe("upstream_error");
    expect(error.message).toContain("no other offer could serve");
    expect(calledOffers).toHaveLength(1);
    expect(reserved).toHaveLength(1);
    expect(reserved[0]).toMatchObject({
      offerId: offerA,
      maximumCredits: a,
      authorizationId: grant(1).id,
      capped: true,
    });
    expect(finalized[0]).toMatchObject({ status: "failed", billing: "void", creditsCharged: 0n });
  });

  it("admits through an uncapped authorization of the key before a capped one of the same permit", async () => {
    const reserved: Reservation[] = [];
    const { chat } = setup({
      offers,
      // Made after the capped ones: the order is by caps, not by age.
      authority: authorityOf(
        grant(1, { totalCap: 10n, perRequestCap: 1n }),
        grant(2, { perRequestCap: 10n ** 15n }),
        grant(3),
      ),
      ledger: {
        reserve: async (input) => {
          reserved.push(input);
          return { ok: true };
        },
      },
    });
    const events = await chat();
    expect(events.at(-1)).toMatchObject({ type: "completed" });
    expect(reserved).toEqual([
      expect.objectContaining({ authorizationId: grant(3).id, capped: false }),
    ]);
  });

  it("tries the next capped authorization when one's total is spent, and refuses 402 authorization_cap_exhausted when every one is", async () => {
    const tried: (string | undefined)[] = [];
    let roomIn: string | undefined;
    const ledger = {
      reserve: async (input: Reservation) => {
        tried.push(input.authorizationId);
        return input.authorizationId === roomIn
          ? ({ ok: true } as const)
          : ({ ok: false, reason: "authorization_cap_exhausted" } as const);
      },
    };
    const authority = authorityOf(
      grant(1, { totalCap: 10n ** 15n }),
      grant(2, { totalCap: 10n ** 15n }),
    );
    roomIn = grant(2).id;
    const served = setup({
      offers,
      authority,
      ledger,
    });
    expect((await served.chat()).at(-1)).toMatchObject({ type: "completed" });
    expect(tried).toEqual([grant(1).id, grant(2).id]);

    tried.length = 0;
    roomIn = undefined;
    const refused = setup({
      offers,
      authority,
      ledger,
    });
    const error = (await refused.chat().catch((e: unknown) => e)) as GatewayError;
    expect(error.code).toBe("authorization_cap_exhausted");
    expect(httpStatusOf(error.code)).toBe(402);
    expect(error.message).toContain(grant(2).id);
    // Once through each, on the cheapest offer only: a spent cap is not another offer's problem.
    expect(tried).toEqual([grant(1).id, grant(2).id]);
    expect(refused.called).toEqual([]);
    expect(refused.finalized).toEqual([]);
  });

  it("reserves a periodically capped request against the period that holds the gateway's clock, and refuses 402 authorization_period_cap_exhausted naming the period and its renewal (issue 38)", async () => {
    const reserved: Reservation[] = [];
    const daily = { ...grant(1), period: "day" as const, periodCap: 10n ** 15n };
    const refused = setup({
      offers,
      authority: authorityOf(daily),
      ledger: {
        reserve: async (input: Reservation) => {
          reserved.push(input);
          return { ok: false, reason: "authorization_period_cap_exhausted" } as const;
        },
      },
    });
    const error = (await refused.chat().catch((e: unknown) => e)) as GatewayError;
    expect(reserved).toEqual([
      expect.objectContaining({
        authorizationId: daily.id,
        capped: true,
        periodStart: periodStart("day", now),
      }),
    ]);
    expect(error.code).toBe("authorization_period_cap_exhausted");
    expect(httpStatusOf(error.code)).toBe(402);
    const renews = periodEnd("day", now);
    expect(error.message).toContain(
      `renews at ${new Date(renews * 1000).toISOString()} (${renews}`,
    );
    expect(error.retryAfterSeconds).toBe(renews - now);
    expect(refused.called).toEqual([]);
  });

  it("checks a supplied quote's maximum against the per-request cap", async () => {
    const req = parseChatRequest(chatInput().body, { maxBytes: 1 << 20 });
    const quote: QuoteRecord = {
      quoteId: `0x${"98".repeat(32)}`,
      apiKeyId: "key",
      model: "m",
      modelId,
      offerId: offerA,
      tariffVersion: 1n,
      inputTokens: 100n,
      maxOutputTokens: 16n,
      wakesEndpoint: false,
      maximumCredits: 1_000n,
      fingerprint: req.fingerprint,
      createdAt: now,
      expiresAt: now + 60,
      internal: false,
      usedBy: null,
    };
    const reserved: Reservation[] = [];
    const run = (perRequestCap: bigint) => {
      const { inference, called } = setup({
        offers,
        quotes: { insert: async () => undefined, get: async () => quote },
        ledger: {
          reserve: async (input) => {
            reserved.push(input);
            return { ok: true };
          },
        },
      });
      const input = {
        ...chatInput(),
        quoteId: quote.quoteId,
        authority: authorityOf(grant(1, { totalCap: 10_000n, perRequestCap })),
      };
      return {
        called,
        result: (async () => {
          for await (const _ of chatEvents(inference, input));
        })(),
      };
    };
    const over = run(999n);
    const error = (await over.result.catch((e: unknown) => e)) as GatewayError;
    expect(error.code).toBe("authorization_per_request_cap_exceeded");
    expect(error.message).toContain("maximum of 1000 credits");
    expect(reserved).toEqual([]);
    expect(over.called).toEqual([]);
    const within = run(1_000n);
    await within.result;
    expect(reserved).toEqual([
      expect.objectContaining({
        maximumCredits: 1_000n,
        authorizationId: grant(1).id,
        capped: true,
      }),
    ]);
  });
});

describe("the prompt is counted after admission, before the reservation (issue 35)", () => {
  const image = {
    model: "m",
    messages: [
      {
        role: "user",
        content: [
          { type: "text", text: "x".repeat(384 * 1024) },
          { type: "image_url", image_url: { url: "data:image/png;base64,AAAA" } },
        ],
      },
    ],
  };

  /** A counter that records every count it was asked for, and the ledger's reservations. */
  function recorded(options: Parameters<typeof perCharacter>[0] = {}) {
    const order: string[] = [];
    const tokens = countersOf(perCharacter({ ...options, onInput: () => order.push("count") }));
    const ledger: Partial<Ledger> = {
      reserve: async () => {
        order.push("reserve");
        return { ok: true };
      },
    };
    return { order, tokens, ledger };
  }

  it("an image request with no permit, or a key its payer did not authorize, is refused before any count", async () => {
    const { order, tokens, ledger } = recorded();
    const noPermit = setup({
      tokens,
      ledger,
      body: image,
      permits: { get: async () => undefined, invalidate: () => undefined },
    });
    await expect(noPermit.chat()).rejects.toMatchObject({ code: "permit_not_found" });
    const unauthorized = setup({
      tokens,
      ledger,
      body: image,
      authority: createKeyAuthorities({ ttlMs: 60_000 }).load("nothing", [], 0),
    });
    await expect(unauthorized.chat()).rejects.toMatchObject({ code: "permit_not_authorized" });
    expect(order).toEqual([]);
  });

  it("a conversation the template refuses is 400 invalid_request before any reservation, with or without images", async () => {
    for (const body of [undefined, image]) {
      const { order, tokens, ledger } = recorded({
        refuses: () => "the chat template refuses this conversation",
      });
      const { chat, called, finalized } = setup({ tokens, ledger, ...(body && { body }) });
      const error = await chat().catch((e: unknown) => e);
      expect(error).toMatchObject({ code: "invalid_request" });
      expect(httpStatusOf((error as GatewayError).code)).toBe(400);
      expect(order).toEqual(["count"]);
      expect(called).toEqual([]);
      expect(finalized).toEqual([]);
    }
  });

  it("503 model_loading while the model's tokenizer loads: nothing reserved, no provider called", async () => {
    const { order, ledger } = recorded();
    const { chat, called, finalized } = setup({ tokens: countersOf(undefined), ledger });
    const error = await chat().catch((e: unknown) => e);
    expect(error).toMatchObject({ code: "model_loading" });
    expect(httpStatusOf((error as GatewayError).code)).toBe(503);
    expect(order).toEqual([]);
    expect(called).toEqual([]);
    expect(finalized).toEqual([]);
  });

  it("the prompt is counted once, then reserved, then sent; the close is judged with that count", async () => {
    const { order, tokens, ledger } = recorded({ input: () => 40n });
    const { chat, called, finalized } = setup({ tokens, ledger });
    await chat();
    expect(order).toEqual(["count", "reserve"]);
    expect(called).toHaveLength(1);
    // The claim (3 in) is within the count (40) plus tolerance: charged as claimed.
    expect(finalized[0]).toMatchObject({
      status: "completed",
      inputTokens: 3n,
      counted: expect.objectContaining({ inputTokens: 40n }),
    });
  });

  it("a completed answer with no visible output is not void: its input is charged", async () => {
    const { tokens } = recorded();
    const { chat, finalized } = setup({
      tokens,
      upstream: async () =>
        reply(200, {
          id: "c",
          object: "chat.completion",
          choices: [{ index: 0, message: { role: "assistant", content: "" } }],
          usage: { prompt_tokens: 3, completion_tokens: 0 },
        }),
    });
    const events = await chat();
    const completed = events.at(-1) as ChatCompleted;
    expect(completed).toMatchObject({ type: "completed", inputTokens: 3n, outputTokens: 0n });
    expect(completed.creditsCharged).toBeGreaterThan(0n);
    expect(finalized[0]).toMatchObject({ status: "completed", billing: "billed", inputTokens: 3n });
  });
});

describe("the usage a client's SDK reads is what was charged (issue 35)", () => {
  const claim = { prompt_tokens: 9_999, completion_tokens: 4_096 };
  const decode = (event: ChatEvent) =>
    JSON.parse(new TextDecoder().decode((event as { data: Uint8Array }).data)) as {
      usage?: unknown;
      choices?: unknown[];
    };

  it("chat JSON: the usage is the charge, the claim only on the record", async () => {
    const { chat, finalized } = setup({
      tokens: countersOf(perCharacter()),
      upstream: async () =>
        reply(200, {
          id: "c",
          object: "chat.completion",
          choices: [
            { index: 0, message: { role: "assistant", content: "hi" }, finish_reason: "stop" },
          ],
          usage: claim,
        }),
    });
    const events = await chat();
    const answer = decode(events.find((e) => e.type === "chunk")!);
    // "hi" in (2 tokens) and out (2): the inflated claim is charged the count.
    expect(answer.usage).toEqual({
      prompt_tokens: 2,
      completion_tokens: 2,
      total_tokens: 4,
      prompt_tokens_details: { cached_tokens: 0 },
      completion_tokens_details: { reasoning_tokens: 0 },
    });
    expect(finalized[0]).toMatchObject({
      inputTokens: 2n,
      outputTokens: 2n,
      claimed: expect.objectContaining({ inputTokens: 9_999n, outputTokens: 4_096n }),
    });
  });

  it("SSE with include_usage: one usage chunk, last, with the charge; the provider's is held back", async () => {
    const frame = (extra: object) =>
      JSON.stringify({
        id: "s",
        object: "chat.completion.chunk",
        created: 7,
        model: "pm",
        ...extra,
      });
    const { chat } = setup({
      tokens: countersOf(perCharacter()),
      stream: true,
      body: {
        model: "m",
        messages: [{ role: "user", content: "hi" }],
        stream: true,
        stream_options: { include_usage: true },
      },
      upstream: async () =>
        upstreamReply(
          200,
          async () => "",
          async function* () {
            yield frame({ choices: [{ index: 0, delta: { content: "hey" } }], usage: claim });
            yield frame({ choices: [{ index: 0, delta: {}, finish_reason: "stop" }] });
            yield frame({ choices: [], usage: claim });
            yield "[DONE]";
          },
        ),
    });
    const events = await chat();
    const chunks = events.filter((e) => e.type === "chunk").map(decode);
    expect(chunks.filter((c) => c.usage !== undefined)).toHaveLength(1);
    expect(chunks.at(-1)).toEqual({
      id: "s",
      object: "chat.completion.chunk",
      created: 7,
      model: "pm",
      choices: [],
      usage: {
        prompt_tokens: 2,
        completion_tokens: 3,
        total_tokens: 5,
        prompt_tokens_details: { cached_tokens: 0 },
        completion_tokens_details: { reasoning_tokens: 0 },
      },
    });
  });
});

describe("a long piece counted off the event loop (issue 35)", () => {
  it("the relay holds the body's later events while a chunk is counted, relays them in order after it, and closes on the exact count", async () => {
    // Tokens are runs of one character, 4 a token; a check of more than 8 characters is
    // counted asynchronously (runsCounter).
    const { counter, seen } = runsCounter(8);
    const content = (text: string) =>
      JSON.stringify({ choices: [{ index: 0, delta: { content: text } }] });
    // One read's events, all pushed at once whatever the relay answers (as the event-stream
    // reader does), and the body ends right after them.
    const burst = [
      content("a".repeat(40)),
      content("b".repeat(40)),
      // 120 bytes past the limit of 100: checked, off the event loop (30 tokens: kept).
      content("c".repeat(40)),
      content("d".repeat(8)),
      // Checked again: 68 tokens are left, 272 e's.
      content("e".repeat(300)),
      content("f".repeat(4)),
      "[DONE]",
    ];
    const { chat, finalized } = setup({
      tokens: countersOf(counter),
      stream: true,
      body: {
        model: "m",
        messages: [{ role: "user", content: "hi" }],
        stream: true,
        max_tokens: 100,
      },
      upstream: async () => ({
        status: 200,
        text: async () => "",
        discard: async () => undefined,
        stream(into) {
          let stopped = false;
          let end!: () => void;
          const done = new Promise<void>((resolve) => (end = resolve));
          setTimeout(() => {
            for (const data of burst) if (!stopped) into(data);
            end();
          }, 0);
          return {
            done,
            resume: () => undefined,
            stop: () => (stopped = true),
            fail: () => undefined,
          };
        },
      }),
    });
    const events = await chat();
    const relayed = events
      .filter((e) => e.type === "chunk")
      .map(
        (e) =>
          JSON.parse(new TextDecoder().decode((e as { data: Uint8Array }).data)) as {
            choices: { delta: { content: string }; finish_reason?: string }[];
          },
      )
      .map((c) => [c.choices[0]!.delta.content, c.choices[0]!.finish_reason ?? null]);
    expect(relayed).toEqual([
      ["a".repeat(40), null],
      ["b".repeat(40), null],
      ["c".repeat(40), null],
      ["d".repeat(8), null],
      ["e".repeat(272), "length"],
    ]);
    expect(seen.settles).toBe(2);
    expect(seen.longestSync).toBeLessThanOrEqual(8);
    expect(finalized[0]).toMatchObject({ outputTokens: 100n });
  });
});

describe("the sink paces the call through its controller (issue 36, item 4)", () => {
  const chunk = (content: string) =>
    JSON.stringify({ id: "c", object: "chat.completion.chunk", choices: [{ delta: { content } }] });
  /** A provider of `n` chunks that notes each one it was asked for, and the call's signal. */
  function counted(n: number) {
    const seen = { pulled: 0, signal: undefined as AbortSignal | undefined };
    const upstream: UpstreamChat = async (_endpoint, _body, { signal }) => {
      seen.signal = signal;
      return upstreamReply(
        200,
        async () => "",
        async function* () {
          for (let i = 0; i < n; i++) {
            seen.pulled++;
            yield chunk(`c${i}`);
          }
          yield "[DONE]";
        },
      );
    };
    return { seen, upstream };
  }
  /** A transport's sink, checked for the contract's order, that runs `onChunk` on each chunk. */
  function sink(onChunk: (controller: AnswerController, chunks: number) => void) {
    const log: string[] = [];
    let controller: AnswerController | undefined;
    let chunks = 0;
    const checked = new CheckedSink({
      started: (_event, control) => {
        controller = control;
        log.push("started");
      },
      chunk: () => {
        log.push("chunk");
        onChunk(controller!, ++chunks);
      },
      completed: () => void log.push("completed"),
      failed: (error) => void log.push(`failed: ${(error as Error).message}`),
      cancelled: () => void log.push("cancelled"),
    });
    return { checked, log, controller: () => controller! };
  }

  it("holds the provider's body from the chunk that paused until resume, then reads the rest", async () => {
    const { seen, upstream } = counted(5);
    const { inference, finalized } = setup({ stream: true, upstream });
    const s = sink((controller, chunks) => {
      if (chunks === 1) controller.pause();
    });
    const running = inference.chatInto(chatInput(true), s.checked);
    await vi.waitFor(() => expect(s.log).toEqual(["started", "chunk"]));
    // Paused: the provider is asked for nothing more, however long the consumer waits.
    for (let i = 0; i < 20; i++) await new Promise((resolve) => setImmediate(resolve));
    expect(seen.pulled).toBe(1);
    expect(s.log).toEqual(["started", "chunk"]);
    s.controller().resume();
    await running;
    expect(seen.pulled).toBe(5);
    expect(s.log).toEqual(["started", ...Array<string>(5).fill("chunk"), "completed"]);
    s.checked.check();
    expect(finalized).toHaveLength(1);
    expect(finalized[0]).toMatchObject({ status: "completed", outputTokens: 10n });
  });

  it("a consumer that aborts mid-stream gets nothing more, and the request closes as a client that left", async () => {
    const { seen, upstream } = counted(5);
    const { inference, finalized } = setup({ stream: true, upstream });
    const stop = new DOMException("the consumer stopped", "AbortError");
    const s = sink((controller, chunks) => {
      if (chunks === 2) controller.abort(stop);
    });
    await inference.chatInto(chatInput(true), s.checked);
    // The provider's call is aborted with the consumer's reason; no chunk and no completed
    // after the abort; the terminal call is the failure with that reason.
    expect(seen.signal?.aborted).toBe(true);
    expect(seen.signal?.reason).toBe(stop);
    expect(s.log).toEqual(["started", "chunk", "chunk", "failed: the consumer stopped"]);
    s.checked.check();
    // Input plus the two chunks it was handed ("c0", "c1": the byte bound of 2 tokens each).
    expect(finalized).toHaveLength(1);
    expect(finalized[0]).toMatchObject({
      status: "cancelled",
      billing: "partial",
      outputTokens: 4n,
    });
  });

  it("a JSON answer's consumer that aborts before the answer is handed on gets no chunk and no completed", async () => {
    const { inference, finalized } = setup({});
    const stop = new DOMException("the consumer stopped", "AbortError");
    const log: string[] = [];
    const checked = new CheckedSink({
      // Aborts as soon as the answer begins (a gRPC caller that stops after the headers).
      started: (_event, controller) => void (log.push("started"), controller.abort(stop)),
      chunk: () => void log.push("chunk"),
      completed: () => void log.push("completed"),
      failed: (error) => void log.push(`failed: ${(error as Error).message}`),
      cancelled: () => void log.push("cancelled"),
    });
    await inference.chatInto(chatInput(false), checked);
    expect(log).toEqual(["started", "failed: the consumer stopped"]);
    checked.check();
    // Closed as a client that left at that moment on REST is: input plus the answer as read and
    // counted ("hi": the byte bound of 2 tokens), never as completed.
    expect(finalized).toHaveLength(1);
    expect(finalized[0]).toMatchObject({ status: "cancelled", outputTokens: 2n });
  });

  it("the order check finds a call that broke the contract", () => {
    const noop = {
      started: () => undefined,
      chunk: () => undefined,
      completed: () => undefined,
      failed: () => undefined,
      cancelled: () => undefined,
    };
    const controller = { pause: () => {}, resume: () => {}, abort: () => {} };
    const started = {
      type: "started",
      requestId: "0x01",
      quoteId: "0x02",
      offerId: offerA,
      tariffVersion: 1n,
      maximumCredits: 1n,
      stream: true,
      replayed: false,
    } as const;
    const piece = { type: "chunk", data: new Uint8Array() } as unknown as ChatChunk;
    const done = { type: "completed" } as unknown as ChatCompleted;

    const early = new CheckedSink(noop);
    early.chunk(piece);
    early.failed(new Error("x"));
    expect(() => early.check()).toThrow("chunk after nothing");

    const twice = new CheckedSink(noop);
    void twice.started(started, controller);
    void twice.completed(done);
    twice.failed(new Error("x"));
    expect(() => twice.check()).toThrow("failed after started, completed");

    const afterAbort = new CheckedSink({
      ...noop,
      started: (_e: unknown, control: AnswerController) => control.abort("gone"),
    });
    void afterAbort.started(started, controller);
    afterAbort.chunk(piece);
    afterAbort.cancelled("gone");
    expect(() => afterAbort.check()).toThrow("chunk after started, abort");

    const unended = new CheckedSink(noop);
    void unended.started(started, controller);
    expect(() => unended.check()).toThrow("no terminal call after started");

    const good = new CheckedSink(noop);
    void good.started(started, controller);
    good.chunk(piece);
    good.chunk(piece);
    void good.completed(done);
    expect(() => good.check()).not.toThrow();
  });
});

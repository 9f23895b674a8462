import { createHash } from "node:crypto";
import type { Hex } from "viem";
import { isEligible, type Catalog, type ModelRecord, type OfferRecord } from "./catalog.js";
import {
  inputTokenUpperBound,
  outputLimit,
  parseChatRequest,
  quoteFingerprint,
  upstreamBody,
  type ChatRequest,
} from "./chat-request.js";
import { GatewayError } from "./errors.js";
import type { EndpointSecret } from "./health.js";
import { isHex32, normalizeHex } from "./hex.js";
import { randomHex } from "./random-id.js";
import { checkPermit, type Permit, type PermitReader } from "./permits.js";
import { priceCredits } from "./pricing.js";

/**
 * The metered chat pipeline: request -> quote -> permit -> route -> reserve ->
 * upstream -> meter -> charge, as separate visible steps. It knows neither
 * HTTP nor protobuf: it yields {@link ChatEvent}s that the RPC layer turns into
 * stream messages. Every reservation it makes ends in exactly one final state
 * (see `settle` below), whatever happens to the client or the provider.
 */

export const quoteLifetimeSeconds = 60;
export const idempotencyLifetimeSeconds = 24 * 3600;

export type Billing = "billed" | "partial" | "void";

export interface Metering {
  readonly inputTokens: bigint;
  readonly outputTokens: bigint;
  readonly credits: bigint;
}

export interface ChatStarted {
  readonly type: "started";
  readonly requestId: Hex;
  readonly quoteId: Hex;
  readonly offerId: Hex;
  readonly tariffVersion: bigint;
  readonly maximumCredits: bigint;
  readonly stream: boolean;
  readonly replayed: boolean;
}

export interface ChatChunk {
  readonly type: "chunk";
  /** One upstream chunk, byte for byte (an SSE event's data, or the whole JSON body). */
  readonly data: Uint8Array;
  readonly metering: Metering;
}

export interface ChatCompleted {
  readonly type: "completed";
  readonly requestId: Hex;
  readonly quoteId: Hex;
  readonly offerId: Hex;
  readonly tariffVersion: bigint;
  readonly inputTokens: bigint;
  readonly outputTokens: bigint;
  readonly creditsCharged: bigint;
  readonly billing: Billing;
  readonly usageFromProvider: boolean;
}

/** Ends a stream that failed after it started; replays re-raise it. */
export interface ChatFailed {
  readonly type: "failed";
  readonly code: "upstream_error" | "upstream_unavailable";
  readonly message: string;
}

export type ChatEvent = ChatStarted | ChatChunk | ChatCompleted | ChatFailed;

// ------------------------------------------------------------------------------ ports

export interface QuoteRecord {
  readonly quoteId: Hex;
  readonly apiKeyId: string;
  readonly model: string;
  readonly modelId: Hex;
  readonly offerId: Hex;
  readonly tariffVersion: bigint;
  readonly inputTokens: bigint;
  readonly maxOutputTokens: bigint;
  readonly wakesEndpoint: boolean;
  readonly maximumCredits: bigint;
  readonly fingerprint: string;
  readonly createdAt: number;
  readonly expiresAt: number;
  readonly internal: boolean;
  readonly usedBy: string | null;
}

export interface QuoteStore {
  insert(quote: QuoteRecord): Promise<void>;
  get(quoteId: Hex): Promise<QuoteRecord | undefined>;
}

export type ReserveRefusal = "insufficient_credits" | "offer_at_capacity" | "quote_used";

/** The reservation ledger (adapters/pg/ledger.ts); each call is one transaction. */
export interface Ledger {
  reserve(input: {
    requestId: Hex;
    apiKeyId: string;
    model: string;
    modelId: Hex;
    offerId: Hex;
    permitId: Hex;
    quoteId: Hex;
    stream: boolean;
    maximumCredits: bigint;
    tariffVersion: bigint;
    inputTokens: bigint;
    deposit: bigint;
    chainSettled: bigint;
    maxConcurrency: number;
    now: number;
    quote?: QuoteRecord;
  }): Promise<{ ok: true } | { ok: false; reason: ReserveRefusal }>;
  /**
   * pending -> streaming. False when the request is no longer open: the orphan rule closed it
   * (this process looked dead), so this process must stop serving it.
   */
  markStreaming(requestId: Hex): Promise<boolean>;
  finalize(input: {
    requestId: Hex;
    status: "completed" | "failed" | "cancelled";
    inputTokens: bigint;
    outputTokens: bigint;
    creditsCharged: bigint;
    billing: Billing;
    usageSource: "provider" | "gateway";
    error?: string;
    now: number;
  }): Promise<{ finalized: boolean; creditsCharged: bigint }>;
  switchOffer(input: {
    requestId: Hex;
    offerId: Hex;
    maximumCredits: bigint;
    tariffVersion: bigint;
    maxConcurrency: number;
    deposit: bigint;
    chainSettled: bigint;
  }): Promise<boolean>;
  recordOfferFlag(input: {
    offerId: Hex;
    requestId: Hex;
    reason: string;
    now: number;
  }): Promise<void>;
}

/** The registered endpoint of an offer, opened (never logged). */
export type EndpointLookup = (offerId: Hex) => Promise<EndpointSecret | undefined>;

export interface UpstreamReply {
  readonly status: number;
  /** The whole body as text (non-streaming answers). */
  text(): Promise<string>;
  /** The data of each server-sent event (streaming answers). */
  events(): AsyncIterable<string>;
  /** Drops the body (an answer that will not be used). */
  discard(): Promise<void>;
}

/** Sends a chat body to a provider; rejects (GatewayError) when no answer header arrives. */
export type UpstreamChat = (
  endpoint: EndpointSecret,
  body: Uint8Array,
  options: { signal: AbortSignal },
) => Promise<UpstreamReply>;

export type IdempotencyClaim =
  | { readonly state: "claimed" }
  | { readonly state: "in_progress" }
  | { readonly state: "mismatch" }
  | { readonly state: "completed"; readonly events: readonly ChatEvent[] };

export interface IdempotencyStore {
  claim(input: {
    apiKeyId: string;
    key: string;
    fingerprint: string;
    now: number;
    expiresAt: number;
  }): Promise<IdempotencyClaim>;
  complete(input: {
    apiKeyId: string;
    key: string;
    requestId: Hex;
    events: readonly ChatEvent[];
  }): Promise<void>;
  release(input: { apiKeyId: string; key: string }): Promise<void>;
}

export interface InferenceDeps {
  readonly catalog: Catalog;
  readonly permits: PermitReader;
  readonly quotes: QuoteStore;
  readonly ledger: Ledger;
  readonly endpoints: EndpointLookup;
  readonly upstream: UpstreamChat;
  readonly idempotency: IdempotencyStore;
  /** Unix seconds. */
  readonly clock: () => number;
  readonly bodyLimitBytes: number;
  readonly newId?: () => Hex;
}

export interface ChatInput {
  readonly apiKeyId: string;
  readonly body: Uint8Array;
  readonly permitId: string | undefined;
  readonly quoteId: string | undefined;
  readonly idempotencyKey: string | undefined;
  readonly signal: AbortSignal;
}

export interface Inference {
  createQuote(input: { apiKeyId: string; body: Uint8Array }): Promise<QuoteRecord>;
  chat(input: ChatInput): AsyncGenerator<ChatEvent, void, undefined>;
  /**
   * Settles once this process has recorded the request's final state, if it is recording it
   * now (a completed answer goes to the client just before its charge is committed).
   */
  whenRecorded(requestId: string): Promise<void>;
  /** Settles when every answer given so far has its final state recorded (graceful shutdown). */
  drain(): Promise<void>;
  /**
   * Writes the closes the ledger refused so far (housekeeping calls it every round): until it
   * has, their reservations and offer slots stay held.
   */
  retryCloses(): Promise<{ written: number; pending: number }>;
}

// ------------------------------------------------------------------------------ rules

/** A close the ledger has not taken yet, kept until it does. */
interface PendingClose {
  readonly finalize: Parameters<Ledger["finalize"]>[0];
  readonly flag: { readonly offerId: Hex; readonly reason: string } | undefined;
}

/** How a request ends, decided in memory before the ledger records it. */
interface Closing {
  readonly status: "completed" | "failed" | "cancelled";
  readonly usage: Usage;
  readonly billing: Billing;
  readonly usageSource: "provider" | "gateway";
  readonly error: string | undefined;
  readonly charge: bigint;
  /** The provider reported usage priced above the quote's maximum (the offer gets flagged). */
  readonly aboveQuote: boolean;
  readonly offerId: Hex;
}

/**
 * Attempts after the first for recording a completed answer's charge at once (about 0.7 s);
 * after them the close waits in the outbox for housekeeping, as every refused close does.
 */
const completionRetries = 3;

async function withRetries<T>(retries: number, attempt: () => Promise<T>): Promise<T> {
  for (let i = 0; ; i++) {
    try {
      return await attempt();
    } catch (error) {
      if (i >= retries) throw error;
      await new Promise((resolve) => setTimeout(resolve, Math.min(100 * 2 ** i, 8_000)));
    }
  }
}

/** A candidate offer with what a request would cost on it. */
interface Candidate {
  readonly offer: OfferRecord;
  readonly wakes: boolean;
  readonly inputTokens: bigint;
  readonly maxOutputTokens: bigint;
  readonly maximumCredits: bigint;
}

/** An endpoint the prober last saw down is sleeping: calling it wakes it (and costs the wake fee). */
function wakes(offer: OfferRecord): boolean {
  return offer.endpointRunning === false;
}

function candidateFor(offer: OfferRecord, req: ChatRequest): Candidate {
  const inputTokens = inputTokenUpperBound(req);
  const maxOutputTokens = outputLimit(req, offer.capabilities);
  const w = wakes(offer);
  return {
    offer,
    wakes: w,
    inputTokens,
    maxOutputTokens,
    maximumCredits: priceCredits(offer.tariff, { inputTokens, outputTokens: maxOutputTokens }, w),
  };
}

/**
 * DESIGN section 6: eligible offers matching every pin, ranked by quoted
 * maximum credits, then running over sleeping, then in-flight load.
 * Capacity is enforced atomically at reservation, not here.
 */
export function rankCandidates(
  offers: readonly OfferRecord[],
  model: ModelRecord,
  req: ChatRequest,
  pins: readonly (Hex | undefined)[],
  now: number,
): Candidate[] {
  const pinned = pins.filter((p): p is Hex => p !== undefined);
  return offers
    .filter((o) => isEligible(o, model, now) && pinned.every((p) => p === o.offerId))
    .map((o) => candidateFor(o, req))
    .sort(
      (a, b) =>
        (a.maximumCredits < b.maximumCredits ? -1 : a.maximumCredits > b.maximumCredits ? 1 : 0) ||
        Number(a.wakes) - Number(b.wakes) ||
        a.offer.inFlight - b.offer.inFlight,
    );
}

interface Usage {
  readonly inputTokens: bigint;
  readonly outputTokens: bigint;
}

function usageOf(value: unknown): Usage | undefined {
  const usage = (
    value as { usage?: { prompt_tokens?: unknown; completion_tokens?: unknown } } | null
  )?.usage;
  if (usage === undefined || usage === null) return undefined;
  const { prompt_tokens: p, completion_tokens: c } = usage;
  if (
    !Number.isSafeInteger(p) ||
    !Number.isSafeInteger(c) ||
    (p as number) < 0 ||
    (c as number) < 0
  )
    return undefined;
  return { inputTokens: BigInt(p as number), outputTokens: BigInt(c as number) };
}

/**
 * The gateway's own count of output tokens when the provider reports none:
 * one token per four UTF-8 bytes of generated text (at least one for any text).
 * It is a fallback, documented in docs/decisions.md, not a tokenizer.
 */
export function countTextTokens(text: string): bigint {
  const bytes = Buffer.byteLength(text, "utf8");
  return bytes === 0 ? 0n : BigInt(Math.ceil(bytes / 4));
}

function completionText(body: unknown): string {
  const choices = (body as { choices?: { message?: { content?: unknown } }[] } | null)?.choices;
  if (!Array.isArray(choices)) return "";
  return choices
    .map((c) => (typeof c?.message?.content === "string" ? c.message.content : ""))
    .join("");
}

function deltaText(chunk: unknown): string {
  const choices = (chunk as { choices?: { delta?: { content?: unknown } }[] } | null)?.choices;
  if (!Array.isArray(choices)) return "";
  return choices
    .map((c) => (typeof c?.delta?.content === "string" ? c.delta.content : ""))
    .join("");
}

function isUsageOnly(chunk: unknown): boolean {
  const c = chunk as { choices?: unknown[]; usage?: unknown } | null;
  return (
    Array.isArray(c?.choices) &&
    c.choices.length === 0 &&
    c?.usage !== undefined &&
    c?.usage !== null
  );
}

const minBigint = (a: bigint, b: bigint): bigint => (a < b ? a : b);
const encoder = new TextEncoder();

function requestFingerprint(input: ChatInput): string {
  return createHash("sha256")
    .update(input.body)
    .update("\0")
    .update(input.permitId ?? "")
    .update("\0")
    .update(input.quoteId ?? "")
    .digest("hex");
}

// ------------------------------------------------------------------------------ pipeline

export function createInference(deps: InferenceDeps): Inference {
  const newId = deps.newId ?? ((): Hex => `0x${randomHex(32)}`);

  const resolve = (req: ChatRequest) => deps.catalog.routingView(req.model);
  // Completed answers whose final state is being recorded, by request id.
  const recording = new Map<string, Promise<void>>();
  /** Closes decided but refused by the ledger (an outage): written by {@link retryCloses}. */
  const outbox = new Map<Hex, PendingClose>();

  /** Writes a close and its offer flag; the close is exactly-once, so a retry never charges twice. */
  const writeClose = async (close: PendingClose): Promise<{ creditsCharged: bigint }> => {
    const result = await deps.ledger.finalize(close.finalize);
    if (close.flag !== undefined) {
      await deps.ledger.recordOfferFlag({
        ...close.flag,
        requestId: close.finalize.requestId,
        now: deps.clock(),
      });
    }
    return result;
  };

  const retryCloses = async (): Promise<{ written: number; pending: number }> => {
    let written = 0;
    for (const [requestId, close] of [...outbox]) {
      try {
        await writeClose(close);
        outbox.delete(requestId);
        written++;
      } catch {
        // Still refused: the next round tries again.
      }
    }
    return { written, pending: outbox.size };
  };

  const createQuote = async (input: {
    apiKeyId: string;
    body: Uint8Array;
  }): Promise<QuoteRecord> => {
    const req = parseChatRequest(input.body, { maxBytes: deps.bodyLimitBytes });
    const now = deps.clock();
    const { model, offers } = await resolve(req);
    const [best] = rankCandidates(offers, model, req, [req.offer], now);
    if (best === undefined) throw noEligibleOffer(req);
    const quote = quoteRecord(newId(), input.apiKeyId, req, model, best, now, false);
    await deps.quotes.insert(quote);
    return quote;
  };

  function quoteRecord(
    quoteId: Hex,
    apiKeyId: string,
    req: ChatRequest,
    model: ModelRecord,
    c: Candidate,
    now: number,
    internal: boolean,
  ): QuoteRecord {
    return {
      quoteId,
      apiKeyId,
      model: req.model,
      modelId: model.modelId,
      offerId: c.offer.offerId,
      tariffVersion: c.offer.tariff.version,
      inputTokens: c.inputTokens,
      maxOutputTokens: c.maxOutputTokens,
      wakesEndpoint: c.wakes,
      maximumCredits: c.maximumCredits,
      fingerprint: quoteFingerprint(req),
      createdAt: now,
      expiresAt: now + quoteLifetimeSeconds,
      internal,
      usedBy: null,
    };
  }

  function noEligibleOffer(req: ChatRequest): GatewayError {
    return new GatewayError(
      "no_eligible_offer",
      req.offer === undefined
        ? `no verified, active offer of '${req.model.slice(0, 200)}' can serve this request now`
        : `offer ${req.offer} cannot serve this request now (not active, verified and registered for this model)`,
    );
  }

  /** Checks a supplied quote, in the order DESIGN.md gives; returns it bound to its offer. */
  async function boundQuote(quoteId: string, apiKeyId: string, req: ChatRequest, now: number) {
    if (!isHex32(quoteId)) throw new GatewayError("invalid_hex", "X-Gateway-Quote must be a Hex32");
    const quote = await deps.quotes.get(normalizeHex(quoteId));
    if (quote === undefined || quote.apiKeyId !== apiKeyId || quote.internal) {
      throw new GatewayError("quote_not_found", `quote ${quoteId} does not exist`);
    }
    // The stored expiry decides (quotes are made with createdAt + quoteLifetimeSeconds).
    if (now > quote.expiresAt) {
      throw new GatewayError("quote_expired", `quote ${quoteId} expired at ${quote.expiresAt}`);
    }
    if (quote.fingerprint !== quoteFingerprint(req)) {
      throw new GatewayError(
        "quote_mismatch",
        "the request differs from the quoted one in model, messages, output limit, tools, tool choice or response format",
      );
    }
    if (quote.usedBy !== null)
      throw new GatewayError("quote_used", `quote ${quoteId} has already been used`);
    return quote;
  }

  async function* chat(input: ChatInput): AsyncGenerator<ChatEvent, void, undefined> {
    const req = parseChatRequest(input.body, { maxBytes: deps.bodyLimitBytes });
    const key = input.idempotencyKey;
    if (
      key !== undefined &&
      (key.length === 0 || key.length > 255 || !/^[\x21-\x7e]+$/.test(key))
    ) {
      throw new GatewayError(
        "invalid_request",
        "Idempotency-Key must be 1 to 255 visible ASCII characters",
      );
    }
    const now = deps.clock();
    if (key !== undefined) {
      const claim = await deps.idempotency.claim({
        apiKeyId: input.apiKeyId,
        key,
        fingerprint: requestFingerprint(input),
        now,
        expiresAt: now + idempotencyLifetimeSeconds,
      });
      if (claim.state === "in_progress") {
        throw new GatewayError(
          "idempotency_in_progress",
          "a request with this Idempotency-Key is still in progress",
        );
      }
      if (claim.state === "mismatch") {
        throw new GatewayError(
          "idempotency_key_reused",
          "this Idempotency-Key was used with a different request",
        );
      }
      if (claim.state === "completed") {
        yield* replay(claim.events);
        return;
      }
    }

    const events: ChatEvent[] = [];
    let started = false;
    try {
      for await (const event of run(req, input, now)) {
        if (event.type === "started") started = true;
        if (key !== undefined) {
          events.push(event);
          // Stored before the last event is handed on: a consumer may stop reading right after it.
          if (event.type === "completed") await storeResult(input, key, events);
        }
        yield event;
      }
    } catch (error) {
      if (key !== undefined) {
        // Nothing reached the client: the key is free for a corrected retry. Once the
        // answer began, its outcome (and any partial charge) is the key's for good.
        if (!started) await deps.idempotency.release({ apiKeyId: input.apiKeyId, key });
        else {
          const failure = error instanceof GatewayError ? error : undefined;
          events.push({
            type: "failed",
            code:
              failure?.code === "upstream_unavailable" ? "upstream_unavailable" : "upstream_error",
            message: failure?.message ?? "the answer was interrupted",
          });
          await storeResult(input, key, events);
        }
      }
      throw error;
    }
  }

  async function storeResult(input: ChatInput, key: string, events: ChatEvent[]) {
    const first = events[0];
    if (first?.type !== "started") return;
    await deps.idempotency.complete({
      apiKeyId: input.apiKeyId,
      key,
      requestId: first.requestId,
      events,
    });
  }

  async function* replay(events: readonly ChatEvent[]): AsyncGenerator<ChatEvent, void, undefined> {
    for (const event of events) {
      if (event.type === "started") yield { ...event, replayed: true };
      else if (event.type === "failed") throw new GatewayError(event.code, event.message);
      else yield event;
    }
  }

  async function* run(
    req: ChatRequest,
    input: ChatInput,
    now: number,
  ): AsyncGenerator<ChatEvent, void, undefined> {
    // 1. Quote first: a stale or foreign quote is refused before anything else happens.
    const quote =
      input.quoteId === undefined
        ? undefined
        : await boundQuote(input.quoteId, input.apiKeyId, req, now);
    const { model, offers } = await resolve(req);
    if (quote !== undefined) {
      const offer = offers.find((o) => o.offerId === quote.offerId);
      if (offer === undefined || offer.tariff.version !== quote.tariffVersion) {
        throw new GatewayError(
          "tariff_changed",
          `the tariff of offer ${quote.offerId} changed since the quote`,
        );
      }
    }

    // 2. Permit, read live from the chain.
    const pinnedOffer = req.offer ?? quote?.offerId;
    const permit = await checkPermit(input.permitId, deps.permits, {
      modelId: model.modelId,
      pinnedOfferId: pinnedOffer,
      now,
    });

    // 3. Route.
    const pins = [req.offer, quote?.offerId, permit.offerId];
    const candidates = rankCandidates(offers, model, req, pins, now);
    if (candidates.length === 0) throw noEligibleOffer(req);
    const failover = pins.every((p) => p === undefined);

    // 4. Reserve the maximum, durably, before any upstream call.
    const requestId = newId();
    let chosen: Candidate | undefined;
    let quoteId: Hex | undefined;
    let maximumCredits = 0n;
    for (const c of quote === undefined ? candidates : candidates.slice(0, 1)) {
      const internal =
        quote === undefined
          ? quoteRecord(newId(), input.apiKeyId, req, model, c, now, true)
          : undefined;
      const q = quote ?? internal!;
      const result = await reserveOrVoid(requestId, {
        requestId,
        apiKeyId: input.apiKeyId,
        model: req.model,
        modelId: model.modelId,
        offerId: c.offer.offerId,
        permitId: permit.permitId,
        quoteId: q.quoteId,
        stream: req.stream,
        maximumCredits: q.maximumCredits,
        tariffVersion: c.offer.tariff.version,
        inputTokens: q.inputTokens,
        deposit: permit.deposit,
        chainSettled: permit.settled,
        maxConcurrency: c.offer.maxConcurrency,
        now,
        ...(internal === undefined ? {} : { quote: internal }),
      });
      if (result.ok) {
        // What the request pays is what was quoted: the wake fee only if the quote said so,
        // whatever the prober has seen since.
        chosen = { ...c, wakes: q.wakesEndpoint };
        quoteId = q.quoteId;
        maximumCredits = q.maximumCredits;
        break;
      }
      if (result.reason === "insufficient_credits") {
        throw new GatewayError(
          "insufficient_credits",
          `permit ${permit.permitId} cannot cover this request's maximum of ${q.maximumCredits} credits`,
        );
      }
      if (result.reason === "quote_used")
        throw new GatewayError("quote_used", `quote ${q.quoteId} has already been used`);
      // offer_at_capacity: the next offer, if routing may choose one.
      if (!failover) break;
    }
    if (chosen === undefined || quoteId === undefined) {
      throw new GatewayError(
        "offer_at_capacity",
        "every eligible offer is at its max_concurrency; retry shortly",
      );
    }

    yield* serve({
      req,
      input,
      permit,
      requestId,
      quoteId,
      maximumCredits,
      chosen,
      candidates,
      failover,
    });
  }

  /**
   * One call to an offer's provider, up to its response headers. A connection failure or a
   * 5xx is `retryable` (another offer may serve); a 4xx is the provider refusing this request,
   * which no other offer would answer differently.
   */
  async function callProvider(
    offerId: Hex,
    req: ChatRequest,
    signal: AbortSignal,
  ): Promise<{ reply: UpstreamReply } | { failure: GatewayError; retryable: boolean }> {
    const endpoint = await deps.endpoints(offerId);
    if (endpoint === undefined) {
      return {
        failure: new GatewayError("upstream_unavailable", "the offer has no registered endpoint"),
        retryable: true,
      };
    }
    let reply: UpstreamReply;
    try {
      reply = await deps.upstream(endpoint, upstreamBody(req), { signal });
    } catch (error) {
      const failure =
        error instanceof GatewayError
          ? error
          : new GatewayError("upstream_unavailable", "the provider could not be reached");
      return { failure, retryable: true };
    }
    if (reply.status >= 200 && reply.status < 300) return { reply };
    await reply.discard();
    return {
      failure: new GatewayError("upstream_error", `the provider answered HTTP ${reply.status}`),
      retryable: reply.status >= 500,
    };
  }

  /**
   * The reservation, or a clear 503. When the call fails its outcome is unknown (a COMMIT whose
   * answer was lost): the request is closed as failed and void, which does nothing if nothing
   * was committed, so a reservation that did land is released at once rather than by the
   * orphan rule a minute later. No provider is called either way.
   */
  async function reserveOrVoid(
    requestId: Hex,
    input: Parameters<Ledger["reserve"]>[0],
  ): ReturnType<Ledger["reserve"]> {
    try {
      return await deps.ledger.reserve(input);
    } catch (error) {
      await deps.ledger
        .finalize({
          requestId,
          status: "failed",
          inputTokens: 0n,
          outputTokens: 0n,
          creditsCharged: 0n,
          billing: "void",
          usageSource: "gateway",
          error: "reservation failed",
          now: deps.clock(),
        })
        .catch(() => undefined);
      throw new GatewayError("database_unavailable", "the reservation could not be stored", {
        cause: error,
      });
    }
  }

  interface Served {
    req: ChatRequest;
    input: ChatInput;
    permit: Permit;
    requestId: Hex;
    quoteId: Hex;
    maximumCredits: bigint;
    chosen: Candidate;
    candidates: Candidate[];
    failover: boolean;
  }

  async function* serve(s: Served): AsyncGenerator<ChatEvent, void, undefined> {
    const { req, input, requestId, quoteId } = s;
    let current = s.chosen;
    let maximumCredits = s.maximumCredits;
    const inputBound = current.inputTokens;
    let decided = false;
    // Whether the request went to a provider: a client that leaves before that is charged
    // nothing (DESIGN.md: input is charged only once the provider has the request).
    let dispatched = false;
    // Metered so far (streams): the finally block below needs them when the consumer stops early.
    let delivered = 0n;
    let provided: Usage | undefined;
    /** What a closing charges, in memory: the answer can go out before the ledger write. */
    const close = (
      status: "completed" | "failed" | "cancelled",
      usage: Usage,
      billing: Billing,
      usageSource: "provider" | "gateway",
      error?: string,
    ): Closing => {
      const raw =
        billing === "void"
          ? 0n
          : priceCredits(current.offer.tariff, usage, current.wakes && status === "completed");
      const charge = minBigint(raw, maximumCredits);
      return {
        status,
        usage,
        billing: charge === 0n ? "void" : billing,
        usageSource,
        error,
        charge,
        aboveQuote: raw > maximumCredits && usageSource === "provider",
        offerId: current.offer.offerId,
      };
    };
    // pending -> streaming is written while the answer flows; a closing waits for it.
    let marking: Promise<unknown> | undefined;
    /**
     * A completed answer: its charge is reported with the last event and recorded right after
     * (retried), so the client does not wait for the ledger's commit. Should the consumer stop
     * between the two, the finally block records it all the same.
     */
    let pendingClose: Closing | undefined;
    let recorded: (() => void) | undefined;
    const answered = (c: Closing) => {
      pendingClose = c;
      recording.set(requestId, new Promise<void>((resolve) => (recorded = resolve)));
    };
    /**
     * Makes a closing durable: the reservation becomes its charge, exactly once. The close is
     * decided here, once (`decided`); a write the ledger refuses (after `retries`) goes to the
     * outbox, which housekeeping retries until it lands, so the reservation and the offer slot
     * are released and the charge recorded while the process lives, whatever the outage.
     */
    const record = async (c: Closing, retries = 0): Promise<{ creditsCharged: bigint }> => {
      decided = true;
      pendingClose = undefined;
      const close: PendingClose = {
        finalize: {
          requestId,
          status: c.status,
          inputTokens: c.usage.inputTokens,
          outputTokens: c.usage.outputTokens,
          creditsCharged: c.charge,
          billing: c.billing,
          usageSource: c.usageSource,
          ...(c.error === undefined ? {} : { error: c.error }),
          now: deps.clock(),
        },
        flag: c.aboveQuote ? { offerId: c.offerId, reason: "usage_above_quote" } : undefined,
      };
      try {
        if (marking !== undefined) await marking;
        return await withRetries(retries, () => writeClose(close));
      } catch {
        outbox.set(requestId, close);
        return { creditsCharged: c.charge };
      } finally {
        if (recorded !== undefined) {
          recording.delete(requestId);
          recorded();
        }
      }
    };
    const settle = async (
      status: "completed" | "failed" | "cancelled",
      usage: Usage,
      billing: Billing,
      usageSource: "provider" | "gateway",
      error?: string,
    ) => {
      const c = close(status, usage, billing, usageSource, error);
      const result = await record(c);
      return {
        charge: result.creditsCharged,
        billing: (result.creditsCharged === 0n ? "void" : c.billing) as Billing,
      };
    };

    const abort = new AbortController();
    const onClientAbort = () => abort.abort(input.signal.reason);
    if (input.signal.aborted) onClientAbort();
    else input.signal.addEventListener("abort", onClientAbort, { once: true });

    try {
      // 5. Call the provider; before the first byte a connection error or a 5xx may fail over.
      const tried = new Set<Hex>();
      let reply: UpstreamReply | undefined;
      for (;;) {
        tried.add(current.offer.offerId);
        if (input.signal.aborted) throw input.signal.reason;
        dispatched = true;
        const attempt = await callProvider(current.offer.offerId, req, abort.signal);
        if (input.signal.aborted) throw input.signal.reason;
        if ("reply" in attempt) {
          reply = attempt.reply;
          break;
        }
        if (!attempt.retryable) throw attempt.failure;
        const { failure } = attempt;
        const next = s.failover ? s.candidates.find((c) => !tried.has(c.offer.offerId)) : undefined;
        if (next === undefined)
          throw new GatewayError(
            "upstream_error",
            `${failure.message}; no other offer could serve`,
          );
        const switched = await deps.ledger.switchOffer({
          requestId,
          offerId: next.offer.offerId,
          maximumCredits: next.maximumCredits,
          tariffVersion: next.offer.tariff.version,
          maxConcurrency: next.offer.maxConcurrency,
          deposit: s.permit.deposit,
          chainSettled: s.permit.settled,
        });
        if (!switched)
          throw new GatewayError(
            "upstream_error",
            `${failure.message}; no other offer could serve`,
          );
        current = next;
        maximumCredits = next.maximumCredits;
      }

      yield {
        type: "started",
        requestId,
        quoteId,
        offerId: current.offer.offerId,
        tariffVersion: current.offer.tariff.version,
        maximumCredits,
        stream: req.stream,
        replayed: false,
      };

      // 6. Relay and meter.
      if (!req.stream) {
        let text: string;
        try {
          text = await reply.text();
        } catch (error) {
          if (input.signal.aborted) throw error;
          await settle(
            "failed",
            { inputTokens: 0n, outputTokens: 0n },
            "void",
            "gateway",
            "the provider failed while answering",
          );
          throw error;
        }
        let body: unknown;
        try {
          body = JSON.parse(text);
        } catch {
          await settle(
            "failed",
            { inputTokens: 0n, outputTokens: 0n },
            "void",
            "gateway",
            "the provider answered invalid JSON",
          );
          throw new GatewayError("upstream_error", "the provider answered invalid JSON");
        }
        const provided = usageOf(body);
        const usage = provided ?? {
          inputTokens: inputBound,
          outputTokens: countTextTokens(completionText(body)),
        };
        const billing: Billing = usage.outputTokens === 0n ? "void" : "billed";
        const final = close("completed", usage, billing, provided ? "provider" : "gateway");
        answered(final);
        yield {
          type: "chunk",
          data: encoder.encode(text),
          metering: { ...usage, credits: final.charge },
        };
        yield completed(s, current, usage, final, provided !== undefined);
        await record(final, completionRetries);
        return;
      }

      // A failed write leaves the request pending, which closes the same way: only a definite
      // "no longer open" stops the answer.
      let lost = false;
      marking = deps.ledger.markStreaming(requestId).then(
        (open) => {
          lost = !open;
        },
        () => undefined,
      );
      const lostRequest = () =>
        new GatewayError(
          "internal_error",
          "the gateway closed this request while it was being served (its process looked stopped)",
        );
      try {
        for await (const data of reply.events()) {
          if (data === "[DONE]") break;
          let chunk: unknown;
          try {
            chunk = JSON.parse(data);
          } catch {
            chunk = undefined;
          }
          const usage = usageOf(chunk);
          if (usage !== undefined) provided = usage;
          if (lost) throw lostRequest();
          if (isUsageOnly(chunk) && !req.includeUsage) continue;
          if (deltaText(chunk) !== "") delivered += 1n;
          const credits = minBigint(
            priceCredits(
              current.offer.tariff,
              { inputTokens: inputBound, outputTokens: delivered },
              false,
            ),
            maximumCredits,
          );
          yield {
            type: "chunk",
            data: encoder.encode(data),
            metering: { inputTokens: inputBound, outputTokens: delivered, credits },
          };
        }
      } catch (error) {
        if (input.signal.aborted) {
          // The client left: input plus the output produced so far.
          await settle(
            "cancelled",
            { inputTokens: provided?.inputTokens ?? inputBound, outputTokens: delivered },
            "partial",
            "gateway",
            "client disconnected",
          );
        } else {
          // The provider failed after the first byte: only the output delivered.
          await settle(
            "failed",
            { inputTokens: 0n, outputTokens: delivered },
            "partial",
            "gateway",
            "the provider failed mid-stream",
          );
        }
        throw error instanceof GatewayError
          ? error
          : new GatewayError("upstream_error", "the provider failed mid-stream");
      }
      await marking;
      if (lost) {
        // Never report a charge the record does not hold: the orphan rule closed it void.
        await settle(
          "failed",
          { inputTokens: 0n, outputTokens: delivered },
          "partial",
          "gateway",
          "closed by the orphan rule while served",
        );
        throw lostRequest();
      }
      const usage = provided ?? { inputTokens: inputBound, outputTokens: delivered };
      const final = close(
        "completed",
        usage,
        usage.outputTokens === 0n ? "void" : "billed",
        provided ? "provider" : "gateway",
      );
      answered(final);
      yield completed(s, current, usage, final, provided !== undefined);
      await record(final, completionRetries);
    } finally {
      input.signal.removeEventListener("abort", onClientAbort);
      if (pendingClose !== undefined) {
        // The answer was complete and reported; only its record was still to be written.
        await record(pendingClose, completionRetries).catch(() => undefined);
      } else if (!decided) {
        // The consumer stopped early (client gone between events) or a step before the first
        // byte failed: the reservation still ends, exactly once.
        // A consumer that stops reading after output began is a client that left, even when its
        // signal has not fired (yet): input plus the output it was sent, as the policy says.
        const cancelled = input.signal.aborted || delivered > 0n;
        const charged = cancelled && (dispatched || delivered > 0n);
        await settle(
          cancelled ? "cancelled" : "failed",
          {
            inputTokens: charged ? (provided?.inputTokens ?? inputBound) : 0n,
            outputTokens: delivered,
          },
          charged ? "partial" : "void",
          "gateway",
          !cancelled
            ? "the provider failed before the first byte"
            : charged
              ? "client disconnected"
              : "client disconnected before the provider got the request",
        ).catch(() => undefined);
        abort.abort();
      }
    }
  }

  function completed(
    s: Served,
    offer: Candidate,
    usage: Usage,
    final: { charge: bigint; billing: Billing },
    usageFromProvider: boolean,
  ): ChatCompleted {
    return {
      type: "completed",
      requestId: s.requestId,
      quoteId: s.quoteId,
      offerId: offer.offer.offerId,
      tariffVersion: offer.offer.tariff.version,
      inputTokens: usage.inputTokens,
      outputTokens: usage.outputTokens,
      creditsCharged: final.charge,
      billing: final.billing,
      usageFromProvider,
    };
  }

  return {
    createQuote,
    chat,
    whenRecorded: (requestId) => recording.get(requestId) ?? Promise.resolve(),
    drain: async () => {
      while (recording.size > 0) await Promise.all(recording.values());
      for (let round = 0; outbox.size > 0 && round < 5; round++) {
        if ((await retryCloses()).pending > 0) await new Promise((r) => setTimeout(r, 500));
      }
    },
    retryCloses,
  };
}

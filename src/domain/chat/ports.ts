/**
 * The ports of the chat pipeline: the `Inference` a call is made on and its input (`ChatInput`),
 * what the pipeline calls (the ledger, the quote and Idempotency-Key stores, the provider's
 * upstream, the metrics, measurement and tracing hooks) and the dependencies `createInference`
 * is given (`InferenceDeps`). The data they carry is in `types.ts`.
 */
import type { Hex } from "viem";
import type { Catalog } from "../catalog.js";
import type { ChatRequest, JsonBounds } from "./request/index.js";
import type { EndpointSecret } from "../health-types.js";
import type { SpendingAuthority } from "../permit-authorization/index.js";
import type { PermitReader } from "../permits.js";
import type { Metering, TokenCounters } from "../tokens.js";
import type { OfferMeasurements } from "../reputation/measurement-types.js";
import type { CooldownBounds, OfferCooldowns } from "../reputation/cooldowns.js";
import type { AuditStandings } from "../audits/standing.js";
import type { Closing } from "./metering.js";
import type { ChatEvent, ChatSink, FinalizeInput, QuoteRecord, UsageFigures } from "./types.js";
import type { WakeFees } from "./wake-fees.js";
import type { X402Payments } from "../x402/index.js";

export interface QuoteStore {
  insert(quote: QuoteRecord): Promise<void>;
  get(quoteId: Hex): Promise<QuoteRecord | undefined>;
}

export type ReserveRefusal =
  | "insufficient_credits"
  | "offer_at_capacity"
  | "quote_used"
  | "authorization_cap_exhausted"
  | "authorization_period_cap_exhausted";
export type ReserveResult = { ok: true } | { ok: false; reason: ReserveRefusal };

/**
 * A request's reservation, as the pipeline hands it to {@link Ledger.reserve}: the port, declared
 * once (the database's input, adapters/pg/ledger/reserve.ts, is this less what only the leases
 * read, plus what only the database needs).
 */
export interface ReserveInput {
  readonly requestId: Hex;
  readonly apiKeyId: string;
  readonly model: string;
  readonly modelId: Hex;
  readonly offerId: Hex;
  readonly permitId: Hex;
  readonly quoteId: Hex;
  readonly stream: boolean;
  readonly maximumCredits: bigint;
  readonly tariffVersion: bigint;
  readonly inputTokens: bigint;
  readonly deposit: bigint;
  readonly chainSettled: bigint;
  readonly maxConcurrency: number;
  readonly now: number;
  readonly quote?: QuoteRecord;
  /**
   * Reserve this request alone, durably, before the call (a supplied quote is single use,
   * an Idempotency-Key is claimed first); otherwise it may be admitted against a lease.
   */
  readonly durable?: boolean;
  /** The permit's expiry (Unix seconds): a lease on it is given back once it passes. */
  readonly permitExpiresAt?: number;
  /** The permit authorization that admits the request, recorded on it. */
  readonly authorizationId?: string;
  /**
   * That authorization has a total cap: the maximum is reserved against it too, per request
   * (never against a lease); refused `authorization_cap_exhausted` when it does not fit.
   */
  readonly capped?: boolean;
  /**
   * That authorization has a periodic cap (issue 38): the start (Unix seconds, the gateway's
   * clock) of the period the request is admitted in, which it counts against; refused
   * `authorization_period_cap_exhausted` when it does not fit what remains of that period's cap.
   */
  readonly periodStart?: number;
}

/**
 * A payer's soft threshold on the ledger of a capped authorization (issue 38;
 * adapters/pg/authorization-warnings.ts), read just after a request's admission through it.
 */
export interface AuthorizationThresholds {
  /**
   * The use `warnAt` is measured on (the current period's with a periodic cap, else the
   * total's: charged and held), and whether this call is the one that found it crossed first in
   * its period (exactly one per period, across processes). Undefined: the authorization has no
   * ledger (no total or periodic cap).
   */
  measure(
    authorizationId: string,
    warnAt: bigint,
  ): Promise<{ used: bigint; crossed: boolean } | undefined>;
}

/** The reservation ledger (adapters/pg/ledger/index.ts); each call is one transaction. */
export interface Ledger {
  /**
   * Throws when the outcome is unknown (the caller voids the request), or with an error whose
   * `sent` is false when the reservation was refused before it reached the database
   * (backpressure: nothing happened, nothing to void). Either way the answer is 503.
   */
  reserve(input: ReserveInput): Promise<ReserveResult>;
  /**
   * pending -> streaming. False when the request is no longer open: the orphan rule closed it
   * (this process looked dead), so this process must stop serving it.
   */
  markStreaming(requestId: Hex): Promise<boolean>;
  finalize(input: FinalizeInput): Promise<{ finalized: boolean; creditsCharged: bigint }>;
  /**
   * The void close of a reservation whose outcome is unknown, by the reservation's own input
   * (`close` is its `failed`, `void` finalisation): also when the reservation is still under way
   * and lands after this close, it ends holding nothing. Without it, `finalize` is used, which
   * only closes a reservation that has landed.
   */
  voidReservation?(
    reservation: ReserveInput,
    close: Parameters<Ledger["finalize"]>[0],
  ): Promise<{ finalized: boolean; creditsCharged: bigint }>;
  switchOffer(input: {
    requestId: Hex;
    offerId: Hex;
    maximumCredits: bigint;
    tariffVersion: bigint;
    maxConcurrency: number;
    deposit: bigint;
    chainSettled: bigint;
  }): Promise<boolean>;
  /** Settles once a record write of the request still in progress has ended (leases). */
  whenWritten?(requestId: string): Promise<void>;
  /** Settles once every record write in progress now has ended (leases). */
  whenAllWritten?(): Promise<void>;
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
  /** The provider's `Retry-After` header, as sent (a 429's or 503's cooldown). */
  readonly retryAfter?: string | undefined;
  /** The whole body as text (non-streaming answers). */
  text(): Promise<string>;
  /**
   * The data of each server-sent event pushed to `into` as it arrives (streaming answers): `into` returning false pauses the provider's body until
   * {@link UpstreamFlow.resume}. See `ChatSink` (types.ts) for what may run inside `into`.
   */
  stream(into: (data: string) => boolean): UpstreamFlow;
  /** Drops the body (an answer that will not be used). */
  discard(): Promise<void>;
}

/**
 * A provider's body being pushed to its reader: its streamed answer ({@link UpstreamReply.stream})
 * and, below it, the bytes of the response (adapters/upstream/http.ts): the port, declared once.
 */
export interface UpstreamFlow {
  /**
   * Resolves at the body's end or when the reader stopped it; rejects with `upstream_error` (the
   * body broke off or fell silent), the call's abort reason, or what the reader threw or failed
   * it with.
   */
  readonly done: Promise<void>;
  /** Reads on after the reader returned false. */
  resume(): void;
  /** The reader wants nothing more (`[DONE]`, the priced limit): `done` resolves. */
  stop(): void;
  /** The reader gives up with `error`: nothing more is pushed, `done` rejects with it. */
  fail(error: unknown): void;
}

/** Sends a chat body to a provider; rejects (GatewayError) when no answer header arrives. */
export type UpstreamChat = (
  endpoint: EndpointSecret,
  body: Uint8Array,
  options: UpstreamChatOptions,
) => Promise<UpstreamReply>;

export interface UpstreamChatOptions {
  readonly signal: AbortSignal;
  /**
   * A non-streamed call: the most output tokens its answer may hold (the priced limit of each
   * choice times the choices). An OpenAI-compatible server sends a JSON answer's headers only
   * once it is generated, so the adapter waits for them (and for the body) as long as these
   * tokens take at UPSTREAM_MIN_TOKENS_PER_SECOND, if that is longer than UPSTREAM_TIMEOUT_MS.
   * Absent (streams): the headers deadline alone.
   */
  readonly answerOutputTokens?: bigint | undefined;
}

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
  /**
   * The claim's request began (its reservation is committed): the claim names it, so that the
   * orphan rule never releases the key of a request that was charged (a retry would be served
   * and charged again) even when its result was never stored.
   */
  begin(input: { apiKeyId: string; key: string; requestId: Hex }): Promise<void>;
  complete(input: {
    apiKeyId: string;
    key: string;
    requestId: Hex;
    events: readonly ChatEvent[];
  }): Promise<void>;
  release(input: { apiKeyId: string; key: string }): Promise<void>;
}

/**
 * Hooks for metrics (the domain never imports a metrics library). Each is called a few times per
 * request, never per chunk, and must not throw. Times are seconds.
 */
export interface ChatObserver {
  /** From the request's arrival in the pipeline to its first provider call. */
  overhead(seconds: number): void;
  /** From the call of the provider that answered to its first token (a JSON answer: its body). */
  firstToken(modelId: Hex, offerId: Hex, seconds: number): void;
  /** From the call of the provider that answered to the end of its answer, complete or not. */
  upstreamDone(modelId: Hex, offerId: Hex, seconds: number): void;
  /**
   * A request's close was decided: the usage and the credits it charges (0 when void), and the
   * usage details (0 when the provider reported none).
   */
  charged(
    modelId: Hex,
    offerId: Hex,
    inputTokens: bigint,
    outputTokens: bigint,
    credits: bigint,
    details: { readonly cachedInputTokens: bigint; readonly reasoningTokens: bigint },
  ): void;
  /** A completed answer's claim and count (the claim/count histogram per offer). */
  usageCompared?(modelId: Hex, offerId: Hex, claimed: UsageFigures, counted: UsageFigures): void;
  /** An offer's provider answered 429 (or 503 with Retry-After): it cools down this long. */
  cooledDown?(modelId: Hex, offerId: Hex, seconds: number): void;
  /**
   * A request admitted at or over its authorization's soft threshold (issue 38): `crossed` for
   * the one admission per period that crossed it; `period` is the authorization's ("" the
   * total's). No id: the metric's labels stay bounded and name no one.
   */
  budgetWarned?(period: string, crossed: boolean): void;
}

export interface InferenceDeps {
  readonly catalog: Catalog;
  /**
   * Sees each chat request once it is admitted (reserved on its permit; never a refused one),
   * with the payer whose permit pays for it (an x402 request's: the paying address): the
   * audits' sample of what clients' requests look like, never what they say
   * (src/domain/audits/shapes.ts).
   */
  readonly observeRequest?:
    | ((
        modelId: Hex,
        req: ChatRequest,
        dialect: "responses" | "messages" | undefined,
        apiKeyId: string,
        payer: Hex,
      ) => void)
    | undefined;
  readonly permits: PermitReader;
  readonly quotes: QuoteStore;
  readonly ledger: Ledger;
  readonly endpoints: EndpointLookup;
  /** The gateway's own token counts per model (absent: the byte bound for every model). */
  readonly tokens?: TokenCounters | undefined;
  /**
   * The most hidden reasoning an offer's tariff may price, as a multiple of the visible output
   * (HIDDEN_REASONING_RATIO_MAX); absent: `defaultHiddenReasoningRatioMax` (usage.ts).
   */
  readonly hiddenReasoningRatioMax?: bigint | undefined;
  readonly upstream: UpstreamChat;
  readonly idempotency: IdempotencyStore;
  /** Unix seconds. */
  readonly clock: () => number;
  /**
   * Unix seconds a permit's expiry is judged by at admission (`PermitClock.now`: the later of
   * `clock` and the chain's latest block time the gateway has seen); default `clock`.
   */
  readonly permitClock?: () => number;
  readonly bodyLimitBytes: number;
  /** MAX_JSON_DEPTH / MAX_JSON_ARRAY_ITEMS of chat and quote bodies; absent: the defaults. */
  readonly jsonBounds?: JsonBounds | undefined;
  /**
   * Most chunk bytes an Idempotency-Key keeps of one answer (IDEMPOTENCY_MAX_RESULT_BYTES);
   * default `defaultIdempotencyMaxResultBytes` (types.ts).
   */
  readonly idempotencyMaxResultBytes?: number | undefined;
  /**
   * Told when a completed answer's Idempotency-Key result could not be stored (the store
   * threw): the answer is still delivered and charged, and the key's replay is lost (its claim
   * stays, so a retry is refused 409 `idempotency_in_progress`, not served and charged again).
   * For the operator's log; it must not throw. Absent: nothing is told.
   */
  readonly onIdempotencyResultLost?: (lost: { requestId: string; error: unknown }) => void;
  readonly newId?: () => Hex;
  /** Metrics hooks; absent: nothing is observed. */
  readonly observer?: ChatObserver;
  /**
   * What is measured of offers over a window (`provider.sort`, the catalog's reputation): the
   * relay records each request the provider served (with its timing) or failed, routing reads
   * it. Absent: nothing is measured, and sorting by latency or throughput keeps the default
   * order.
   */
  readonly measurements?: OfferMeasurements | undefined;
  /**
   * Offers cooling down after their provider's 429 (or 503 with Retry-After), shared across
   * processes (reputation/cooldowns.ts): routing leaves them out, a 429 sets one. Absent: a 429
   * fails over like a 5xx and nothing cools down.
   */
  readonly cooldowns?: OfferCooldowns | undefined;
  /** The bounds of a cooldown (required with `cooldowns`). */
  readonly cooldownBounds?: CooldownBounds | undefined;
  /**
   * The soft thresholds payers set on capped authorizations (issue 38): absent, no answer
   * carries a budget warning.
   */
  readonly thresholds?: AuthorizationThresholds | undefined;
  /**
   * The offers' audit standings, shared across processes (audits/standing.ts): routing sorts
   * flagged offers last, leaves excluded ones out (pinned: 503 `offer_model_mismatch`) and
   * serves `provider.require_audited`. Absent: every offer is `unaudited`.
   */
  readonly audits?: Pick<AuditStandings, "stateOf"> | undefined;
  /**
   * Admits a `stream: true` chat of an API key before anything is reserved (throws 429
   * `rate_limited` at the key's limit of streams in flight) and returns its release, called
   * once the call ends however it ends. Absent: no limit.
   */
  readonly acquireStream?: (apiKeyId: string) => (() => void) | Promise<() => void>;
  /** Tracing (OpenTelemetry, src/runtime/tracing.ts); absent: tracing is off and nothing is allocated. */
  readonly tracer?: ChatTracer | undefined;
  /**
   * Whether a request whose quote priced the wake fee is charged it: only when the gateway saw
   * the endpoint asleep, once per offer per wake window (wake-fees.ts). Absent: no wake fee is
   * ever charged.
   */
  readonly wakeFees?: WakeFees | undefined;
  /**
   * x402 payments (issue 37): absent, a request without credentials is refused 401 as before
   * (the facade never hands one on).
   */
  readonly x402?: X402Payments | undefined;
}

/** Starts the trace of one chat call (the domain never imports a tracing library). */
export interface ChatTracer {
  start(input: ChatInput): ChatTrace;
}

/** The steps of a chat request a trace marks as they happen (pipeline.ts, call.ts). */
export type ChatStep = "replayed" | "quote" | "permit" | "route" | "upstream" | "first_token";

/**
 * The trace of one chat call, told what the pipeline learns when it learns it. Called only
 * through `trace?.`, so with tracing off no argument is even built. It must not throw.
 */
export interface ChatTrace {
  /** The body parsed: the model asked for and whether it streams. */
  request(model: string, stream: boolean): void;
  step(step: ChatStep): void;
  /** Reserved: what the request is admitted as. */
  admitted(admission: {
    readonly requestId: Hex;
    readonly quoteId: Hex;
    readonly offerId: Hex;
    readonly permitId: Hex;
    readonly maximumCredits: bigint;
  }): void;
  /** The request's one close, decided (the charge, the usage it was priced on, the billing). */
  closed(closing: Closing): void;
  /** The call ended; `error` when it failed (its code only is traced, never its message). */
  end(error?: unknown): void;
}

export interface ChatInput {
  readonly apiKeyId: string;
  /**
   * The permits the key's payers authorized it to spend (DESIGN.md section 8), answered in
   * memory: a permit it does not cover is refused before anything is reserved.
   */
  readonly authority: SpendingAuthority;
  readonly body: Uint8Array;
  readonly permitId: string | undefined;
  readonly quoteId: string | undefined;
  readonly idempotencyKey: string | undefined;
  readonly signal: AbortSignal;
  /** The dialect `body` is written in (DESIGN.md section 9); absent: a chat completion. */
  readonly dialect?: "responses" | "messages" | undefined;
  /**
   * The request pays for itself with x402 (no API key): its `PAYMENT-SIGNATURE` payload
   * (absent: answer 402 with what to pay) and the URL it was made on. `apiKeyId` is then
   * `x402:<payer>` and `authority` covers nothing.
   */
  readonly x402?: { readonly payload: unknown; readonly url: string } | undefined;
  /**
   * The caller's request headers, read only by a tracer (W3C `traceparent`): a reference, so
   * tracing off costs nothing.
   */
  readonly headers?: { get(name: string): string | null } | undefined;
}

/**
 * A quote as its client sees it: the record, and how the request it prices is metered (the
 * model's tokenizer, or the byte bound; DESIGN.md section 10), so a client can refuse bound
 * metering before it spends (`provider.require_exact_metering`).
 */
export interface ShownQuote extends QuoteRecord {
  readonly metering: Metering;
}

export interface Inference {
  createQuote(input: {
    apiKeyId: string;
    body: Uint8Array;
    dialect?: "responses" | "messages" | undefined;
  }): Promise<ShownQuote>;
  /**
   * One chat call, its answer pushed to `sink` (`ChatSink` is the contract): the REST facade's
   * way in. Settles when the call is over; rejects only with a failure after `completed`.
   */
  chatInto(input: ChatInput, sink: ChatSink): Promise<void>;
  /**
   * Settles once this process has recorded the request's final state, if it is recording it
   * now (a completed answer goes to the client just before its charge is committed).
   */
  whenRecorded(requestId: string): Promise<void>;
  /**
   * Settles once every request this process answered so far has its record written (opened and,
   * if answered, closed): a list of a key's records reads its own writes (ListRequests). Waits
   * for the writes in flight now, which the batches bound, never for later ones.
   */
  whenAllRecorded(): Promise<void>;
  /**
   * Settles when no chat call is under way any more and every answer given so far has its
   * final state recorded (graceful shutdown: called once the calls in flight ended or were cut).
   */
  drain(): Promise<void>;
  /**
   * Writes the closes the ledger refused so far (housekeeping calls it every round): until it
   * has, their reservations and offer slots stay held.
   */
  retryCloses(): Promise<{ written: number; pending: number }>;
}

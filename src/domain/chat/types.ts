/**
 * The metered chat pipeline's data: what a request is closed as (`CloseRecord`), the events of
 * its answer (`ChatEvent`) and the sink contract they are pushed through (`ChatSink`), a quote,
 * and the usage figures. The ports (the `Inference` a call is made on and its input, and what
 * the pipeline calls: the ledger, the stores, the upstream, the hooks) are in `ports.ts`. The
 * pipeline runs as separate visible steps (`pipeline.ts`), each request's one durable close
 * (`lifecycle.ts`), the call to and the relay of the provider's answer (`call.ts`) and its
 * metering (`metering.ts`). It knows neither HTTP nor protobuf.
 */
import type { SignedUsageReceipt } from "../receipt-types.js";
import type { BudgetWarning } from "../permit-authorization/index.js";
import type { Hex } from "viem";

export const quoteLifetimeSeconds = 60;
export const idempotencyLifetimeSeconds = 24 * 3600;

export type Billing = "billed" | "partial" | "void";

/** The final states of a request; it reaches exactly one of them, once. */
export type FinalStatus = "completed" | "failed" | "cancelled";
/** Whose token count a close's charge was computed from. */
export type UsageSource = "provider" | "gateway";

/** Token figures of one answer: a provider's usage claim or the gateway's own count (DESIGN.md 10). */
export interface UsageFigures {
  readonly inputTokens: bigint;
  readonly outputTokens: bigint;
  readonly cachedInputTokens: bigint;
  readonly reasoningTokens: bigint;
}

export interface Usage {
  readonly inputTokens: bigint;
  readonly outputTokens: bigint;
  /**
   * Usage details (DESIGN.md section 9), recorded and shown, never priced: of `inputTokens`,
   * those the provider served from its prompt cache; of `outputTokens`, those spent on
   * reasoning. Absent: 0 (the gateway's own count has none).
   */
  readonly cachedInputTokens?: bigint;
  readonly reasoningTokens?: bigint;
}

/**
 * A request's close as it is recorded: the one shape the lifecycle hands the ledger, the lease
 * ledger writes and PostgreSQL stores. Its usage details (absent: 0) are recorded by the same
 * write and never priced. Decided in memory first (billing.ts, metering.ts `Closing`).
 */
export interface CloseRecord extends Usage {
  readonly status: FinalStatus;
  /** At most the request's maximum; 0 when `void`. */
  readonly creditsCharged: bigint;
  readonly billing: Billing;
  readonly usageSource: UsageSource;
  /** The provider's usage claim; absent when it reported none. */
  readonly claimed?: UsageFigures | undefined;
  /** The gateway's own count; absent when no answer was counted (nothing reached the client). */
  readonly counted?: UsageFigures | undefined;
  readonly error?: string | undefined;
  /** Unix seconds. */
  readonly now: number;
}

/** A {@link CloseRecord} of one request: what `Ledger.finalize` (ports.ts) takes. */
export interface FinalizeInput extends CloseRecord {
  readonly requestId: Hex;
}

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
  /** A dialect's SSE event name (the translator stage); absent for chat completion chunks. */
  readonly event?: string;
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
  /**
   * The usage details (metering.ts `Usage`): shown, never priced. Absent (0) in an answer an
   * Idempotency-Key stored before they were recorded.
   */
  readonly cachedInputTokens?: bigint;
  readonly reasoningTokens?: bigint;
  /** The provider's usage claim; absent when it reported none. */
  readonly claimed?: UsageFigures | undefined;
  /** The gateway's own count; absent when no answer was counted (nothing reached the client). */
  readonly counted?: UsageFigures | undefined;
  /**
   * The signed usage receipt of the closed record: a streamed answer paid with x402 ends with it
   * (its headers are gone by then), when the gateway signs receipts and the request charged
   * something. Absent otherwise.
   */
  readonly receipt?: SignedUsageReceipt | undefined;
  /**
   * The payer's soft threshold reached (issue 38): the authorization that admitted the request
   * was at or over it just after the admission. Absent otherwise.
   */
  readonly budgetWarning?: BudgetWarning | undefined;
}

/**
 * Ends a stream that failed after it started; replays re-raise it. As an Idempotency-Key's
 * stored result, `idempotency_result_too_large` stands for an answer too large to keep: its
 * replay is that error at once, before anything else.
 */
export interface ChatFailed {
  readonly type: "failed";
  readonly code: "upstream_error" | "upstream_unavailable" | "idempotency_result_too_large";
  readonly message: string;
}

export type ChatEvent = ChatStarted | ChatChunk | ChatCompleted | ChatFailed;

/**
 * The sink contract: how one chat call hands its answer to a transport, pushed (issue 29; in
 * the style of undici's dispatch handlers). `Inference.chatInto(input, sink)` is the chat path;
 * the REST facade gives it a sink that writes into the client's socket, and the RPC's async
 * generator is a bridge over the same call (src/connect/chat-bridge.ts).
 *
 * Order: `started` once, then `chunk` any number of times, then exactly one terminal call:
 * `completed`, `failed` or `cancelled`. A call refused before its answer began gets `failed`
 * (or `cancelled`) without `started`; nothing is called after the terminal call. `chatInto`'s
 * promise settles when the call is over (its charge recorded); it rejects only with a failure
 * after `completed` (recording the charge), which the client does not see and the logs do.
 * Layers between the call and the transport forward what they do not change
 * (`ForwardingSink`, sink.ts); `test/helpers/checked-sink.ts` checks the order in tests.
 *
 * What may run inside each call:
 * - `started`, `completed`: per request, awaited by the call. `completed` is awaited before the
 *   charge is recorded, so the client has its answer first. `started` hands the sink the call's
 *   {@link AnswerController}: how the consumer paces the answer (issue 36, item 4).
 * - `chunk`: per streamed event, inside the provider's read (synchronously, from the upstream
 *   adapter's `data` event): no await, no I/O of its own beyond queueing bytes, never throws.
 *   A consumer that cannot take more calls `pause()` (the provider's body waits after the read
 *   under way) and `resume()` once it can.
 * - `failed`, `cancelled`: terminal, synchronous. `cancelled` when the call's signal aborted
 *   (the client left, or shutdown cut the call: `reason` says which); `failed` otherwise (after
 *   `abort(reason)`, with that reason).
 */
export interface ChatSink extends AnswerSink {
  /** The call failed (refused, or the answer broke off after it began). */
  failed(error: unknown): void;
  /** The call's signal aborted before the answer completed; `reason` is the signal's. */
  cancelled(reason: unknown): void;
}

/**
 * A call's flow control, handed to its sink with `started`, as undici hands a dispatch handler
 * its controller: the consumer says when it is full, when it can take more and when it stopped
 * for good, instead of a return value and a promise that every layer between forwards.
 */
export interface AnswerController {
  /**
   * The consumer is full: the provider's body is read on no further (the events of the read
   * under way still come). Called inside `chunk` it holds the body at once; called between
   * events, at the next one. Idempotent.
   */
  pause(): void;
  /** The consumer can take more: the body is read on (unless the call holds it itself). */
  resume(): void;
  /**
   * The consumer stopped reading for good (the RPC's caller stopped iterating): the provider's
   * call is aborted with `reason`, and the request closes as a client that left (input plus the
   * output it was handed). The terminal call that follows is `failed(reason)` or `cancelled`;
   * no `chunk` or `completed` comes after it. After the terminal call the controller changes
   * nothing (a consumer may resume or abort a call whose last event it has not taken yet).
   */
  abort(reason: unknown): void;
}

/** What the layers of a chat call hand on between them: a sink without its terminal failures. */
export interface AnswerSink {
  started(event: ChatStarted, controller: AnswerController): void | Promise<void>;
  /**
   * One event of the answer. `parsed`: the provider's chunk as the relay parsed (and possibly
   * rewrote) it, for a translator that would otherwise parse `data` again.
   */
  chunk(event: ChatChunk, parsed?: unknown): void;
  completed(event: ChatCompleted): void | Promise<void>;
}

/** IDEMPOTENCY_MAX_RESULT_BYTES's default: 1 MiB, about 5 000 streamed tokens. */
export const defaultIdempotencyMaxResultBytes = 1024 * 1024;

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

import type { SignedUsageReceipt } from "../receipt-types.js";
import type { OutputReader } from "../chat/output-tally.js";
import type { GatewayError } from "../errors.js";

/**
 * The port every client dialect implements (DESIGN.md section 9): a pure translator between a
 * dialect's request, answer and event stream and the canonical OpenAI chat completion, so that
 * quotes, permits, routing, metering and settlement only ever see the canonical request.
 */

/** One event of a dialect's stream: SSE `event:` name (when the dialect names events) and its JSON data. */
export interface DialectEvent {
  readonly event?: string;
  readonly data: unknown;
}

/** What the gateway knows when the answer completes (the x_gateway object's fields). */
export interface GatewayCharge {
  readonly request_id: string;
  readonly quote_id: string;
  readonly offer_id: string;
  readonly tariff_version: string;
  readonly input_tokens: string;
  readonly output_tokens: string;
  /** Usage details (added later, so optional for a translator's callers): decimal strings. */
  readonly cached_input_tokens?: string;
  readonly reasoning_tokens?: string;
  readonly credits_charged: string;
  readonly billing: string;
  /**
   * The provider's usage claim and the gateway's count (DESIGN.md section 10), null when none,
   * and whose figures were charged (added later, so optional for a translator's callers).
   */
  readonly usage_claimed?: GatewayFigures | null;
  readonly usage_counted?: GatewayFigures | null;
  readonly usage_source?: "provider" | "gateway";
  /**
   * The signed usage receipt a streamed answer paid with x402 ends with (ChatCompleted's
   * `receipt`); absent otherwise.
   */
  readonly receipt?: SignedUsageReceipt;
  /** The payer's soft threshold reached (ChatCompleted's `budget_warning`); absent otherwise. */
  readonly budget_warning?: GatewayBudgetWarning;
}

/** `x_gateway.budget_warning` (issue 38): amounts as decimal strings. */
export interface GatewayBudgetWarning {
  readonly code: "authorization_warn_threshold_reached";
  readonly message: string;
  readonly authorization_id: string;
  readonly warn_at: string;
  readonly used: string;
  readonly cap: string;
  readonly period: string;
  /** Unix seconds; null for a threshold on the total. */
  readonly period_renews_at: number | null;
}

/** Token figures in `x_gateway` (decimal strings, as its other token counts). */
export interface GatewayFigures {
  readonly input_tokens: string;
  readonly output_tokens: string;
  readonly cached_input_tokens: string;
  readonly reasoning_tokens: string;
}

export interface StreamTranslator {
  /** One canonical chat.completion.chunk object from the provider (already parsed). */
  chunk(chunk: unknown): DialectEvent[];
  /** The answer completed: the dialect's closing events, the last one carrying `x_gateway`. */
  finish(charge: GatewayCharge): DialectEvent[];
  /** The stream failed after it began: the dialect's error event(s). */
  fail(error: GatewayError): DialectEvent[];
}

export interface Dialect {
  readonly name: "responses" | "messages";
  /** Validates a dialect request body (already JSON-parsed) and returns the canonical chat
   * completion request object; throws GatewayError("invalid_request", message) on bad input. */
  toCanonical(body: unknown): { readonly chat: Record<string, unknown>; readonly stream: boolean };
  /** A non-streamed canonical chat.completion answer -> the dialect's JSON answer, with `x_gateway`. */
  fromCompletion(completion: unknown, charge: GatewayCharge): unknown;
  createStream(ctx: { readonly requestId: string; readonly model: string }): StreamTranslator;
  /**
   * What this dialect's translator reads of an answer (a stream's or a JSON one), asked by the
   * output tally before it counts and relays anything: what the translator would not read or
   * would drop after its cut is neither relayed nor charged (DESIGN.md 10).
   */
  reader(stream: boolean): OutputReader;
  /** The dialect's error body for a gateway error (carrying the gateway's code). */
  errorBody(error: GatewayError): unknown;
}

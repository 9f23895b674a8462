import type { Hex } from "viem";
import type { Tariff } from "../catalog.js";
import { closingOf, type Closing } from "./metering.js";
import { type Usage } from "./types.js";
import type { UsageFigures } from "./types.js";
import type { UsageJudgment } from "./usage.js";

/**
 * The billing decision (DESIGN.md section 3, docs/decisions/chat-quotes-and-money.md): how a request closes (status,
 * usage, billed/partial/void, charge, error) as one pure function of what happened to it. The
 * relay describes what happened; it decides nothing about money itself.
 */

/** Who cut a call the client did not see to its end. */
export type CancelledBy = "client" | "shutdown";

/** What happened to a request, as the relay saw it. */
export type Outcome =
  /**
   * The answer ended complete: what the provider claimed, what the gateway counted, and what
   * is charged of them (usage.ts `judgeUsage`: per kind, the lower of the claim and the count
   * plus tolerance).
   */
  | {
      readonly kind: "completed";
      readonly judgment: UsageJudgment;
      /**
       * False for a stream none of whose events was JSON: the provider answered nothing a
       * client can read, and nothing is charged (as for a JSON answer that is not JSON).
       */
      readonly readable?: boolean;
    }
  /** The body of a JSON answer could not be read: the provider failed while answering. */
  | { readonly kind: "unreadable" }
  /** A JSON answer that is not JSON. */
  | { readonly kind: "invalid_json" }
  /**
   * The provider failed after its first byte; `delivered` output tokens (the gateway's count)
   * reached the client.
   */
  | { readonly kind: "provider_failed"; readonly delivered: bigint }
  /**
   * The orphan rule closed the request while this process served it (its process looked
   * stopped); `delivered` output tokens reached the client.
   */
  | { readonly kind: "orphaned"; readonly delivered: bigint }
  /**
   * The client left (or stopped reading after output began), or shutdown cut the call.
   * `dispatched`: the upstream call had started (the provider may have the request); `input`:
   * the input charged (the lower of the provider's claim, if it made one, and the gateway's
   * count plus tolerance); `delivered`: the gateway's count of the output the client was sent.
   */
  | {
      readonly kind: "cancelled";
      readonly by: CancelledBy;
      readonly dispatched: boolean;
      readonly input: bigint;
      readonly delivered: bigint;
    }
  /**
   * A step before the answer's first byte failed (the provider, the ledger, the endpoint
   * lookup); `reason` is the error's own text where it has one.
   */
  | { readonly kind: "failed"; readonly reason: string | undefined };

/** What a close is priced with: the offer that served and the request's quoted maximum. */
export interface ClosePricing {
  readonly tariff: Tariff;
  /** The quote said the call wakes the endpoint: its fee is charged on a completed answer. */
  readonly wakes: boolean;
  readonly maximum: bigint;
  readonly offerId: Hex;
}

const nothing: Usage = { inputTokens: 0n, outputTokens: 0n };

/**
 * How a request closes. Completed: the judged usage (the lower of claim and count) priced
 * with the wake fee, at most `maximum`, billed, its input included when its output is empty. The client left
 * or shutdown cut the call: its input plus the output delivered, partial; nothing, void, if the
 * provider never got the request. The provider failed after the first byte (or the orphan rule
 * took the request): only the output delivered, partial. The provider failed before the first
 * byte, or its answer was unusable: nothing, void. Any close whose charge is 0 is void.
 */
export function decideClose(outcome: Outcome, pricing: ClosePricing): Closing {
  switch (outcome.kind) {
    case "completed": {
      if (outcome.readable === false) {
        return failedVoid(pricing, "the provider's stream carried no JSON event");
      }
      const { charged: usage, claimed, counted, chargedClaim } = outcome.judgment;
      return closingOf({
        ...pricing,
        status: "completed",
        usage,
        // Never void for an empty output: the provider served the prompt (DESIGN.md 10).
        billing: "billed",
        usageSource: chargedClaim ? "provider" : "gateway",
        claimed: claimed === undefined ? undefined : figuresOf(claimed),
        counted: {
          inputTokens: counted.inputTokens,
          outputTokens: counted.outputTokens,
          cachedInputTokens: 0n,
          reasoningTokens: counted.reasoningTokens,
        },
        error: undefined,
      });
    }
    case "unreadable":
      return failedVoid(pricing, "the provider failed while answering");
    case "invalid_json":
      return failedVoid(pricing, "the provider answered invalid JSON");
    case "provider_failed":
    case "orphaned":
      return closingOf({
        ...pricing,
        status: "failed",
        usage: { inputTokens: 0n, outputTokens: outcome.delivered },
        billing: "partial",
        usageSource: "gateway",
        claimed: undefined,
        counted: undefined,
        error:
          outcome.kind === "orphaned"
            ? "closed by the orphan rule while served"
            : "the provider failed mid-stream",
      });
    case "cancelled": {
      const by =
        outcome.by === "shutdown" ? "cut by the gateway's shutdown" : "client disconnected";
      // Input is charged only once the provider has the request (docs/decisions/chat-quotes-and-money.md).
      const charged = outcome.dispatched || outcome.delivered > 0n;
      return closingOf({
        ...pricing,
        status: "cancelled",
        usage: {
          inputTokens: charged ? outcome.input : 0n,
          outputTokens: outcome.delivered,
        },
        billing: charged ? "partial" : "void",
        usageSource: "gateway",
        claimed: undefined,
        counted: undefined,
        error: charged ? by : `${by} before the provider got the request`,
      });
    }
    case "failed":
      return failedVoid(pricing, outcome.reason ?? "the provider failed before the first byte");
  }
}

function failedVoid(pricing: ClosePricing, error: string): Closing {
  return closingOf({
    ...pricing,
    status: "failed",
    usage: nothing,
    billing: "void",
    usageSource: "gateway",
    claimed: undefined,
    counted: undefined,
    error,
  });
}

function figuresOf(usage: Usage): UsageFigures {
  return {
    inputTokens: usage.inputTokens,
    outputTokens: usage.outputTokens,
    cachedInputTokens: usage.cachedInputTokens ?? 0n,
    reasoningTokens: usage.reasoningTokens ?? 0n,
  };
}

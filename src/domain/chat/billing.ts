import type { Hex } from "viem";
import type { Tariff } from "../catalog.js";
import { closingOf, type Closing, type Usage } from "./metering.js";

/**
 * The billing decision (DESIGN.md section 3, docs/decisions.md): how a request closes (status,
 * usage, billed/partial/void, charge, error) as one pure function of what happened to it. The
 * relay describes what happened; it decides nothing about money itself.
 */

/** Who cut a call the client did not see to its end. */
export type CancelledBy = "client" | "shutdown";

/** What happened to a request, as the relay saw it. */
export type Outcome =
  /**
   * The answer ended complete. `provided` is the usage the provider reported (none: the
   * gateway's own count, `inputBound` and `counted` output tokens, is used).
   */
  | {
      readonly kind: "completed";
      readonly provided: Usage | undefined;
      readonly inputBound: bigint;
      readonly counted: bigint;
    }
  /** The body of a JSON answer could not be read: the provider failed while answering. */
  | { readonly kind: "unreadable" }
  /** A JSON answer that is not JSON. */
  | { readonly kind: "invalid_json" }
  /** The provider failed after its first byte; `delivered` output tokens reached the client. */
  | { readonly kind: "provider_failed"; readonly delivered: bigint }
  /**
   * The orphan rule closed the request while this process served it (its process looked
   * stopped); `delivered` output tokens reached the client.
   */
  | { readonly kind: "orphaned"; readonly delivered: bigint }
  /**
   * The client left (or stopped reading after output began), or shutdown cut the call.
   * `dispatched`: the upstream call had started (the provider may have the request); `input`:
   * the provider's input count if it reported one, else the gateway's input bound.
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
 * How a request closes. Completed: the usage (the provider's, else the gateway's count) priced
 * with the wake fee, at most `maximum`, billed, and void without output tokens. The client left
 * or shutdown cut the call: its input plus the output delivered, partial; nothing, void, if the
 * provider never got the request. The provider failed after the first byte (or the orphan rule
 * took the request): only the output delivered, partial. The provider failed before the first
 * byte, or its answer was unusable: nothing, void. Any close whose charge is 0 is void.
 */
export function decideClose(outcome: Outcome, pricing: ClosePricing): Closing {
  switch (outcome.kind) {
    case "completed": {
      const { provided } = outcome;
      const usage = provided ?? { inputTokens: outcome.inputBound, outputTokens: outcome.counted };
      return closingOf({
        ...pricing,
        status: "completed",
        usage,
        billing: usage.outputTokens === 0n ? "void" : "billed",
        usageSource: provided === undefined ? "gateway" : "provider",
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
        error:
          outcome.kind === "orphaned"
            ? "closed by the orphan rule while served"
            : "the provider failed mid-stream",
      });
    case "cancelled": {
      const by =
        outcome.by === "shutdown" ? "cut by the gateway's shutdown" : "client disconnected";
      // Input is charged only once the provider has the request (docs/decisions.md).
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
    error,
  });
}

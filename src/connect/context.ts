import { createContextKey } from "@connectrpc/connect";
import type { SpendingAuthority } from "../domain/permit-authorization/index.js";

/** The API key a call was authenticated with (absent on operator-only calls). */
export interface Caller {
  readonly apiKeyId: string;
  /** The permits its payers authorized it to spend, answered in memory (loaded with the key). */
  readonly authority: SpendingAuthority;
}

export const callerKey = createContextKey<Caller | undefined>(undefined, {
  description: "authenticated API key",
});

/**
 * True when a call that also takes an API key was made with the settlement operator token
 * instead (GetOfferEarnings: the operator reads every offer's earnings).
 */
export const settlementOperatorKey = createContextKey<boolean>(false, {
  description: "called with the settlement operator token",
});

export const requestIdKey = createContextKey<string>("", { description: "request id for logs" });

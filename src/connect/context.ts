import { createContextKey } from "@connectrpc/connect";

/** The API key a call was authenticated with (absent on operator-only calls). */
export interface Caller {
  readonly apiKeyId: string;
}

export const callerKey = createContextKey<Caller | undefined>(undefined, {
  description: "authenticated API key",
});

export const requestIdKey = createContextKey<string>("", { description: "request id for logs" });

import { createHash, timingSafeEqual } from "node:crypto";
import { createContextKey } from "@connectrpc/connect";
import { GatewayService } from "../../gen/gateway/v1/gateway_pb.js";
import { PermitService } from "../../gen/gateway/v1/permit_pb.js";
import { ProviderService } from "../../gen/gateway/v1/provider_pb.js";
import { SettlementService } from "../../gen/gateway/v1/settlement_pb.js";
import { GatewayError } from "../domain/errors.js";
import type { SpendingAuthority } from "../domain/permit-authorization/index.js";
import type { FailureBudget } from "../domain/failure-budget.js";
import type { RateLimiter } from "../domain/rate-limit.js";
import type { Caller } from "./context.js";

/**
 * Who may call: anyone (`none`), an API key, the settlement operator's token, or either. The
 * RPCs' needs are {@link rpcAuthNeed}'s; the REST routes declare theirs (src/rest/routes/).
 */
export type AuthNeed = "none" | "apiKey" | "operator" | "apiKeyOrOperator";

/** What a request's credentials were found to be, for the need they were checked against. */
export type Authenticated =
  | { readonly need: AuthNeed; readonly operator: true }
  | { readonly need: AuthNeed; readonly operator: false; readonly caller: Caller };

/**
 * The credentials of a call, checked before its body was read (src/server.ts for the RPC paths,
 * the REST facade for its routes): the auth interceptor applies them instead of checking again.
 */
export const authenticatedKey = createContextKey<Authenticated | undefined>(undefined, {
  description: "credentials checked before the body was read",
});

export interface AuthOptions {
  /** Looks an API key up, with its spending authority; null when unknown or revoked. */
  readonly findApiKey: (
    key: string,
  ) => Promise<{ id: string; authority: SpendingAuthority } | null>;
  /**
   * Whether a key may be an active key of this gateway, answered from memory (src/domain/
   * api-key-store.ts); absent: every key may. An address out of its failure budget is still
   * served with such a key.
   */
  readonly plausibleApiKey?: (key: string) => boolean;
  readonly settlementOperatorToken: string;
  /**
   * Per-API-key request rate (src/domain/rate-limit.ts); absent: no limit. Applied by the auth
   * interceptor, when the call runs (after its body), so REST and RPC calls share one bucket
   * per key.
   */
  readonly rateLimiter?: RateLimiter | undefined;
  /**
   * Failed authentications per client address (ADDRESS_RATE_LIMIT_RPS / _BURST); absent: not
   * limited. Only requests checked with their address (before their body) count.
   */
  readonly failedAuthentications?: FailureBudget | undefined;
}

/** RPCs that take the settlement operator token as well as an API key. */
const operatorOrApiKey = new Set([
  `${ProviderService.typeName}/${ProviderService.method.getOfferEarnings.name}`,
]);

/**
 * RPCs anyone may call besides GatewayService's: a payer's own calls on its authorizations,
 * whose credential is the payer's EIP-712 signature in the request (a payer may hold no API
 * key). No rate limit per key applies; their requests are small and bounded
 * (connect/routes.ts `payerRequestMaxBytes`), every shape is checked before a signature.
 */
export const publicRpcs: ReadonlySet<string> = new Set([
  `${PermitService.typeName}/${PermitService.method.listPayerAuthorizations.name}`,
  `${PermitService.typeName}/${PermitService.method.revokePayerAuthorizations.name}`,
]);

/**
 * Every RPC needs credentials but GatewayService's (public facts answered from memory) and
 * {@link publicRpcs} (a payer's signed calls): the settlement service the operator token,
 * everything else an API key; a few ({@link operatorOrApiKey}) take either.
 */
export function rpcAuthNeed(service: string, method: string): AuthNeed {
  if (service === GatewayService.typeName || publicRpcs.has(`${service}/${method}`)) return "none";
  if (service === SettlementService.typeName) return "operator";
  return operatorOrApiKey.has(`${service}/${method}`) ? "apiKeyOrOperator" : "apiKey";
}

/** The token of an `Authorization: Bearer <token>` header. */
export function bearer(header: string | null | undefined): string | undefined {
  if (header === null || header === undefined) return undefined;
  const match = /^Bearer\s+(\S+)\s*$/i.exec(header);
  return match?.[1];
}

function digest(value: string): Buffer {
  return createHash("sha256").update(value).digest();
}

export type Authenticate = (
  need: Exclude<AuthNeed, "none">,
  authorization: string | null | undefined,
  address?: string,
) => Promise<Authenticated>;

/**
 * Checks a request's credentials against what it needs, and answers who it is; throws the
 * refusal (401 `missing_api_key` / `invalid_api_key` / `invalid_operator_token`, 503
 * `database_unavailable`). A key's request rate is not taken here (the auth interceptor does).
 *
 * With the caller's `address` (docs/decisions/authority-and-signing.md "Unknown keys cost nothing"): before anything
 * else, an address that has used up its budget of failed authentications is refused 429
 * `address_rate_limited` (Retry-After), unless its credentials are plausible from memory (a
 * key this gateway issued, the operator's token): a paying client behind the same address is
 * served. Each failed authentication takes from the budget.
 */
export function createAuthenticator(options: AuthOptions): Authenticate {
  const operatorDigest = digest(options.settlementOperatorToken);
  const isOperator = (token: string | undefined): boolean =>
    token !== undefined && timingSafeEqual(digest(token), operatorDigest);
  const plausible = options.plausibleApiKey ?? (() => true);
  const budget = options.failedAuthentications;

  const check = async (
    need: Exclude<AuthNeed, "none">,
    token: string | undefined,
  ): Promise<Authenticated> => {
    if (need === "operator") {
      if (!isOperator(token)) {
        throw new GatewayError(
          "invalid_operator_token",
          "settlement operations need the settlement operator token",
        );
      }
      return { need, operator: true };
    }
    if (need === "apiKeyOrOperator" && isOperator(token)) return { need, operator: true };
    if (token === undefined) {
      throw new GatewayError(
        "missing_api_key",
        "missing API key: send it as 'Authorization: Bearer <API key>'",
      );
    }
    let found: { id: string; authority: SpendingAuthority } | null;
    try {
      found = await options.findApiKey(token);
    } catch (error) {
      throw new GatewayError("database_unavailable", "the API key store cannot be reached", {
        cause: error,
      });
    }
    if (found === null) throw new GatewayError("invalid_api_key", "invalid API key");
    return { need, operator: false, caller: { apiKeyId: found.id, authority: found.authority } };
  };

  return async (need, authorization, address) => {
    const token = bearer(authorization);
    if (address === undefined || budget === undefined) return check(need, token);
    const wait = budget.exhausted(address);
    if (wait !== undefined) {
      const mayPass =
        token !== undefined &&
        ((need !== "apiKey" && isOperator(token)) || (need !== "operator" && plausible(token)));
      if (!mayPass) {
        throw new GatewayError(
          "address_rate_limited",
          "too many failed authentications from this address; retry after the Retry-After delay",
          { retryAfterSeconds: wait },
        );
      }
    }
    try {
      return await check(need, token);
    } catch (error) {
      if (error instanceof GatewayError && error.kind === "unauthenticated") budget.failed(address);
      throw error;
    }
  };
}

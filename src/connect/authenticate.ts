import { createHash, timingSafeEqual } from "node:crypto";
import { createContextKey } from "@connectrpc/connect";
import type { Hex } from "viem";
import { GatewayService } from "../../gen/gateway/v1/gateway_pb.js";
import { InferenceService } from "../../gen/gateway/v1/inference_pb.js";
import { PermitService } from "../../gen/gateway/v1/permit_pb.js";
import { ProviderService } from "../../gen/gateway/v1/provider_pb.js";
import { SettlementService } from "../../gen/gateway/v1/settlement_pb.js";
import { AuditService } from "../../gen/gateway/v1/audit_pb.js";
import { GatewayError } from "../domain/errors.js";
import type { SpendingAuthority } from "../domain/permit-authorization/index.js";
import type { FailureBudget } from "../domain/failure-budget.js";
import type { RateLimiter } from "../domain/rate-limit.js";
import type { Caller } from "./context.js";

/**
 * Who may call: anyone (`none`), an API key, the settlement operator's token, or either. The
 * RPCs' needs are {@link rpcAuthNeed}'s; the REST routes declare theirs (src/rest/routes/).
 */
export type AuthNeed = "none" | "apiKey" | "operator" | "apiKeyOrOperator" | "apiKeyOrPayer";

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
  /**
   * The payer a `ReadPayerRequests` token is signed by (lowercase; throws 401 `invalid_signature`
   * / `signature_expired`, 400 `invalid_request`): the credential of `apiKeyOrPayer` calls.
   * Absent: such calls take an API key only.
   */
  readonly payerReader?: ((credential: PayerCredential) => Promise<Hex>) | undefined;
}

/** `Authorization: Payer payer=0x…, deployment=…, expires_at=…, signature=0x…`, read. */
export interface PayerCredential {
  readonly payer: string;
  readonly deployment: string;
  readonly expiresAt: number;
  readonly signature: string;
}

/**
 * The caller id of a payer reading the requests it paid with x402: the `api_key_id` those
 * requests are recorded under (rest/chat.ts), so reading them is the record's rule, unchanged.
 */
export const payerCallerId = (payer: Hex): string => `x402:${payer.toLowerCase()}`;

const payerScheme = /^Payer\s+(.+)$/is;
const payerParam = /^\s*([a-z_]+)\s*=\s*(?:"([^"]*)"|([^\s,"]*))\s*$/i;

/**
 * The parameters of a `Payer` credential (RFC 9110 auth-params, quoted or not); undefined when
 * the header is not one. A credential that names a parameter twice, misses one or has a
 * malformed one is refused 401 `invalid_signature`, before any signature is checked.
 */
export function payerCredential(
  authorization: string | null | undefined,
): PayerCredential | undefined {
  if (authorization === null || authorization === undefined) return undefined;
  const match = payerScheme.exec(authorization);
  if (match === null) return undefined;
  const params = new Map<string, string>();
  for (const part of match[1]!.split(",")) {
    const param = payerParam.exec(part);
    const name = param?.[1]?.toLowerCase();
    if (param === null || name === undefined || params.has(name)) return malformedPayer();
    params.set(name, param[2] ?? param[3] ?? "");
  }
  const payer = params.get("payer");
  const deployment = params.get("deployment");
  const expiresAt = params.get("expires_at");
  const signature = params.get("signature");
  if (
    params.size !== 4 ||
    payer === undefined ||
    deployment === undefined ||
    signature === undefined ||
    expiresAt === undefined ||
    !/^\d{1,12}$/.test(expiresAt)
  )
    return malformedPayer();
  return { payer, deployment, expiresAt: Number(expiresAt), signature };
}

function malformedPayer(): never {
  throw new GatewayError(
    "invalid_signature",
    "a Payer credential is 'Payer payer=<address>, deployment=<id>, expires_at=<Unix seconds>, signature=<ReadPayerRequests signature>'",
  );
}

/** RPCs that take the settlement operator token as well as an API key. */
const operatorOrApiKey = new Set([
  `${ProviderService.typeName}/${ProviderService.method.getOfferEarnings.name}`,
]);

/**
 * RPCs that take a payer's `ReadPayerRequests` token as well as an API key: the record and
 * receipt of a request the payer paid with x402 (issue 37), which no API key made, and the list
 * and usage of those requests (issue 38).
 */
const payerOrApiKey = new Set([
  `${InferenceService.typeName}/${InferenceService.method.getRequest.name}`,
  `${InferenceService.typeName}/${InferenceService.method.getRequestReceipt.name}`,
  `${InferenceService.typeName}/${InferenceService.method.listRequests.name}`,
  `${InferenceService.typeName}/${InferenceService.method.getUsage.name}`,
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
 * {@link publicRpcs} (a payer's signed calls): the settlement and audit services the operator token,
 * everything else an API key; a few ({@link operatorOrApiKey}) take either.
 */
export function rpcAuthNeed(service: string, method: string): AuthNeed {
  if (service === GatewayService.typeName || publicRpcs.has(`${service}/${method}`)) return "none";
  if (service === SettlementService.typeName || service === AuditService.typeName)
    return "operator";
  if (payerOrApiKey.has(`${service}/${method}`)) return "apiKeyOrPayer";
  return operatorOrApiKey.has(`${service}/${method}`) ? "apiKeyOrOperator" : "apiKey";
}

/** The token of an `Authorization: Bearer <token>` header. */
export function bearer(header: string | null | undefined): string | undefined {
  if (header === null || header === undefined) return undefined;
  const match = /^Bearer\s+(\S+)\s*$/i.exec(header);
  return match?.[1];
}

/** The authority of a caller without a key (a payer paying or reading itself): no permit. */
export const noAuthority: SpendingAuthority = { allows: () => false, covering: () => [] };

/** Payer tokens whose checked signature is kept (the oldest is dropped first). */
const payerTokensKept = 1024;

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

  // Payer tokens checked lately, by credential text: a token is good until its expiresAt, and
  // its signature is checked once (recovery is milliseconds of CPU, a contract wallet's a call).
  const payers = new Map<string, { payer: Hex; expiresAt: number }>();
  const checkPayer = async (
    need: "apiKeyOrPayer",
    authorization: string,
    credential: PayerCredential,
  ): Promise<Authenticated> => {
    const reader = options.payerReader;
    if (reader === undefined) throw new GatewayError("invalid_api_key", "invalid API key");
    const known = payers.get(authorization);
    const now = Math.floor(Date.now() / 1000);
    let payer = known !== undefined && known.expiresAt > now ? known.payer : undefined;
    if (payer === undefined) {
      payer = await reader(credential);
      if (payers.size >= payerTokensKept) payers.delete(payers.keys().next().value!);
      payers.set(authorization, { payer, expiresAt: credential.expiresAt });
    }
    return {
      need,
      operator: false,
      caller: { apiKeyId: payerCallerId(payer), authority: noAuthority },
    };
  };

  /** Whether a payer token's signature was checked lately and holds (no recovery needed). */
  const knownPayer = (authorization: string): boolean =>
    (payers.get(authorization)?.expiresAt ?? 0) > Math.floor(Date.now() / 1000);

  return async (need, authorization, address) => {
    const credential = need === "apiKeyOrPayer" ? payerCredential(authorization) : undefined;
    // A payer token seen for the first time costs a signature's recovery (a contract wallet's,
    // a chain call) whether it holds or not, and anyone can sign one with a new key each time:
    // its check takes from the address's failure budget as a failed one does. A payer reading
    // its requests reuses its token until it expires, checked once.
    const fresh = credential !== undefined && !knownPayer(authorization!);
    const token = bearer(authorization);
    const attempt = (): Promise<Authenticated> =>
      credential === undefined
        ? check(need, token)
        : checkPayer("apiKeyOrPayer", authorization!, credential);
    if (address === undefined || budget === undefined) return attempt();
    const wait = budget.exhausted(address);
    if (wait !== undefined) {
      const mayPass =
        (credential !== undefined && !fresh) ||
        (token !== undefined &&
          (((need === "operator" || need === "apiKeyOrOperator") && isOperator(token)) ||
            (need !== "operator" && plausible(token))));
      if (!mayPass) {
        throw new GatewayError(
          "address_rate_limited",
          "too many failed authentications from this address; retry after the Retry-After delay",
          { retryAfterSeconds: wait },
        );
      }
    }
    try {
      const authenticated = await attempt();
      if (fresh) budget.failed(address);
      return authenticated;
    } catch (error) {
      if (error instanceof GatewayError && error.kind === "unauthenticated") budget.failed(address);
      throw error;
    }
  };
}

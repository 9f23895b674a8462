import { getAddress, type Address, type Hex, type LocalAccount } from "viem";
import {
  ChallengeMismatchError,
  checkFrame,
  checkTypedData,
  shown,
  takeIssuedAt,
  takeKeyId,
  takeNonce,
  when,
  type ConfirmSigning,
  type SigningChain,
} from "./signing-guard.js";
import { apiKeyIdOf } from "../domain/api-key-check.js";
import { normalizeHex } from "../domain/hex.js";
import { formatAmountExact, type TokenUnits } from "../domain/token-units.js";
import {
  anyPermit,
  buildAuthorizeKeyTypedData,
  buildRevokeTypedData,
  defaultAuthorizationLifetimeSeconds,
  signable,
} from "../domain/permit-authorization/index.js";
import { call, type GatewayConnection } from "./gateway-call.js";

/**
 * What a payer runs (with the key holder's API key) to let that key spend its permits: the key
 * asks the gateway for a challenge, the payer's key signs locally (it never leaves the
 * process), and the key posts the signature. The `permit` CLI, the dev sandbox and the benchmark
 * use it.
 *
 * What the payer signs is built here (src/clients/signing-guard.ts): the payer, the permit, the
 * expiry and the caps from the arguments, the domain from `chain` (this machine's chain and
 * market), the key id derived from the key itself (or pinned), the deployment from GET
 * /v1/gateway (checked against the pinned one when given, else shown); the challenge supplies
 * only its nonce and when it was issued (checked against this clock), and is compared with it
 * field by field before anything is signed.
 */

export interface AuthorizationJson {
  id: string;
  object: "permit_authorization";
  api_key_id: string;
  payer: string;
  permit_id: string;
  status: "active" | "expired" | "revoked";
  expires_at: number;
  issued_at: number;
  total_cap: string;
  per_request_cap: string;
  /** The periodic cap (issue 38): "day", "week", "month" or "" (none), and its use now. */
  period?: string;
  period_cap?: string;
  period_used?: string;
  period_renews_at?: number | null;
  /** The soft threshold (issue 38), "0" none; whether the use it is measured on reached it. */
  warn_at?: string;
  warn_reached?: boolean;
  created_at: number;
  revoked_at: number | null;
  revoked_by: "key" | "payer" | null;
}

/** The public facts of GET /v1/gateway a signature depends on. */
export interface GatewayFactsJson {
  chain_id: number;
  market: string;
  deployment: string;
  [key: string]: unknown;
}

/** A deployment id as GET /v1/gateway publishes it (`dep_` and 32 hex digits today). */
const deploymentPattern = /^[0-9A-Za-z_-]{1,128}$/;

/** The shape of a deployment id a user pins (`--deployment`, GATEWAY_DEPLOYMENT_ID). */
export function isDeploymentId(value: string): boolean {
  return deploymentPattern.test(value);
}

/**
 * The deployment the gateway at `gateway` says it is, checked against this machine's chain: a
 * gateway that serves another chain or market is refused before any challenge, and so is one
 * that names another deployment than `pinned` (the user's, when given).
 */
export async function gatewayDeployment(
  gateway: GatewayConnection,
  chain: SigningChain,
  pinned?: string,
): Promise<string> {
  const facts = await call<GatewayFactsJson>(gateway, "GET", "/v1/gateway");
  const source = "the gateway's GET /v1/gateway";
  if (facts?.chain_id !== chain.chainId)
    throw new ChallengeMismatchError(
      "chain_id",
      String(chain.chainId),
      shown(facts?.chain_id),
      source,
    );
  if (typeof facts.market !== "string" || facts.market.toLowerCase() !== chain.market.toLowerCase())
    throw new ChallengeMismatchError("market", chain.market, shown(facts.market), source);
  if (typeof facts.deployment !== "string" || !deploymentPattern.test(facts.deployment))
    throw new ChallengeMismatchError(
      "deployment",
      "a deployment id",
      shown(facts.deployment),
      source,
    );
  if (pinned !== undefined && facts.deployment !== pinned)
    throw new ChallengeMismatchError("deployment", pinned, shown(facts.deployment), source);
  return facts.deployment;
}

export interface AuthorizeOptions {
  /**
   * Signs for the payer: the payer's own key, or for a contract wallet a key its ERC-1271 check
   * accepts (then `payer` names the wallet).
   */
  readonly signer: LocalAccount;
  /** The chain and market the signature is for: this machine's, never the gateway's. */
  readonly chain: SigningChain;
  /** Default: the signer's address. */
  readonly payer?: Address;
  /** One permit; absent: every permit of the payer. */
  readonly permitId?: Hex;
  /** Unix seconds; absent: 30 days from now (this machine's clock). */
  readonly expiresAt?: number;
  /** Credits (the permit's smallest unit), a decimal string; absent or "0": no cap. */
  readonly totalCap?: string;
  readonly perRequestCap?: string;
  /** A periodic cap (issue 38): "day", "week" or "month" (UTC), with `periodCap` credits. */
  readonly period?: string;
  readonly periodCap?: string;
  /** The soft threshold (issue 38): credits of use from which answers carry a warning. */
  readonly warnAt?: string;
  /**
   * The permit's credit token units, as the payer's own chain states them: the summary before
   * signing shows the caps in tokens with the symbol, the exact base units (what is signed)
   * beside them. Absent: base units only.
   */
  readonly units?: TokenUnits;
  /**
   * The API key's public id as its holder knows it (`gateway keys create` prints it): the
   * challenge must name it. Absent: derived from the connection's key (`apiKeyIdOf`); a key
   * issued before ids were derived (issue 37) needs it given.
   */
  readonly keyId?: string;
  /**
   * The gateway deployment the user pinned (`--deployment`, GATEWAY_DEPLOYMENT_ID): GET
   * /v1/gateway and the challenge must name it. Absent: GET /v1/gateway's, shown.
   */
  readonly deployment?: string;
  /** Shown and asked before signing; absent: signs once every check passed. */
  readonly confirm?: ConfirmSigning;
  /** Unix seconds; default this machine's clock. */
  readonly clock?: () => number;
}

/**
 * Challenge (with the key being authorized) -> the payer's signature -> the authorization.
 * Refuses ({@link ChallengeMismatchError}) and signs nothing when the gateway's challenge is
 * not the typed data built here.
 */
export async function authorizeApiKey(
  gateway: GatewayConnection,
  options: AuthorizeOptions,
): Promise<AuthorizationJson> {
  const now = Math.floor((options.clock ?? (() => Date.now() / 1000))());
  const payer = getAddress(options.payer ?? options.signer.address);
  const permitId = options.permitId === undefined ? anyPermit : normalizeHex(options.permitId);
  const expiresAt = options.expiresAt ?? now + defaultAuthorizationLifetimeSeconds;
  const totalCap = options.totalCap ?? "0";
  const perRequestCap = options.perRequestCap ?? "0";
  const period = options.period ?? "";
  const periodCap = options.periodCap ?? "0";
  const warnAt = options.warnAt ?? "0";
  const keyId = localKeyId(gateway, options.keyId);
  const deployment = await gatewayDeployment(gateway, options.chain, options.deployment);
  const expected = (keyId: string, issuedAt: number, nonce: string) =>
    buildAuthorizeKeyTypedData({
      chainId: options.chain.chainId,
      market: options.chain.market,
      message: {
        payer,
        keyId,
        permitId,
        expiresAt,
        issuedAt,
        deployment,
        totalCap,
        perRequestCap,
        period,
        periodCap,
        warnAt,
        nonce,
      },
    });
  const challenge = await call<unknown>(gateway, "POST", "/v1/permit-authorizations/challenge", {
    payer,
    permitId,
    expiresAt,
    totalCap,
    perRequestCap,
    ...(period === "" ? {} : { period, periodCap }),
    ...(warnAt === "0" ? {} : { warnAt }),
  });
  checkFrame(expected("", 0, ""), challenge);
  takeKeyId(challenge, keyId);
  const typedData = expected(keyId, takeIssuedAt(challenge, now), takeNonce(challenge));
  checkTypedData(typedData, challenge);
  const keyIdSource = options.keyId === undefined ? "derived from the API key" : "--key-id";
  const units = options.units;
  const credits = (cap: string) =>
    cap === "0"
      ? "none"
      : units === undefined || units.decimals === undefined
        ? `${cap} credits (the permit's smallest unit)`
        : formatAmountExact(BigInt(cap), units);
  const { message } = typedData;
  await options.confirm?.({
    title: `about to sign AuthorizeKey as the payer ${payer} (chain ${options.chain.chainId}, market ${options.chain.market})`,
    lines: [
      ["payer", `${payer}${options.payer === undefined ? "" : " (--payer)"}`],
      ["API key", `${keyId} (${keyIdSource})`],
      ["permit", permitId === anyPermit ? `every permit of the payer (${anyPermit})` : permitId],
      ["expires", when(expiresAt, now)],
      ["total cap", credits(totalCap)],
      ["per request", credits(perRequestCap)],
      ["per period", period === "" ? "none" : `${credits(periodCap)} per UTC ${period}`],
      [
        "warn at",
        warnAt === "0"
          ? "none"
          : `${credits(warnAt)} of use ${period === "" ? "in all" : `per UTC ${period}`}`,
      ],
      [
        "deployment",
        `${deployment} (${options.deployment === undefined ? "GET /v1/gateway: not pinned" : "pinned"})`,
      ],
      ["issued", when(message.issuedAt, now)],
    ],
  });
  const signature = await options.signer.signTypedData(signable(typedData));
  const { authorization } = await call<{ authorization: AuthorizationJson }>(
    gateway,
    "POST",
    "/v1/permit-authorizations",
    {
      payer: message.payer,
      permitId: message.permitId,
      expiresAt: message.expiresAt,
      issuedAt: message.issuedAt,
      deployment: message.deployment,
      totalCap: message.totalCap,
      perRequestCap: message.perRequestCap,
      ...(message.period === "" ? {} : { period: message.period, periodCap: message.periodCap }),
      ...(message.warnAt === "0" ? {} : { warnAt: message.warnAt }),
      nonce: message.nonce,
      signature,
    },
  );
  return authorization;
}

/**
 * The payer's revocation of one authorization, without the key that holds it: `gateway` may
 * carry any API key (the payer's own). The `RevokeKeyAuthorization` typed data is built here
 * from the id and the payer; the gateway's challenge must be exactly it.
 */
export async function revokeAuthorizationAsPayer(
  gateway: GatewayConnection,
  options: {
    readonly id: string;
    readonly signer: LocalAccount;
    readonly chain: SigningChain;
    /** Default: the signer's address (a contract wallet: its address). */
    readonly payer?: Address;
    readonly confirm?: ConfirmSigning;
  },
): Promise<AuthorizationJson> {
  const path = `/v1/permit-authorizations/${encodeURIComponent(options.id)}`;
  const payer = getAddress(options.payer ?? options.signer.address);
  const typedData = buildRevokeTypedData({
    chainId: options.chain.chainId,
    market: options.chain.market,
    message: { payer, authorizationId: options.id },
  });
  const challenge = await call<unknown>(gateway, "POST", `${path}/revocation-challenge`);
  checkTypedData(typedData, challenge);
  await options.confirm?.({
    title: `about to sign RevokeKeyAuthorization as the payer ${payer} (chain ${options.chain.chainId}, market ${options.chain.market})`,
    lines: [
      ["payer", `${payer}${options.payer === undefined ? "" : " (--payer)"}`],
      ["revokes", options.id],
    ],
  });
  const signature = await options.signer.signTypedData(signable(typedData));
  const { authorization } = await call<{ authorization: AuthorizationJson }>(
    gateway,
    "POST",
    `${path}/revoke`,
    { signature },
  );
  return authorization;
}

/**
 * The id of the API key a signature is for, known without the gateway: the one the user pinned,
 * else derived from the connection's key ({@link apiKeyIdOf}).
 */
export function localKeyId(gateway: GatewayConnection, pinned: string | undefined): string {
  if (pinned !== undefined) return pinned;
  if (gateway.apiKey === undefined)
    throw new Error("the key id needs the API key (GATEWAY_API_KEY) or a pinned id");
  return apiKeyIdOf(gateway.apiKey);
}

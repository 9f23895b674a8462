import { getAddress, isAddress, zeroHash, type Address, type Hex, type LocalAccount } from "viem";
import { isHex32 } from "../domain/hex.js";
import {
  anyPermit,
  buildListAuthorizationsTypedData,
  buildRevokeAuthorizationsTypedData,
  signable,
} from "../domain/permit-authorization/index.js";
import { BaseError } from "../domain/base-error.js";
import { formatAmount, type TokenUnits } from "../domain/token-units.js";
import { apiKeyIdPattern } from "../clients/signing-guard.js";
import { gatewayUrlProblem } from "../clients/gateway-url.js";
import { gatewayDeployment, type AuthorizationJson } from "../clients/permit.js";
import { call, InsecureGatewayUrlError, type GatewayConnection } from "../clients/gateway-call.js";
import { SigningDeclinedError } from "../clients/signing-guard.js";
import { requirePinsWithoutConfirmation, type CommandOutput } from "./signing.js";

/**
 * `gateway permit authorizations` and `gateway permit revoke --key|--permit|--all`: a payer
 * sees and cuts what it signed, without any API key (issue 28, item 2; docs/decisions/authority-and-signing.md
 * "Spending authority"). The typed data is built here from the command's arguments and the
 * payer's own configuration (chain id from RPC_URL, checked against CHAIN_ID; market from
 * MARKET_ADDRESS); the gateway gives only its deployment id (GET /v1/gateway), shown before
 * anything is signed, and a gateway that says it serves another chain or market gets nothing.
 * The signature is the only credential these calls carry.
 */

/** A usage problem (exit 2). */
export class PayerControlUsageError extends BaseError {
  override readonly name = "PayerControlUsageError";
  readonly reason = "usage";
}

type Output = CommandOutput;

/** The payer's chain as its own configuration says (never as the gateway says). */
export interface PayerChainFacts {
  readonly chainId: number;
  readonly market: Address;
}

/** GATEWAY_URL, checked as every client tool checks it (src/clients/gateway-url.ts). */
function payerGateway(env: NodeJS.ProcessEnv): GatewayConnection {
  const raw = env.GATEWAY_URL?.trim();
  if (raw === undefined || raw === "")
    throw new PayerControlUsageError("set GATEWAY_URL (or --gateway)");
  const problem = gatewayUrlProblem(raw);
  if (problem !== undefined) throw new InsecureGatewayUrlError(problem);
  // No API key: the payer's signature is these calls' only credential.
  return { baseUrl: raw };
}

function payerOf(signer: LocalAccount, payer: string | undefined): Address {
  if (payer === undefined) return signer.address;
  if (!isAddress(payer, { strict: false }))
    throw new PayerControlUsageError("--payer must be an address (0x + 40 hex digits)");
  return getAddress(payer);
}

function when(seconds: number): string {
  return new Date(seconds * 1000).toISOString().replace(".000Z", "Z");
}

/**
 * One authorization, one line, its amounts in the permit's token units with the symbol when the
 * chain stated them (`units`), else in base units.
 */
function describe(
  a: AuthorizationJson & { credits_used?: string; last_used_at?: number | null },
  units: TokenUnits | undefined,
) {
  const amount = (value: string | undefined) =>
    value === undefined || units === undefined || units.decimals === undefined
      ? (value ?? "?")
      : formatAmount(BigInt(value), units);
  const permit = a.permit_id === zeroHash ? "every permit" : `permit ${a.permit_id}`;
  const periodic =
    a.period === undefined || a.period === ""
      ? ""
      : `, ${amount(a.period_cap)} per ${a.period} (used ${amount(a.period_used ?? "0")}` +
        `${a.period_renews_at ? `, renews ${when(a.period_renews_at)}` : ""})`;
  const warn =
    a.warn_at === undefined || a.warn_at === "0"
      ? ""
      : `, warn at ${amount(a.warn_at)}${a.warn_reached === true ? " (reached)" : ""}`;
  const cap = (value: string) => (value === "0" ? "none" : amount(value));
  const caps =
    a.total_cap === "0" && a.per_request_cap === "0" && periodic === ""
      ? "no cap"
      : `cap ${cap(a.total_cap)} total, ${cap(a.per_request_cap)} per request${periodic}${warn}`;
  const used =
    a.credits_used === undefined
      ? ""
      : `  used ${amount(a.credits_used)}${a.last_used_at ? ` (last ${when(a.last_used_at)})` : ""}`;
  const revoked =
    a.revoked_at === null ? "" : `  revoked ${when(a.revoked_at)} by the ${a.revoked_by ?? "?"}`;
  return (
    `${a.id}  ${a.status.padEnd(7)}  key ${a.api_key_id}  ${permit}  ` +
    `issued ${when(a.issued_at)}  expires ${when(a.expires_at)}  ${caps}${used}${revoked}`
  );
}

/**
 * The token units of each permit the authorizations name (none for "every permit"), read once
 * each; a permit whose units cannot be read shows base units.
 */
async function unitsOf(
  all: readonly AuthorizationJson[],
  read: ((permitId: Hex) => Promise<TokenUnits | undefined>) | undefined,
): Promise<Map<string, TokenUnits | undefined>> {
  const out = new Map<string, TokenUnits | undefined>();
  if (read === undefined) return out;
  const ids = [...new Set(all.map((a) => a.permit_id).filter((id) => id !== zeroHash))];
  await Promise.all(
    ids.map(async (id) => out.set(id, await read(id as Hex).catch(() => undefined))),
  );
  return out;
}

/** How long the read token this command signs lasts (the gateway takes at most 10 minutes). */
const listTokenSeconds = 300;
/** Pages asked at most (100 authorizations each). */
const maxPages = 100;

/** What the payer's control commands (`authorizations`, `revoke`) are given. */
interface PayerCommand {
  readonly signer: LocalAccount;
  readonly payer?: string;
  readonly json: boolean;
  readonly env: NodeJS.ProcessEnv;
  readonly chain: () => Promise<PayerChainFacts>;
  /** A permit's credit token units, as the chain states them (amounts shown in tokens). */
  readonly units?: (permitId: Hex) => Promise<TokenUnits | undefined>;
  readonly now?: () => number;
  /** The deployment the payer pinned (`--deployment`, GATEWAY_DEPLOYMENT_ID). */
  readonly deployment?: string;
  /** `--yes`: do not ask, even at a terminal (then the deployment must be pinned). */
  readonly yes?: boolean;
}

/**
 * What a payer's control command signs against: the gateway, the payer, its chain and the
 * gateway's deployment there, and the payer's clock (Unix seconds).
 */
async function payerSession(args: PayerCommand, out: Output, command: string) {
  const gateway = payerGateway(args.env);
  const payer = payerOf(args.signer, args.payer);
  requirePinsWithoutConfirmation(out, args.yes === true, args.deployment, command);
  const chain = await args.chain();
  const deployment = await gatewayDeployment(gateway, chain, args.deployment);
  const now = Math.floor((args.now ?? Date.now)() / 1000);
  return { gateway, payer, chain, deployment, now };
}

/** `gateway permit authorizations [--payer ADDRESS] [--json]`. */
export async function listAuthorizationsAsPayer(args: PayerCommand, out: Output): Promise<void> {
  const { gateway, payer, chain, deployment, now } = await payerSession(
    args,
    out,
    "authorizations",
  );
  const expiresAt = now + listTokenSeconds;
  await shownAndConfirmed(
    args,
    out,
    `signing ListAuthorizations as payer ${payer}: gateway deployment ${deployment}${pinNote(args)}, chain ${chain.chainId}, market ${chain.market}, valid until ${when(expiresAt)}`,
  );
  const typed = buildListAuthorizationsTypedData({
    chainId: chain.chainId,
    market: chain.market,
    message: { payer, deployment, expiresAt },
  });
  const signature = await args.signer.signTypedData(signable(typed));
  const all: AuthorizationJson[] = [];
  let startingAfter: string | undefined;
  for (let page = 0; page < maxPages; page++) {
    const value = await call<{ data: AuthorizationJson[]; has_more: boolean }>(
      gateway,
      "POST",
      `/v1/payers/${payer}/authorizations`,
      {
        deployment,
        expiresAt,
        signature,
        limit: 100,
        ...(startingAfter === undefined ? {} : { startingAfter }),
      },
    );
    all.push(...value.data);
    if (!value.has_more || value.data.length === 0) break;
    startingAfter = value.data[value.data.length - 1]!.id;
  }
  if (args.json) {
    out.log(JSON.stringify({ payer, deployment, authorizations: all }, null, 2));
    return;
  }
  if (all.length === 0) {
    out.log("no authorizations");
    return;
  }
  const active = all.filter((a) => a.status === "active").length;
  out.log(`${all.length} authorizations (${active} active), newest first:`);
  const units = await unitsOf(all, args.units);
  for (const a of all) out.log(describe(a, units.get(a.permit_id)));
}

/** `gateway permit revoke --key KEY_ID [--permit ID]`, `--permit ID`, `--all`. */
export async function revokeAuthorizationsAsPayer(
  args: PayerCommand & {
    readonly keyId?: string;
    readonly permitId?: string;
    readonly all: boolean;
  },
  out: Output,
): Promise<void> {
  if (args.all && (args.keyId !== undefined || args.permitId !== undefined))
    throw new PayerControlUsageError("--all revokes everything: give it without --key or --permit");
  if (!args.all && args.keyId === undefined && args.permitId === undefined)
    throw new PayerControlUsageError(
      "revoke needs an authorization id, or --key KEY_ID, --permit ID or --all",
    );
  if (args.keyId !== undefined && !apiKeyIdPattern.test(args.keyId))
    throw new PayerControlUsageError("--key must be an API key id (key_...)");
  if (args.permitId !== undefined && (!isHex32(args.permitId) || /^0x0{64}$/.test(args.permitId)))
    throw new PayerControlUsageError("--permit must be a permit id (0x + 64 hex digits, not zero)");
  // The payer's clock; the gateway revokes up to the later of it and its own (and says so).
  const {
    gateway,
    payer,
    chain,
    deployment,
    now: before,
  } = await payerSession(args, out, "revoke");
  const keyId = args.keyId ?? "";
  const permitId = (args.permitId?.toLowerCase() as Hex | undefined) ?? anyPermit;
  const scope = args.all
    ? "every authorization, and every AuthorizeKey signed but not yet submitted"
    : [
        keyId === "" ? "" : `of API key ${keyId}`,
        permitId === anyPermit ? "" : `naming permit ${permitId}`,
      ]
        .filter((s) => s !== "")
        .join(" ");
  await shownAndConfirmed(
    args,
    out,
    `signing RevokeAuthorizations as payer ${payer}: ${scope} issued at or before ${when(before)}; gateway deployment ${deployment}${pinNote(args)}, chain ${chain.chainId}, market ${chain.market}`,
  );
  const typed = buildRevokeAuthorizationsTypedData({
    chainId: chain.chainId,
    market: chain.market,
    message: { payer, deployment, keyId, permitId, before },
  });
  const signature = await args.signer.signTypedData(signable(typed));
  const value = await call<{
    revoked: number;
    authorizations: AuthorizationJson[];
    epoch: number | null;
    revoked_before?: number;
    warning?: string | null;
  }>(gateway, "POST", `/v1/payers/${payer}/authorizations/revoke`, {
    deployment,
    ...(keyId === "" ? {} : { keyId }),
    ...(permitId === anyPermit ? {} : { permitId }),
    before,
    signature,
  });
  if (args.json) {
    out.log(JSON.stringify({ payer, deployment, before, ...value }, null, 2));
    return;
  }
  if (typeof value.warning === "string") out.error(`warning: ${value.warning}`);
  out.log(`revoked ${value.revoked} authorization${value.revoked === 1 ? "" : "s"}`);
  const units = await unitsOf(value.authorizations, args.units);
  for (const a of value.authorizations) out.log(describe(a, units.get(a.permit_id)));
  if (value.revoked > value.authorizations.length)
    out.log(`(and ${value.revoked - value.authorizations.length} more)`);
  if (value.epoch !== null)
    out.log(
      `every AuthorizeKey of ${payer} issued at or before ${when(value.epoch)} is refused from now on`,
    );
}

function pinNote(args: PayerCommand): string {
  return args.deployment === undefined ? " (GET /v1/gateway: not pinned)" : " (pinned)";
}

/**
 * Shows what is signed (stdout; with `--json`, stderr and only before a question) and, when the
 * deployment was not pinned (then someone is at a terminal: {@link
 * requirePinsWithoutConfirmation}), asks first.
 */
async function shownAndConfirmed(args: PayerCommand, out: Output, line: string): Promise<void> {
  const ask = args.deployment === undefined && args.yes !== true ? out.ask : undefined;
  if (!args.json) out.log(line);
  else if (ask !== undefined) out.error(line);
  if (ask !== undefined && !(await ask("sign it? [y/N] "))) throw new SigningDeclinedError();
}

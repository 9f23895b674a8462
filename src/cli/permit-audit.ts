import {
  createPublicClient,
  getAddress,
  http,
  isAddress,
  recoverTypedDataAddress,
  zeroAddress,
  type Address,
  type Hex,
} from "viem";
import { marketAbi } from "../../gen/contracts/artifacts.js";
import { registrationDomainName, registrationDomainVersion } from "../domain/registration.js";
import { signableReceipt } from "../domain/receipts.js";
import { BaseError } from "../errors.js";
import { call, type GatewayConnection } from "../provider/client.js";

/**
 * `gateway permit audit PERMIT_ID`: a payer holds the gateway to its signed usage receipts. It
 * lists the permit's receipts (GET /v1/permits/{id}/receipts, with a key the payer authorized),
 * checks each signature against the receipt signer the gateway publishes (GET /v1/gateway), sums
 * the charges of the settled ones and compares the sum with what the chain says was settled from
 * the permit. Equal, and every receipt sound: exit 0. Otherwise a line names the difference and
 * every receipt that failed, exit 1.
 */

/** A receipt as the receipts list answers it (what the audit reads of it). */
export interface ListedReceipt {
  readonly receipt: {
    readonly types: Record<string, readonly { name: string; type: string }[]>;
    readonly primaryType: string;
    readonly domain: {
      readonly name: string;
      readonly version: string;
      readonly chainId: number;
      readonly verifyingContract: string;
    };
    readonly message: Record<string, unknown>;
  };
  readonly signature: string;
  readonly signer: string;
  readonly settlement: { readonly status: string; readonly batch_id: string | null };
}

export interface AuditFinding {
  readonly requestId: string;
  readonly reason: string;
}

export interface AuditReport {
  readonly permitId: Hex;
  readonly chainId: number;
  readonly market: Address;
  /** The receipt signer the gateway publishes. */
  readonly signer: Address;
  readonly receipts: number;
  readonly settledReceipts: number;
  /** Sum of the charges of the settled receipts that verified. */
  readonly settledCharges: bigint;
  /** What the chain settled from the permit. */
  readonly chainSettled: bigint;
  /** `chainSettled - settledCharges`: positive when the chain settled more than the receipts. */
  readonly difference: bigint;
  /** Receipts that prove nothing: a signature that fails, another permit, chain or market. */
  readonly invalid: readonly AuditFinding[];
  readonly ok: boolean;
}

/**
 * The audit's judgement, from what was fetched: each receipt must be signed by `signer`, in the
 * gateway's domain on `chainId` and `market`, for `permitId`, and appear once; the charges of
 * the settled ones that pass must add up to `chainSettled`.
 */
export async function judgeReceipts(args: {
  readonly permitId: Hex;
  readonly chainId: number;
  readonly market: Address;
  readonly signer: Address;
  readonly receipts: readonly ListedReceipt[];
  readonly chainSettled: bigint;
}): Promise<AuditReport> {
  const invalid: AuditFinding[] = [];
  const seen = new Set<string>();
  let settledReceipts = 0;
  let settledCharges = 0n;
  for (const listed of args.receipts) {
    const { receipt } = listed;
    const requestId = String(receipt.message.requestId ?? "?");
    const problem = await receiptProblem(listed, args, seen);
    if (problem !== undefined) {
      invalid.push({ requestId, reason: problem });
      continue;
    }
    seen.add(requestId);
    if (listed.settlement.status !== "settled") continue;
    settledReceipts += 1;
    settledCharges += BigInt(receipt.message.charge as string);
  }
  const difference = args.chainSettled - settledCharges;
  return {
    permitId: args.permitId,
    chainId: args.chainId,
    market: args.market,
    signer: args.signer,
    receipts: args.receipts.length,
    settledReceipts,
    settledCharges,
    chainSettled: args.chainSettled,
    difference,
    invalid,
    ok: difference === 0n && invalid.length === 0,
  };
}

async function receiptProblem(
  listed: ListedReceipt,
  args: { permitId: Hex; chainId: number; market: Address; signer: Address },
  seen: ReadonlySet<string>,
): Promise<string | undefined> {
  const { receipt } = listed;
  const { domain, message } = receipt;
  if (receipt.primaryType !== "UsageReceipt") return "not a UsageReceipt";
  if (
    domain.name !== registrationDomainName ||
    domain.version !== registrationDomainVersion ||
    domain.chainId !== args.chainId ||
    !isAddress(domain.verifyingContract, { strict: false }) ||
    getAddress(domain.verifyingContract) !== getAddress(args.market)
  ) {
    return `signed for another domain (chain ${domain.chainId}, market ${domain.verifyingContract})`;
  }
  if (String(message.permitId).toLowerCase() !== args.permitId.toLowerCase())
    return `a receipt of permit ${String(message.permitId)}`;
  if (seen.has(String(message.requestId))) return "listed twice";
  let recovered: Address;
  try {
    recovered = await recoverTypedDataAddress({
      ...signableReceipt({ domain: { ...domain, verifyingContract: args.market }, message }),
      signature: listed.signature as Hex,
    });
  } catch {
    return "signature or message malformed";
  }
  if (recovered !== getAddress(args.signer))
    return `signature does not verify against the receipt signer ${args.signer}`;
  return undefined;
}

class AuditUsageError extends BaseError {
  override readonly name = "AuditUsageError";
  readonly reason = "usage";
}

/** Whether an error is the audit's usage error (exit 2). */
export function isAuditUsageError(error: unknown): boolean {
  return error instanceof AuditUsageError;
}

interface GatewayJson {
  chain_id: number;
  market: string;
  receipt_signer: string | null;
}

interface ReceiptPage {
  data: ListedReceipt[];
  has_more: boolean;
}

/** Every receipt of the permit, page by page. */
async function fetchReceipts(gateway: GatewayConnection, permitId: Hex): Promise<ListedReceipt[]> {
  const all: ListedReceipt[] = [];
  let after: string | undefined;
  for (;;) {
    const query = `limit=100${after === undefined ? "" : `&starting_after=${after}`}`;
    const page = await call<ReceiptPage>(
      gateway,
      "GET",
      `/v1/permits/${permitId}/receipts?${query}`,
    );
    all.push(...page.data);
    const last = page.data.at(-1)?.receipt.message.requestId;
    if (!page.has_more || typeof last !== "string") return all;
    after = last;
  }
}

/**
 * Runs the audit against the gateway and the chain (RPC_URL, MARKET_ADDRESS in `env`); prints
 * the verdict (or the report as JSON with `json`) and returns the exit code: 0 the receipts
 * account for what settled, 1 they do not (or a receipt failed). Throws on a usage error and
 * when the gateway refuses (the caller reports both).
 */
export async function runPermitAudit(
  permitId: Hex,
  options: { readonly json: boolean },
  gateway: GatewayConnection,
  env: NodeJS.ProcessEnv,
  out: { log(line: string): void; error(line: string): void },
): Promise<number> {
  const rpcUrl = env.RPC_URL;
  const market = env.MARKET_ADDRESS;
  if (rpcUrl === undefined || rpcUrl === "" || !/^https?:\/\//.test(rpcUrl))
    throw new AuditUsageError("set RPC_URL (http or https) to read the permit from the chain");
  if (market === undefined || !isAddress(market, { strict: false }))
    throw new AuditUsageError("set MARKET_ADDRESS to the market contract (0x + 40 hex digits)");

  const facts = await call<GatewayJson>(gateway, "GET", "/v1/gateway");
  if (facts.receipt_signer === null) {
    out.error("the gateway signs no receipts (it publishes no receipt_signer): nothing to audit");
    return 1;
  }
  if (getAddress(facts.market) !== getAddress(market)) {
    out.error(`the gateway serves market ${facts.market}, not MARKET_ADDRESS ${market}`);
    return 1;
  }
  const client = createPublicClient({ transport: http(rpcUrl, { retryCount: 1 }) });
  const chainId = await client.getChainId();
  if (chainId !== facts.chain_id) {
    out.error(`RPC_URL is chain ${chainId}; the gateway serves chain ${facts.chain_id}`);
    return 1;
  }
  const receipts = await fetchReceipts(gateway, permitId);
  const permit = await client.readContract({
    address: getAddress(market),
    abi: marketAbi,
    functionName: "getPermit",
    args: [permitId],
  });
  if (permit.payer === zeroAddress) {
    out.error(`permit ${permitId} does not exist on chain ${chainId} at ${market}`);
    return 1;
  }
  const report = await judgeReceipts({
    permitId,
    chainId,
    market: getAddress(market),
    signer: getAddress(facts.receipt_signer),
    receipts,
    chainSettled: permit.settled,
  });
  if (options.json) out.log(JSON.stringify(reportJson(report), null, 2));
  else for (const line of verdict(report)) (report.ok ? out.log : out.error)(line);
  return report.ok ? 0 : 1;
}

/** The report as JSON (amounts as decimal strings). */
export function reportJson(report: AuditReport) {
  return {
    permit_id: report.permitId,
    chain_id: report.chainId,
    market: report.market,
    receipt_signer: report.signer,
    receipts: report.receipts,
    settled_receipts: report.settledReceipts,
    settled_charges: report.settledCharges.toString(),
    chain_settled: report.chainSettled.toString(),
    difference: report.difference.toString(),
    invalid: report.invalid.map((f) => ({ request_id: f.requestId, reason: f.reason })),
    ok: report.ok,
  };
}

/** The verdict in lines a payer reads. */
export function verdict(report: AuditReport): string[] {
  const counts = `${report.receipts} receipts (${report.settledReceipts} settled) signed by ${report.signer}`;
  if (report.ok) {
    return [
      `permit ${report.permitId}: audit passed: ${counts}; settled receipts ${report.settledCharges} = settled on chain ${report.chainSettled}`,
    ];
  }
  const lines: string[] = [];
  if (report.difference !== 0n) {
    const more =
      report.difference > 0n
        ? `the chain settled ${report.difference} more than the receipts`
        : `the receipts claim ${-report.difference} more than the chain settled`;
    lines.push(
      `permit ${report.permitId}: audit FAILED: settled receipts sum to ${report.settledCharges}, the chain settled ${report.chainSettled}: difference ${report.difference} (${more})`,
    );
  } else {
    lines.push(
      `permit ${report.permitId}: audit FAILED: ${report.invalid.length} receipts do not verify (settled receipts ${report.settledCharges} = settled on chain ${report.chainSettled})`,
    );
  }
  for (const finding of report.invalid)
    lines.push(`receipt ${finding.requestId}: ${finding.reason}`);
  lines.push(counts);
  return lines;
}

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
import { registrationDomainName } from "../domain/registration/index.js";
import {
  receiptDomainVersion,
  signableReceipt,
  type SignableUsageFigures,
} from "../domain/receipts.js";
import { BaseError } from "../domain/base-error.js";
import { call, type GatewayConnection } from "../clients/gateway-call.js";

/**
 * `gateway permit audit PERMIT_ID`: a payer holds the gateway to its signed usage receipts. It
 * lists the permit's receipts (GET /v1/permits/{id}/receipts, with a key the payer authorized),
 * checks each signature against the receipt signer the gateway publishes (GET /v1/gateway), sums
 * the charges of the settled ones and compares the sum with what the chain says was settled from
 * the permit. Equal, and every receipt sound: exit 0. Otherwise a line names the difference and
 * every receipt that failed, exit 1. Either way it shows, per receipt, the usage charged and the
 * two figures it was judged from: the provider's claim and the gateway's count (DESIGN.md
 * section 10).
 */

/** The domain versions of receipts the audit verifies: the current one and issue 22's "3". */
const auditedVersions: readonly string[] = [receiptDomainVersion, "3"];

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

/** Token figures as a receipt signs them. */
export interface AuditFigures {
  readonly inputTokens: bigint;
  readonly outputTokens: bigint;
  readonly cachedTokens: bigint;
  readonly reasoningTokens: bigint;
}

/** A receipt that verified: what it charged, and the claim and count it says it was judged from. */
export interface AuditedRequest {
  readonly requestId: string;
  readonly settled: boolean;
  readonly charge: bigint;
  readonly charged: AuditFigures;
  /** Whose figures were charged (`provider` or `gateway`); null on a version "3" receipt. */
  readonly usageSource: string | null;
  /** The provider's claim; null when it reported none, or on a version "3" receipt. */
  readonly claimed: AuditFigures | null;
  /** The gateway's count; null when nothing was counted, or on a version "3" receipt. */
  readonly counted: AuditFigures | null;
  /** The receipt's domain version ("3": signed before claim and count were kept). */
  readonly version: string;
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
  /** Every receipt that verified, in the gateway's order (oldest close first). */
  readonly requests: readonly AuditedRequest[];
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
  const requests: AuditedRequest[] = [];
  const seen = new Set<string>();
  let settledReceipts = 0;
  let settledCharges = 0n;
  for (const listed of args.receipts) {
    const { receipt } = listed;
    const requestId = String(receipt.message.requestId ?? "?");
    const checked = await checkReceipt(listed, args, seen);
    if (typeof checked === "string") {
      invalid.push({ requestId, reason: checked });
      continue;
    }
    seen.add(requestId);
    const settled = listed.settlement.status === "settled";
    requests.push(auditedRequest(requestId, settled, receipt.domain.version, checked));
    if (!settled) continue;
    settledReceipts += 1;
    settledCharges += checked.charge;
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
    requests,
    ok: difference === 0n && invalid.length === 0,
  };
}

type VerifiedMessage = ReturnType<typeof signableReceipt>["message"];

function auditedRequest(
  requestId: string,
  settled: boolean,
  version: string,
  m: VerifiedMessage,
): AuditedRequest {
  const figures = (f: SignableUsageFigures | undefined): AuditFigures | null =>
    f === undefined || !f.present
      ? null
      : {
          inputTokens: f.inputTokens,
          outputTokens: f.outputTokens,
          cachedTokens: f.cachedTokens,
          reasoningTokens: f.reasoningTokens,
        };
  return {
    requestId,
    settled,
    charge: m.charge,
    charged: {
      inputTokens: m.inputTokens,
      outputTokens: m.outputTokens,
      cachedTokens: m.cachedTokens,
      reasoningTokens: m.reasoningTokens,
    },
    usageSource: m.usageSource ?? null,
    claimed: figures(m.claimed),
    counted: figures(m.counted),
    version,
  };
}

/** The receipt's verified message, or what is wrong with it. */
async function checkReceipt(
  listed: ListedReceipt,
  args: { permitId: Hex; chainId: number; market: Address; signer: Address },
  seen: ReadonlySet<string>,
): Promise<VerifiedMessage | string> {
  const { receipt } = listed;
  const { domain, message } = receipt;
  if (receipt.primaryType !== "UsageReceipt") return "not a UsageReceipt";
  if (
    domain.name !== registrationDomainName ||
    !auditedVersions.includes(domain.version) ||
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
  let signable: ReturnType<typeof signableReceipt>;
  try {
    signable = signableReceipt({ domain: { ...domain, verifyingContract: args.market }, message });
    recovered = await recoverTypedDataAddress({
      ...signable,
      signature: listed.signature as Hex,
    });
  } catch {
    return "signature or message malformed";
  }
  if (recovered !== getAddress(args.signer))
    return `signature does not verify against the receipt signer ${args.signer}`;
  return signable.message;
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
    requests: report.requests.map((r) => ({
      request_id: r.requestId,
      settled: r.settled,
      charge: r.charge.toString(),
      charged: figuresJson(r.charged),
      usage_source: r.usageSource,
      claimed: r.claimed === null ? null : figuresJson(r.claimed),
      counted: r.counted === null ? null : figuresJson(r.counted),
      receipt_version: r.version,
    })),
    ok: report.ok,
  };
}

function figuresJson(f: AuditFigures) {
  return {
    input_tokens: f.inputTokens.toString(),
    output_tokens: f.outputTokens.toString(),
    cached_tokens: f.cachedTokens.toString(),
    reasoning_tokens: f.reasoningTokens.toString(),
  };
}

const inOut = (f: AuditFigures): string => `${f.inputTokens} in, ${f.outputTokens} out`;

/**
 * One line per verified receipt: what it charged and from whose figures, the provider's claim
 * and the gateway's count.
 */
export function requestLines(report: AuditReport): string[] {
  return report.requests.map((r) => {
    if (r.usageSource === null)
      return `receipt ${r.requestId}: charged ${r.charge} for ${inOut(r.charged)} (a version ${r.version} receipt: claim and count not signed)`;
    const source = r.usageSource === "provider" ? "the provider's claim" : "the gateway's count";
    const claimed = r.claimed === null ? "no claim" : `claimed ${inOut(r.claimed)}`;
    const counted = r.counted === null ? "nothing counted" : `counted ${inOut(r.counted)}`;
    return `receipt ${r.requestId}: charged ${r.charge} for ${inOut(r.charged)} (${source}); ${claimed}; ${counted}`;
  });
}

/** The verdict in lines a payer reads. */
export function verdict(report: AuditReport): string[] {
  const counts = `${report.receipts} receipts (${report.settledReceipts} settled) signed by ${report.signer}`;
  if (report.ok) {
    return [
      `permit ${report.permitId}: audit passed: ${counts}; settled receipts ${report.settledCharges} = settled on chain ${report.chainSettled}`,
      ...requestLines(report),
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
  lines.push(counts, ...requestLines(report));
  return lines;
}

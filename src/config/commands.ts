import { isAddress, type Address } from "viem";
import { gatewayUrlProblem } from "../clients/gateway-url.js";
import { readDeploymentId } from "./gateway.js";
import { ConfigError, logLevels, type Env, type LogLevel } from "./read.js";

/**
 * The configurations of the commands that do not run the gateway: `gateway dev` and the
 * management commands, `gateway settle`, a payer's and a signer's chain, and the gateway a CLI
 * command calls.
 */

/**
 * What `gateway dev` (the embedded sandbox) and the management commands (`migrate`, `keys`) read:
 * they run without a chain or a market, so not through {@link parseConfig}.
 */
export interface LocalConfig {
  readonly logLevel: LogLevel;
  /** `gateway dev`'s port (PORT, default 8080; 0: any free port). */
  readonly port: number;
  readonly stateDir: string;
  /** DATABASE_URL; absent: the embedded database under the state dir. */
  readonly databaseUrl: string | undefined;
  /** DATABASE_DIRECT_URL: PostgreSQL itself when DATABASE_URL is a pooler (PgBouncer). */
  readonly databaseDirectUrl: string | undefined;
  /** GATEWAY_DEPLOYMENT_ID (`gateway deployment adopt` writes it into the database). */
  readonly deploymentId: string | undefined;
}

export function parseLocalConfig(env: Env): LocalConfig {
  const problems: string[] = [];
  const str = (key: string) => env[key]?.trim() || undefined;
  const logLevel = (str("LOG_LEVEL") ?? "info") as LogLevel;
  if (!logLevels.includes(logLevel))
    problems.push(`LOG_LEVEL must be one of ${logLevels.join(", ")}`);
  const rawPort = str("PORT");
  const port = rawPort === undefined ? 8080 : Number(rawPort);
  if (!/^\d+$/.test(rawPort ?? "0") || port > 65535) problems.push("PORT must be 0-65535");
  const deploymentId = readDeploymentId({ str, problems });
  if (problems.length > 0) throw new ConfigError(problems);
  return {
    logLevel,
    port,
    stateDir: str("GATEWAY_STATE_DIR") ?? ".gateway",
    databaseUrl: str("DATABASE_URL"),
    databaseDirectUrl: str("DATABASE_DIRECT_URL"),
    deploymentId,
  };
}

/** What `gateway settle` reads: the gateway to call, the operator token, the worker's pace. */
export interface SettleConfig {
  /** GATEWAY_URL's origin (default http://127.0.0.1:8080). */
  readonly url: string;
  readonly token: string;
  /** The worker's pause between flushes (SETTLE_INTERVAL_MS, default 10 s). */
  readonly intervalMs: number;
  /** Requests per flush (SETTLE_MAX_REQUESTS; absent: the gateway's default). */
  readonly maxRequests: number | undefined;
  readonly logLevel: LogLevel;
}

const uint32Max = 0xffffffff;

export function parseSettleConfig(env: Env): SettleConfig {
  const problems: string[] = [];
  const str = (key: string) => env[key]?.trim() || undefined;
  const positive = (key: string, max: number): number | undefined => {
    const raw = str(key);
    if (raw === undefined) return undefined;
    const n = Number(raw);
    if (!/^\d+$/.test(raw) || !Number.isSafeInteger(n) || n < 1 || n > max) {
      problems.push(`${key} must be an integer from 1 to ${max}`);
      return undefined;
    }
    return n;
  };
  let url = "";
  try {
    const parsed = new URL(str("GATEWAY_URL") ?? "http://127.0.0.1:8080");
    if (parsed.protocol !== "http:" && parsed.protocol !== "https:") throw new Error();
    // The origin only: a URL's user info or path is no place for gRPC.
    url = parsed.origin;
  } catch {
    problems.push("GATEWAY_URL must be an http:// or https:// URL");
  }
  const token = str("SETTLEMENT_OPERATOR_TOKEN");
  if (token === undefined) problems.push("SETTLEMENT_OPERATOR_TOKEN is required");
  const intervalMs = positive("SETTLE_INTERVAL_MS", 86_400_000) ?? 10_000;
  const maxRequests = positive("SETTLE_MAX_REQUESTS", uint32Max);
  const logLevel = (str("LOG_LEVEL") ?? "info") as LogLevel;
  if (!logLevels.includes(logLevel))
    problems.push(`LOG_LEVEL must be one of ${logLevels.join(", ")}`);
  if (problems.length > 0) throw new ConfigError(problems);
  return { url, token: token ?? "", intervalMs, maxRequests, logLevel };
}

/**
 * What a payer's `gateway permit open|close|finalize|balance` reads to reach the market itself
 * (the gateway is not needed to move the payer's money): RPC_URL, MARKET_ADDRESS, and CHAIN_ID,
 * which, when set, the RPC must report (a payer signing for the wrong chain is refused before
 * anything is sent).
 */
export interface PayerChainConfig {
  readonly rpcUrl: string;
  /** CHAIN_ID; absent: the chain id RPC_URL reports. */
  readonly chainId: number | undefined;
  readonly marketAddress: Address;
}

export function parsePayerChainConfig(env: Env): PayerChainConfig {
  const problems: string[] = [];
  const str = (key: string) => env[key]?.trim() || undefined;
  const rpcUrl = str("RPC_URL");
  if (rpcUrl === undefined)
    problems.push("RPC_URL is required (the JSON-RPC URL of the chain the market lives on)");
  else if (!/^https?:\/\//.test(rpcUrl)) problems.push("RPC_URL must be an http(s):// URL");
  const rawChainId = str("CHAIN_ID");
  const chainId = optionalChainId(rawChainId, problems);
  const market = str("MARKET_ADDRESS");
  if (market === undefined) problems.push("MARKET_ADDRESS is required (the market's address)");
  else if (!isAddress(market, { strict: false }))
    problems.push(`MARKET_ADDRESS must be a 0x-prefixed 20-byte address, got "${market}"`);
  if (problems.length > 0) throw new ConfigError(problems);
  return {
    rpcUrl: rpcUrl!,
    chainId,
    marketAddress: market!.toLowerCase() as Address,
  };
}

/**
 * The chain a wallet command signs for (issue 28, item 1): the market's address and the chain
 * id, from this machine's configuration, never from the gateway. The chain id is the RPC's
 * (`eth_chainId`, checked against CHAIN_ID when both are set), or CHAIN_ID alone without an RPC.
 */
export interface SigningChainConfig {
  readonly rpcUrl: string | undefined;
  readonly chainId: number | undefined;
  readonly marketAddress: Address;
}

export function parseSigningChainConfig(env: Env): SigningChainConfig {
  const problems: string[] = [];
  const str = (key: string) => env[key]?.trim() || undefined;
  const rpcUrl = str("RPC_URL");
  if (rpcUrl !== undefined && !/^https?:\/\//.test(rpcUrl))
    problems.push("RPC_URL must be an http(s):// URL");
  const rawChainId = str("CHAIN_ID");
  const chainId = optionalChainId(rawChainId, problems);
  if (rpcUrl === undefined && rawChainId === undefined)
    problems.push(
      "RPC_URL or CHAIN_ID is required: the chain id a signature is for comes from this machine, not from the gateway",
    );
  const market = str("MARKET_ADDRESS");
  if (market === undefined)
    problems.push(
      "MARKET_ADDRESS is required (the market's address: the signature's verifyingContract)",
    );
  else if (!isAddress(market, { strict: false }))
    problems.push(`MARKET_ADDRESS must be a 0x-prefixed 20-byte address, got "${market}"`);
  if (problems.length > 0) throw new ConfigError(problems);
  return { rpcUrl, chainId, marketAddress: market!.toLowerCase() as Address };
}

/** CHAIN_ID as given (a positive integer when set, else a problem); undefined when unset. */
function optionalChainId(raw: string | undefined, problems: string[]): number | undefined {
  const chainId = raw === undefined ? undefined : Number(raw);
  if (raw !== undefined && (!/^\d+$/.test(raw) || !Number.isSafeInteger(chainId) || chainId! < 1))
    problems.push(`CHAIN_ID must be a positive integer, got "${raw}"`);
  return chainId;
}

/** The gateway a CLI command calls with an API key (GATEWAY_URL and GATEWAY_API_KEY). */
export interface GatewayClientConfig {
  readonly baseUrl: string;
  readonly apiKey: string;
}

/**
 * GATEWAY_URL and GATEWAY_API_KEY, both or neither: undefined when neither is set (commands
 * that can do without the gateway then read the chain). GATEWAY_URL is `https://`, or `http://`
 * to this machine only (src/clients/gateway-url.ts). The key is never echoed.
 */
export function parseGatewayClientConfig(env: Env): GatewayClientConfig | undefined {
  const str = (key: string) => env[key]?.trim() || undefined;
  const baseUrl = str("GATEWAY_URL");
  const apiKey = str("GATEWAY_API_KEY");
  if (baseUrl === undefined && apiKey === undefined) return undefined;
  const problems: string[] = [];
  if (baseUrl === undefined) problems.push("GATEWAY_URL is required with GATEWAY_API_KEY");
  else {
    const problem = gatewayUrlProblem(baseUrl);
    if (problem !== undefined) problems.push(problem);
  }
  if (apiKey === undefined) problems.push("GATEWAY_API_KEY is required with GATEWAY_URL");
  if (problems.length > 0) throw new ConfigError(problems);
  return { baseUrl: baseUrl!, apiKey: apiKey! };
}

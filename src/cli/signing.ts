import { BaseError as ViemError, createPublicClient, http } from "viem";
import {
  ChallengeMismatchError,
  SigningDeclinedError,
  type ConfirmSigning,
  type SigningChain,
  type SigningSummary,
} from "../clients/signing-guard.js";
import { ConfigError, parseSigningChainConfig } from "../config.js";
import { BaseError } from "../domain/base-error.js";
import { isDeploymentId } from "../clients/permit.js";
import {
  GatewayRedirectError,
  GatewayRequestError,
  InsecureGatewayUrlError,
} from "../clients/gateway-call.js";

/**
 * How a wallet command of the CLI shows what it is about to sign (issue 28, item 1;
 * docs/decisions/authority-and-signing.md, "Wallet tools sign only what their user asked for"): once every check
 * passed, the summary goes to stderr (stdout keeps the command's result, `--json` included);
 * when stdin is a terminal the command then asks `sign it? [y/N]` and signs only on `y` or
 * `yes`. With no one to ask (`--yes`, or stdin that is not a terminal: a script, a pipe) it signs
 * after printing only when nothing it signs was left for the gateway to choose (issue 37): the
 * API key id is derived from the key (or pinned with `--key-id`), and the deployment must be
 * pinned (`--deployment`, GATEWAY_DEPLOYMENT_ID); else nothing is sent or signed (exit 2).
 */

/** Asks a yes/no question where a person can answer; absent when no one can. */
export type Ask = (question: string) => Promise<boolean>;

/** Where a command writes, and how it asks (only when stdin is a terminal). */
export interface CommandOutput {
  log(line: string): void;
  error(line: string): void;
  readonly ask?: Ask;
}

/**
 * No one can confirm what is signed (no terminal, or `--yes`) and the deployment it names is not
 * pinned: nothing was sent or signed (a usage problem, exit 2).
 */
export class UnpinnedSigningError extends BaseError {
  override readonly name = "UnpinnedSigningError";
  readonly reason = "usage";
  constructor(command: string) {
    super(
      `${command} signs for a gateway deployment; with no one to confirm it (stdin is not a terminal, or --yes) ` +
        "it must be pinned: pass --deployment DEPLOYMENT_ID or set GATEWAY_DEPLOYMENT_ID (the id the gateway's " +
        "operator published; GET /v1/gateway answers it); nothing was sent or signed",
    );
  }
}

/** The deployment the user pinned (GATEWAY_DEPLOYMENT_ID, or `--deployment` over it), checked. */
export function pinnedDeployment(env: NodeJS.ProcessEnv): string | undefined {
  const raw = env.GATEWAY_DEPLOYMENT_ID?.trim();
  if (raw === undefined || raw === "") return undefined;
  if (!isDeploymentId(raw))
    throw new ConfigError([
      "GATEWAY_DEPLOYMENT_ID (--deployment) must be a deployment id (dep_..., as GET /v1/gateway answers it)",
    ]);
  return raw;
}

/**
 * Before anything is sent: a command that signs for a deployment needs someone to confirm it
 * (a terminal, without `--yes`) or the deployment pinned ({@link UnpinnedSigningError}).
 */
export function requirePinsWithoutConfirmation(
  out: CommandOutput,
  yes: boolean,
  deployment: string | undefined,
  command: string,
): void {
  if ((yes || out.ask === undefined) && deployment === undefined)
    throw new UnpinnedSigningError(command);
}

/** The configured chain answered, but not as configured: nothing was signed (a usage problem). */
export class SigningChainError extends BaseError {
  override readonly name = "SigningChainError";
  readonly reason = "usage";
}

/**
 * The chain a signature is for, from this machine: MARKET_ADDRESS, and the chain id the RPC
 * reports (`eth_chainId`, which CHAIN_ID must match when set) or CHAIN_ID without an RPC.
 */
export async function signingChain(env: NodeJS.ProcessEnv): Promise<SigningChain> {
  const config = parseSigningChainConfig(env);
  let chainId = config.chainId;
  if (config.rpcUrl !== undefined) {
    const reported = await createPublicClient({ transport: http(config.rpcUrl) }).getChainId();
    if (chainId !== undefined && chainId !== reported)
      throw new SigningChainError(`RPC_URL serves chain ${reported}, CHAIN_ID says ${chainId}`);
    chainId = reported;
  }
  return { chainId: chainId!, market: config.marketAddress };
}

/** The summary as the lines printed before signing. */
export function summaryLines(summary: SigningSummary): string[] {
  const width = Math.max(0, ...summary.lines.map(([label]) => label.length));
  return [
    `${summary.title}:`,
    ...summary.lines.map(([label, value]) => `  ${label.padEnd(width)}  ${value}`),
  ];
}

/** Prints the summary to stderr, then asks unless `yes` or no one can answer. */
export function confirmOn(out: CommandOutput, yes: boolean): ConfirmSigning {
  return async (summary) => {
    for (const line of summaryLines(summary)) out.error(line);
    if (yes || out.ask === undefined) return;
    if (!(await out.ask("sign it? [y/N] "))) throw new SigningDeclinedError();
  };
}

/**
 * The failures every client command of the CLI reports alike (one line, no stack), with their
 * exit codes: 2 for a usage or configuration problem (`usage` appended where it helps), 1 for a
 * refusal (the gateway's, the challenge's, the user's, the chain's). Undefined: not one of them.
 */
export function reportClientFailure(
  error: unknown,
  out: Pick<CommandOutput, "error">,
  usage: string,
): number | undefined {
  if (error instanceof InsecureGatewayUrlError) {
    out.error(`${error.message}\n\n${usage}`);
    return 2;
  }
  if (error instanceof ConfigError) {
    out.error(`${error.problems.join("; ")}\n\n${usage}`);
    return 2;
  }
  if (error instanceof SigningChainError || error instanceof UnpinnedSigningError) {
    out.error(error.message);
    return 2;
  }
  if (
    error instanceof ChallengeMismatchError ||
    error instanceof SigningDeclinedError ||
    error instanceof GatewayRedirectError
  ) {
    out.error(error.message);
    return 1;
  }
  if (error instanceof GatewayRequestError) {
    out.error(`the gateway refused (${error.status} ${error.code}): ${error.message}`);
    return 1;
  }
  if (error instanceof ViemError) {
    // shortMessage only: the details name the RPC URL, which may carry a provider's key.
    out.error(`the chain call failed: ${error.shortMessage}`);
    return 1;
  }
  if (error instanceof TypeError && error.message === "fetch failed") {
    out.error("cannot reach the gateway (GATEWAY_URL)");
    return 1;
  }
  return undefined;
}

/**
 * The flags every signing client command takes (`gateway permit`, `gateway provider`), as
 * `parseArgs` options: the signer's keystore, and the gateway and chain ones `settingsFromFlags`
 * reads.
 */
export const signingFlags = {
  keystore: { type: "string" },
  gateway: { type: "string" },
  "api-key": { type: "string" },
  "rpc-url": { type: "string" },
  market: { type: "string" },
  "chain-id": { type: "string" },
  deployment: { type: "string" },
} as const;

/** The gateway and chain flags a client command takes, over the environment (flags win). */
export function settingsFromFlags(
  env: NodeJS.ProcessEnv,
  values: Readonly<Record<string, unknown>>,
): NodeJS.ProcessEnv {
  const flag = (name: string) => values[name] as string | undefined;
  return {
    ...env,
    ...(flag("gateway") === undefined ? {} : { GATEWAY_URL: flag("gateway") }),
    ...(flag("api-key") === undefined ? {} : { GATEWAY_API_KEY: flag("api-key") }),
    ...(flag("rpc-url") === undefined ? {} : { RPC_URL: flag("rpc-url") }),
    ...(flag("market") === undefined ? {} : { MARKET_ADDRESS: flag("market") }),
    ...(flag("chain-id") === undefined ? {} : { CHAIN_ID: flag("chain-id") }),
    ...(flag("deployment") === undefined ? {} : { GATEWAY_DEPLOYMENT_ID: flag("deployment") }),
  };
}

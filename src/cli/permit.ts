import { randomBytes } from "node:crypto";
import { parseArgs } from "node:util";
import {
  createPublicClient,
  createWalletClient,
  formatUnits,
  http,
  isAddress,
  zeroHash,
  type Address,
  type Hex,
  type LocalAccount,
  type PublicClient,
} from "viem";
import { chainFor } from "../adapters/chain/clients.js";
import {
  finalizePermitClose,
  MarketRefusedError,
  openPermit,
  readChainPermit,
  readModelToken,
  requestPermitClose,
  type ModelToken,
  type PayerChain,
} from "../adapters/chain/permit-transactions.js";
import {
  parseGatewayClientConfig,
  parsePayerChainConfig,
  type GatewayClientConfig,
} from "../config.js";
import { apiKeyIdPattern } from "../clients/signing-guard.js";
import { GatewayError } from "../domain/errors.js";
import { isHex32 } from "../domain/hex.js";
import {
  anyPermit,
  defaultMaxAuthorizationLifetimeSeconds,
  readCaps,
} from "../domain/permit-authorization.js";
import { BaseError } from "../domain/base-error.js";
import { authorizeApiKey, revokeAuthorizationAsPayer } from "../clients/permit.js";
import { call, type GatewayConnection } from "../clients/provider.js";
import { AmountError, parseDeposit, parseDuration } from "./amounts.js";
import {
  listAuthorizationsAsPayer,
  PayerControlUsageError,
  revokeAuthorizationsAsPayer,
  type PayerChainFacts,
} from "./payer-control.js";
import { isAuditUsageError, runPermitAudit } from "./permit-audit.js";
import {
  confirmOn,
  reportClientFailure,
  settingsFromFlags,
  signingChain,
  type CommandOutput,
} from "./signing.js";
import { loadSigner, SignerUsageError } from "./signer.js";

export const permitUsage = `usage: gateway permit <command>

  open MODEL --deposit AMOUNT [--tokens] [--offer ID] [--expires-at UNIX_SECONDS | --expires-in 30d]
       [--id PERMIT_ID] [--keystore FILE] [--json]
                          approve the model's credit token for the market and open a permit as the
                          payer. MODEL: the model id (0x + 64 hex digits), or a public id or alias
                          the gateway resolves (needs GATEWAY_URL and GATEWAY_API_KEY). AMOUNT: base
                          units (1000000), or whole tokens (12.5tokens, or 12.5 with --tokens) by the
                          token's decimals. --offer pins one offer; default expiry 30 days (chain
                          time); default id random. Prints the permit id and the transactions.
  authorize [--permit ID] [--expires-at UNIX_SECONDS | --expires-in 30d] [--total-cap CREDITS]
            [--per-request-cap CREDITS] [--key-id KEY_ID] [--payer ADDRESS] [--keystore FILE]
            [--yes] [--json]
                          let the API key GATEWAY_API_KEY spend the payer's permits: builds the
                          AuthorizeKey typed data itself, compares the gateway's challenge with it
                          field by field (any difference: nothing signed, exit 1), shows it, signs
                          as the payer, submits it. No --permit: every permit of the payer;
                          default expiry 30 days, at most 90; caps in credits (the permit's
                          smallest unit, they need --permit); --key-id: the id 'gateway keys
                          create' printed, which the challenge must name (else it is shown)
  revoke ID [--payer ADDRESS] [--keystore FILE] [--yes] [--json]
                          revoke authorization ID with the payer's signature (any API key)
  authorizations [--payer ADDRESS] [--keystore FILE] [--json]
                          every authorization made for the payer's address, whichever key holds
                          it, newest first (signed as the payer; no API key)
  revoke --key KEY_ID [--permit ID] | --permit ID | --all [--payer ADDRESS] [--keystore FILE] [--json]
                          revoke, signed as the payer and without any API key, the payer's
                          authorizations of one API key (of one permit with --permit), those naming
                          one permit, or all of them; --all also voids every AuthorizeKey signed up
                          to now and not yet submitted
  balance ID [--json]     the permit's balance as the gateway sees it (GET /v1/permits/ID, an API key
                          the payer authorized); without GATEWAY_API_KEY, the permit as the chain
                          holds it (settled amounts only)
  close ID [--keystore FILE] [--json]
                          request the permit's close (payer only); prints when it becomes closable
  finalize ID [--keystore FILE] [--json]
                          after the close grace period: close it; the market refunds deposit minus
                          settled to the payer (whoever sends it)
  audit PERMIT_ID [--json]
                          check the permit's signed usage receipts against the chain (RPC_URL,
                          MARKET_ADDRESS): exit 0 when the settled receipts add up to what settled

Gateway: GATEWAY_URL and GATEWAY_API_KEY (or --gateway / --api-key); authorizations and revoke
         --key/--permit/--all need GATEWAY_URL only (https://, or http:// on loopback), and sign
         for the deployment GET /v1/gateway names (shown before signing)
Chain:   RPC_URL, MARKET_ADDRESS, and optionally CHAIN_ID, which the RPC must report
         (or --rpc-url / --market / --chain-id); authorize and revoke take CHAIN_ID without
         RPC_URL too: the chain a signature is for is never taken from the gateway
Payer:   PAYER_PRIVATE_KEY, or --keystore FILE (an encrypted JSON keystore) with KEYSTORE_PASSWORD;
         for a contract wallet (ERC-1271), --payer ADDRESS and a key the wallet accepts (authorize)

GATEWAY_URL is https://, or http:// to this machine only (127.0.0.0/8, ::1, localhost); redirects
are not followed. authorize and revoke print what they are about to sign to stderr and, when
stdin is a terminal, ask before signing (--yes: do not ask).

Exit codes: 0 done, 1 refused (by the gateway or the chain, a challenge that differs from what
was asked for, or not confirmed: nothing signed), 2 usage.`;

class PermitUsageError extends BaseError {
  override readonly name = "PermitUsageError";
  readonly reason = "usage";
}

/** The chain answered, but not the chain the payer configured: nothing was signed. */
class WrongChainError extends BaseError {
  override readonly name = "WrongChainError";
  readonly reason = "usage";
}

/** A permit balance as `GET /v1/permits/{id}` answers it. */
interface PermitBalanceJson {
  permit_id: string;
  state: string;
  model_id: string;
  offer_id: string | null;
  payer: string;
  expires_at: number;
  closable_at: number | null;
  deposit: string;
  settled: string;
  charged_unsettled: string;
  reserved: string;
  available: string;
}

type Output = CommandOutput;

function permitIdArg(raw: string | undefined): Hex {
  if (raw === undefined || !isHex32(raw))
    throw new PermitUsageError("a permit id (0x + 64 hex digits) is required");
  return raw.toLowerCase() as Hex;
}

function gatewayOf(config: GatewayClientConfig | undefined): GatewayConnection {
  if (config === undefined)
    throw new PermitUsageError("set GATEWAY_URL and GATEWAY_API_KEY (or --gateway and --api-key)");
  return config;
}

function when(seconds: bigint | number): string {
  return `${seconds} (${new Date(Number(seconds) * 1000).toISOString()})`;
}

function tokens(amount: bigint, token: ModelToken): string {
  return `${amount} (${formatUnits(amount, token.decimals)} ${token.symbol})`;
}

/** Public (and, with `account`, wallet) clients on the configured chain, its id checked first. */
async function connectChain(
  env: NodeJS.ProcessEnv,
  account?: LocalAccount,
): Promise<{ publicClient: PublicClient; chain: PayerChain | undefined; market: Address }> {
  const config = parsePayerChainConfig(env);
  // Short polling: receipts on a local chain come in well under a second, on others the wait is
  // the block time either way.
  const probe = createPublicClient({ transport: http(config.rpcUrl), pollingInterval: 500 });
  const reported = await probe.getChainId();
  if (config.chainId !== undefined && config.chainId !== reported)
    throw new WrongChainError(`RPC_URL serves chain ${reported}, CHAIN_ID says ${config.chainId}`);
  const chain = chainFor(reported, config.rpcUrl);
  const publicClient = createPublicClient({
    chain,
    transport: http(config.rpcUrl),
    pollingInterval: 500,
  }) as PublicClient;
  const market = config.marketAddress;
  if (account === undefined) return { publicClient, chain: undefined, market };
  const wallet = createWalletClient({
    chain,
    account,
    transport: http(config.rpcUrl),
    pollingInterval: 500,
  });
  return { publicClient, chain: { publicClient, wallet, market }, market };
}

/** MODEL as typed: a model id as is, else the gateway's resolution of a public id or alias. */
async function resolveModel(model: string, gateway: GatewayClientConfig | undefined): Promise<Hex> {
  if (isHex32(model)) return model.toLowerCase() as Hex;
  if (gateway === undefined)
    throw new PermitUsageError(
      `'${model}' is not a model id (0x + 64 hex digits); resolving a public id or alias needs GATEWAY_URL and GATEWAY_API_KEY`,
    );
  const found = await call<{ model_id: string }>(
    gateway,
    "GET",
    `/v1/models/${encodeURIComponent(model)}`,
  );
  return found.model_id.toLowerCase() as Hex;
}

async function open(
  model: string | undefined,
  values: Record<string, string | boolean | undefined>,
  env: NodeJS.ProcessEnv,
  gateway: GatewayClientConfig | undefined,
  out: Output,
): Promise<void> {
  if (model === undefined) throw new PermitUsageError("a model is required: open MODEL");
  const deposit = values.deposit as string | undefined;
  if (deposit === undefined) throw new PermitUsageError("--deposit AMOUNT is required");
  const offer = values.offer as string | undefined;
  if (offer !== undefined && !isHex32(offer))
    throw new PermitUsageError("--offer must be an offer id (0x + 64 hex digits)");
  const { expiresAtArg, expiresIn } = expiryFlags(values);
  const lifetime = parseDuration(expiresIn ?? "30d");
  const id = values.id as string | undefined;
  if (id !== undefined && !isHex32(id))
    throw new PermitUsageError("--id must be a permit id (0x + 64 hex digits)");
  const signer = await loadSigner(values.keystore as string | undefined, env, "PAYER_PRIVATE_KEY");
  const { publicClient, chain, market } = await connectChain(env, signer);
  const modelId = await resolveModel(model, gateway);
  const token = await readModelToken(publicClient, market, modelId);
  const amount = parseDeposit(deposit, token.decimals, values.tokens === true);
  // Relative to the chain's clock, which is what the market compares the expiry with.
  const expiresAt =
    expiresAtArg !== undefined
      ? BigInt(expiresAtArg)
      : (await publicClient.getBlock()).timestamp + lifetime;
  const opened = await openPermit(chain!, {
    permitId: (id?.toLowerCase() as Hex | undefined) ?? `0x${randomBytes(32).toString("hex")}`,
    modelId,
    ...(offer === undefined ? {} : { offerId: offer.toLowerCase() as Hex }),
    deposit: amount,
    expiresAt,
  });
  const offerId = opened.offerId === zeroHash ? null : opened.offerId;
  if (values.json === true) {
    out.log(
      JSON.stringify(
        {
          permit_id: opened.permitId,
          payer: opened.payer.toLowerCase(),
          model_id: opened.modelId,
          offer_id: offerId,
          deposit: opened.deposit.toString(),
          expires_at: Number(opened.expiresAt),
          credit_token: opened.creditToken.toLowerCase(),
          decimals: token.decimals,
          transactions: { approve: opened.approveTx ?? null, open: opened.openTx },
        },
        null,
        2,
      ),
    );
    return;
  }
  out.log(`opened permit ${opened.permitId}`);
  out.log(`  payer      ${opened.payer}`);
  out.log(`  model      ${opened.modelId}${offerId === null ? " (any offer)" : ""}`);
  if (offerId !== null) out.log(`  offer      ${offerId}`);
  out.log(`  deposit    ${tokens(opened.deposit, token)}`);
  out.log(`  expires at ${when(opened.expiresAt)}`);
  out.log(
    `  approve tx ${opened.approveTx ?? "(none: the market's allowance covered the deposit)"}`,
  );
  out.log(`  open tx    ${opened.openTx}`);
  out.log(
    `next: let an API key spend it: gateway permit authorize --permit ${opened.permitId} (with that key as GATEWAY_API_KEY)`,
  );
}

async function balance(
  permitId: Hex,
  json: boolean,
  env: NodeJS.ProcessEnv,
  gateway: GatewayClientConfig | undefined,
  out: Output,
): Promise<void> {
  if (gateway !== undefined) {
    const view = await call<PermitBalanceJson>(gateway, "GET", `/v1/permits/${permitId}`);
    if (json) out.log(JSON.stringify({ source: "gateway", ...view }, null, 2));
    else {
      out.log(`permit ${view.permit_id} (${view.state}), as the gateway accounts for it`);
      for (const key of [
        "payer",
        "model_id",
        "offer_id",
        "expires_at",
        "closable_at",
        "deposit",
        "settled",
        "charged_unsettled",
        "reserved",
        "available",
      ] as const)
        out.log(`  ${key.padEnd(17)} ${view[key] ?? "-"}`);
    }
    return;
  }
  const { publicClient, market } = await connectChain(env);
  const permit = await readChainPermit(publicClient, market, permitId);
  if (permit === undefined)
    throw new MarketRefusedError("NotFound", `no permit ${permitId} on the market`);
  const view = {
    source: "chain",
    permit_id: permit.permitId,
    state: permit.state,
    model_id: permit.modelId,
    offer_id: permit.offerId === zeroHash ? null : permit.offerId,
    payer: permit.payer.toLowerCase(),
    expires_at: Number(permit.expiresAt),
    closable_at: permit.closableAt === 0n ? null : Number(permit.closableAt),
    deposit: permit.deposit.toString(),
    settled: permit.settled.toString(),
  };
  if (json) {
    out.log(JSON.stringify(view, null, 2));
    return;
  }
  out.log(
    `permit ${view.permit_id} (${view.state}), read from the chain: no GATEWAY_API_KEY, so charges not yet settled and open reservations are not shown`,
  );
  for (const key of [
    "payer",
    "model_id",
    "offer_id",
    "expires_at",
    "closable_at",
    "deposit",
    "settled",
  ] as const)
    out.log(`  ${key.padEnd(11)} ${view[key] ?? "-"}`);
}

/**
 * `gateway permit …`: what a payer runs: open a permit on the chain, authorize an API key to
 * spend it (or revoke one), read its balance, close it and take back what was not spent. Writes
 * results to `out`; returns the exit code (0 done, 1 refused by the gateway or the chain,
 * 2 usage). No message carries the payer's key or the API key.
 */
export async function runPermitCommand(
  args: string[],
  env: NodeJS.ProcessEnv,
  out: Output,
): Promise<number> {
  try {
    const { values, positionals } = parseArgs({
      args,
      allowPositionals: true,
      options: {
        permit: { type: "string" },
        "key-id": { type: "string" },
        "total-cap": { type: "string" },
        "per-request-cap": { type: "string" },
        yes: { type: "boolean" },
        "expires-at": { type: "string" },
        "expires-in": { type: "string" },
        payer: { type: "string" },
        keystore: { type: "string" },
        gateway: { type: "string" },
        "api-key": { type: "string" },
        "rpc-url": { type: "string" },
        market: { type: "string" },
        "chain-id": { type: "string" },
        offer: { type: "string" },
        deposit: { type: "string" },
        tokens: { type: "boolean" },
        id: { type: "string" },
        json: { type: "boolean" },
        key: { type: "string" },
        all: { type: "boolean" },
      },
    });
    const [action, target, extra] = positionals;
    if (extra !== undefined) throw new PermitUsageError(`unexpected argument '${extra}'`);
    // Flags win over the environment; both are parsed in one place (src/config.ts).
    const settings = settingsFromFlags(env, values);
    // The payer's own calls need GATEWAY_URL only: a key alone is not asked for.
    const payerCall = action === "authorizations" || (action === "revoke" && target === undefined);
    const gateway = payerCall ? undefined : parseGatewayClientConfig(settings);
    /** The chain id and market the payer configured (the RPC's chain id, checked). */
    const payerChain = async (): Promise<PayerChainFacts> => {
      const { publicClient, market } = await connectChain(settings);
      return { chainId: await publicClient.getChainId(), market };
    };
    switch (action) {
      case "authorizations": {
        if (target !== undefined) throw new PermitUsageError(`unexpected argument '${target}'`);
        const signer = await loadSigner(values.keystore, settings, "PAYER_PRIVATE_KEY");
        await listAuthorizationsAsPayer(
          {
            signer,
            ...(values.payer === undefined ? {} : { payer: values.payer }),
            json: values.json === true,
            env: settings,
            chain: payerChain,
          },
          out,
        );
        return 0;
      }
      case "open":
        await open(target, values, settings, gateway, out);
        return 0;
      case "authorize": {
        const request = authorizeArgs(values);
        const connection = gatewayOf(gateway);
        const signer = await loadSigner(values.keystore, settings, "PAYER_PRIVATE_KEY");
        const chain = await signingChain(settings);
        const authorization = await authorizeApiKey(connection, {
          signer,
          chain,
          ...request,
          confirm: confirmOn(out, values.yes === true),
        });
        if (values.json === true) out.log(JSON.stringify({ authorization }, null, 2));
        else {
          const scope = /^0x0{64}$/.test(authorization.permit_id)
            ? "every permit"
            : `permit ${authorization.permit_id}`;
          out.log(
            `authorized API key ${authorization.api_key_id} to spend ${scope} of ${authorization.payer} until ${authorization.expires_at} (${authorization.id})`,
          );
          out.log(`revoke it: gateway permit revoke ${authorization.id}`);
        }
        return 0;
      }
      case "revoke": {
        if (target === undefined) {
          const signer = await loadSigner(values.keystore, settings, "PAYER_PRIVATE_KEY");
          await revokeAuthorizationsAsPayer(
            {
              signer,
              ...(values.payer === undefined ? {} : { payer: values.payer }),
              ...(values.key === undefined ? {} : { keyId: values.key }),
              ...(values.permit === undefined ? {} : { permitId: values.permit }),
              all: values.all === true,
              json: values.json === true,
              env: settings,
              chain: payerChain,
            },
            out,
          );
          return 0;
        }
        if (values.key !== undefined || values.all === true || values.permit !== undefined)
          throw new PermitUsageError(
            "revoke ID revokes one authorization: give it without --key, --permit or --all",
          );
        const payer = payerArg(values.payer);
        const connection = gatewayOf(gateway);
        const signer = await loadSigner(values.keystore, settings, "PAYER_PRIVATE_KEY");
        const chain = await signingChain(settings);
        const authorization = await revokeAuthorizationAsPayer(connection, {
          id: target,
          signer,
          chain,
          ...(payer === undefined ? {} : { payer }),
          confirm: confirmOn(out, values.yes === true),
        });
        if (values.json === true) out.log(JSON.stringify({ authorization }, null, 2));
        else
          out.log(
            `revoked ${authorization.id} (API key ${authorization.api_key_id}, by the ${authorization.revoked_by ?? "payer"})`,
          );
        return 0;
      }
      case "audit": {
        if (target === undefined || !isHex32(target))
          throw new PermitUsageError("a permit id (0x + 64 hex digits) is required");
        return await runPermitAudit(
          target as Hex,
          { json: values.json === true },
          gatewayOf(gateway),
          settings,
          out,
        );
      }
      case "balance":
        await balance(permitIdArg(target), values.json === true, settings, gateway, out);
        return 0;
      case "close": {
        const permitId = permitIdArg(target);
        const signer = await loadSigner(values.keystore, settings, "PAYER_PRIVATE_KEY");
        const { chain } = await connectChain(settings, signer);
        const { closableAt, tx } = await requestPermitClose(chain!, permitId);
        if (values.json === true)
          out.log(
            JSON.stringify(
              { permit_id: permitId, state: "closing", closable_at: Number(closableAt), tx },
              null,
              2,
            ),
          );
        else {
          out.log(`requested the close of permit ${permitId}: closable at ${when(closableAt)}`);
          out.log(`  tx ${tx}`);
          out.log(`then: gateway permit finalize ${permitId}`);
        }
        return 0;
      }
      case "finalize": {
        const permitId = permitIdArg(target);
        const signer = await loadSigner(values.keystore, settings, "PAYER_PRIVATE_KEY");
        const { publicClient, chain, market } = await connectChain(settings, signer);
        const { refund, permit, tx } = await finalizePermitClose(chain!, permitId);
        if (values.json === true)
          out.log(
            JSON.stringify(
              {
                permit_id: permitId,
                state: permit.state,
                payer: permit.payer.toLowerCase(),
                deposit: permit.deposit.toString(),
                settled: permit.settled.toString(),
                refund: refund.toString(),
                tx,
              },
              null,
              2,
            ),
          );
        else {
          const token = await readModelToken(publicClient, market, permit.modelId);
          out.log(
            `closed permit ${permitId}: refunded ${tokens(refund, token)} to the payer ${permit.payer}`,
          );
          out.log(
            `  deposit ${permit.deposit}, settled ${permit.settled}${signer.address.toLowerCase() === permit.payer.toLowerCase() ? "" : ` (sent by ${signer.address}, not the payer: the refund went to the payer)`}`,
          );
          out.log(`  tx ${tx}`);
        }
        return 0;
      }
      default:
        throw new PermitUsageError(
          action === undefined ? "missing permit command" : `unknown permit command '${action}'`,
        );
    }
  } catch (error) {
    return report(error, out);
  }
}

function payerArg(raw: string | undefined): Address | undefined {
  if (raw !== undefined && !isAddress(raw, { strict: false }))
    throw new PermitUsageError("--payer must be an address (0x + 40 hex digits)");
  return raw as Address | undefined;
}

/**
 * What `authorize` asks for, from its arguments only: the permit, the expiry (in the future, at
 * most 90 days away: gateways refuse more by default, AUTHORIZATION_MAX_EXPIRY_SECONDS), the
 * caps (the domain's rules, src/domain/permit-authorization.ts `readCaps`), the key id.
 */
function authorizeArgs(values: Record<string, string | boolean | undefined>): {
  payer?: Address;
  permitId?: Hex;
  expiresAt?: number;
  totalCap?: string;
  perRequestCap?: string;
  keyId?: string;
} {
  const permitId = values.permit as string | undefined;
  if (permitId !== undefined && !isHex32(permitId))
    throw new PermitUsageError("--permit must be a permit id (0x + 64 hex digits)");
  const { expiresAtArg, expiresIn } = expiryFlags(values);
  const now = Math.floor(Date.now() / 1000);
  const expiresAt =
    expiresAtArg !== undefined
      ? Number(expiresAtArg)
      : expiresIn !== undefined
        ? now + Number(parseDuration(expiresIn))
        : undefined;
  if (expiresAt !== undefined) {
    if (expiresAt <= now) throw new PermitUsageError("the expiry is in the past");
    if (expiresAt > now + defaultMaxAuthorizationLifetimeSeconds)
      throw new PermitUsageError(
        `the expiry is more than ${defaultMaxAuthorizationLifetimeSeconds / 86_400} days away: ` +
          "an authorization is renewed, not made to last (gateways refuse it: AUTHORIZATION_MAX_EXPIRY_SECONDS)",
      );
  }
  const totalCap = values["total-cap"] as string | undefined;
  const perRequestCap = values["per-request-cap"] as string | undefined;
  for (const [flag, cap] of [
    ["--total-cap", totalCap],
    ["--per-request-cap", perRequestCap],
  ] as const)
    if (cap !== undefined && !/^(0|[1-9]\d{0,77})$/.test(cap))
      throw new PermitUsageError(
        `${flag} must be credits: a whole number of the permit's smallest unit ("0": no cap)`,
      );
  try {
    readCaps(totalCap, perRequestCap, (permitId as Hex | undefined) ?? anyPermit);
  } catch (error) {
    if (error instanceof GatewayError)
      throw new PermitUsageError(`${error.message} (--total-cap, --per-request-cap, --permit)`);
    throw error;
  }
  const keyId = values["key-id"] as string | undefined;
  if (keyId !== undefined && !apiKeyIdPattern.test(keyId))
    throw new PermitUsageError(
      "--key-id must be an API key's public id (key_..., as 'gateway keys create' printed it)",
    );
  const payer = payerArg(values.payer as string | undefined);
  return {
    ...(payer === undefined ? {} : { payer }),
    ...(permitId === undefined ? {} : { permitId: permitId.toLowerCase() as Hex }),
    ...(expiresAt === undefined ? {} : { expiresAt }),
    ...(totalCap === undefined ? {} : { totalCap }),
    ...(perRequestCap === undefined ? {} : { perRequestCap }),
    ...(keyId === undefined ? {} : { keyId }),
  };
}

/** One line per failure, its exit code; a failure not foreseen here still carries no stack. */
function report(error: unknown, out: Output): number {
  if (
    error instanceof PermitUsageError ||
    error instanceof SignerUsageError ||
    error instanceof AmountError ||
    isAuditUsageError(error) ||
    (error as { code?: string }).code?.startsWith("ERR_PARSE_ARGS") === true
  ) {
    out.error(`${(error as Error).message}\n\n${permitUsage}`);
    return 2;
  }
  if (error instanceof PayerControlUsageError) {
    out.error(`${error.message}\n\n${permitUsage}`);
    return 2;
  }
  if (error instanceof WrongChainError) {
    out.error(error.message);
    return 2;
  }
  if (error instanceof MarketRefusedError) {
    out.error(`the chain refused: ${error.message}`);
    return 1;
  }
  const code = reportClientFailure(error, out, permitUsage);
  if (code !== undefined) return code;
  throw error;
}

/** `--expires-at UNIX_SECONDS` or `--expires-in DURATION` (not both), as given. */
function expiryFlags(values: Readonly<Record<string, unknown>>): {
  expiresAtArg: string | undefined;
  expiresIn: string | undefined;
} {
  const expiresAtArg = values["expires-at"] as string | undefined;
  const expiresIn = values["expires-in"] as string | undefined;
  if (expiresAtArg !== undefined && expiresIn !== undefined)
    throw new PermitUsageError("give --expires-at or --expires-in, not both");
  if (expiresAtArg !== undefined && !/^[1-9]\d{0,15}$/.test(expiresAtArg))
    throw new PermitUsageError("--expires-at must be Unix seconds");
  return { expiresAtArg, expiresIn };
}

/**
 * `gateway permit` on the chain: open a permit, read its balance, request its close and
 * finalize it, as the payer (or whoever sends the finalization).
 */
import { randomBytes } from "node:crypto";
import {
  createPublicClient,
  createWalletClient,
  http,
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
import { parsePayerChainConfig, type GatewayClientConfig } from "../config.js";
import { isHex32 } from "../domain/hex.js";
import { call } from "../clients/gateway-call.js";
import { formatAmountExact, type TokenUnits } from "../domain/token-units.js";
import { parseDeposit, parseDuration } from "./amounts.js";
import { gatewayModelUnits, withTokenUnits } from "./token-amounts.js";
import type { PayerChainFacts } from "./payer-control.js";
import {
  expiryFlags,
  permitIdArg,
  PermitUsageError,
  WrongChainError,
  type PermitFlags,
} from "./permit-args.js";
import type { CommandOutput } from "./signing.js";
import { loadSigner } from "./signer.js";

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

function when(seconds: bigint | number): string {
  return `${seconds} (${new Date(Number(seconds) * 1000).toISOString()})`;
}

/** An amount for a person: token units with the symbol, the exact base units beside them. */
function tokens(amount: bigint, token: ModelToken): string {
  return formatAmountExact(amount, token);
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

/** The payer's signer (its keystore, else PAYER_PRIVATE_KEY) and the chain it signs on. */
async function payerWallet(keystore: string | undefined, env: NodeJS.ProcessEnv) {
  const signer = await loadSigner(keystore, env, "PAYER_PRIVATE_KEY");
  return { signer, ...(await connectChain(env, signer)) };
}

/** Prints `keys` of `view`, a line each, the values aligned ("-" for none). */
function logFields<T extends object>(
  out: Output,
  view: T,
  keys: readonly (keyof T & string)[],
): void {
  const width = Math.max(...keys.map((key) => key.length));
  for (const key of keys) out.log(`  ${key.padEnd(width)} ${view[key] ?? "-"}`);
}

/** What the chain itself says of a permit, in the order `balance` prints it. */
const chainPermitFields = [
  "payer",
  "model_id",
  "offer_id",
  "expires_at",
  "closable_at",
  "deposit",
  "settled",
] as const;

/**
 * The credit token units of permits as the market states them (the permit's model's token: its
 * decimals and symbol read from the chain, never a gateway's say-so), read once per permit, for
 * amounts a payer types or reads (caps in token units, the summary before signing, the
 * listing). Undefined without RPC_URL (a payer may sign with CHAIN_ID alone) or for a permit the
 * chain does not hold.
 */
export function permitUnitsReader(
  env: NodeJS.ProcessEnv,
): (permitId: Hex) => Promise<TokenUnits | undefined> {
  const known = new Map<string, Promise<TokenUnits | undefined>>();
  let chain: ReturnType<typeof connectChain> | undefined;
  return (permitId) => {
    if ((env.RPC_URL ?? "") === "") return Promise.resolve(undefined);
    let found = known.get(permitId.toLowerCase());
    if (found === undefined) {
      chain ??= connectChain(env);
      found = chain.then(async ({ publicClient, market }) => {
        const permit = await readChainPermit(publicClient, market, permitId);
        if (permit === undefined) return undefined;
        const token = await readModelToken(publicClient, market, permit.modelId);
        return { decimals: token.decimals, symbol: token.symbol };
      });
      known.set(permitId.toLowerCase(), found);
    }
    return found;
  };
}

/** The chain id and market the payer configured (the RPC's chain id, checked). */
export async function payerChainFacts(env: NodeJS.ProcessEnv): Promise<PayerChainFacts> {
  const { publicClient, market } = await connectChain(env);
  return { chainId: await publicClient.getChainId(), market };
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

export async function open(
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
  const { publicClient, chain, market } = await payerWallet(
    values.keystore as string | undefined,
    env,
  );
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
          decimals: token.decimals ?? null,
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

export async function balance(
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
      const units = await gatewayModelUnits(gateway, view.model_id);
      const amounts = ["deposit", "settled", "charged_unsettled", "reserved", "available"] as const;
      logFields(out, withTokenUnits(view, amounts, units), [
        ...chainPermitFields,
        "charged_unsettled",
        "reserved",
        "available",
      ]);
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
  const token = await readModelToken(publicClient, market, permit.modelId);
  logFields(out, withTokenUnits(view, ["deposit", "settled"], token), chainPermitFields);
}

/** `close ID`: the payer requests the permit's close. */
export async function closePermit(
  target: string | undefined,
  values: PermitFlags,
  settings: NodeJS.ProcessEnv,
  out: Output,
): Promise<void> {
  const permitId = permitIdArg(target);
  const { chain } = await payerWallet(values.keystore, settings);
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
}

/** `finalize ID`: after the grace period, close it; the market refunds the payer. */
export async function finalizePermit(
  target: string | undefined,
  values: PermitFlags,
  settings: NodeJS.ProcessEnv,
  out: Output,
): Promise<void> {
  const permitId = permitIdArg(target);
  const { signer, publicClient, chain, market } = await payerWallet(values.keystore, settings);
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
      `  deposit ${tokens(permit.deposit, token)}, settled ${tokens(permit.settled, token)}${signer.address.toLowerCase() === permit.payer.toLowerCase() ? "" : ` (sent by ${signer.address}, not the payer: the refund went to the payer)`}`,
    );
    out.log(`  tx ${tx}`);
  }
}

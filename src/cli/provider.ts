import { parseArgs } from "node:util";
import { BaseError } from "../domain/base-error.js";
import { isAddress, type Address, type Hex, type LocalAccount } from "viem";
import { canonicalEndpointUrl } from "../adapters/upstream/endpoint-guard.js";
import { apiKeyIdPattern } from "../clients/signing-guard.js";
import { parseGatewayClientConfig } from "../config.js";
import { GatewayError } from "../domain/errors.js";
import { isHex32 } from "../domain/hex.js";
import {
  bindKey,
  offerEarnings,
  offerHealth,
  registerEndpoint,
  verifyOffer,
  type EarningsJson,
} from "../clients/provider.js";
import { type GatewayConnection } from "../clients/gateway-call.js";
import {
  confirmOn,
  pinnedDeployment,
  reportClientFailure,
  requirePinsWithoutConfirmation,
  settingsFromFlags,
  signingChain,
  signingFlags,
  type CommandOutput,
} from "./signing.js";
import { loadSigner, SignerUsageError } from "./signer.js";
import { formatAmountExact, type TokenUnits } from "../domain/token-units.js";
import { gatewayModelUnits } from "./token-amounts.js";

export const providerUsage = `usage: gateway provider <command>

  register --offer ID --endpoint URL [--endpoint-token T] [--operator ADDRESS] [--keystore FILE]
           [--yes]
                          sign a registration with the offer operator's key and submit it (the
                          signature covers the endpoint URL's and the token's hashes: it registers
                          exactly that endpoint and token, or none)
  health ID               the offer's chain status, liveness and verification
  verify ID               probe the registered endpoint now and refresh its verification
  bind-key ID [--expires-at SECONDS] [--key-id KEY_ID] [--deployment ID] [--operator ADDRESS]
           [--keystore FILE] [--yes]
                          let the gateway API key read the offer's earnings: signs BindOfferKey with
                          the offer operator's key for this gateway deployment (default expiry: 30
                          days). The key id is derived from GATEWAY_API_KEY (--key-id: a key issued
                          before ids were derived, the id 'gateway keys create' printed); the
                          deployment is --deployment or GATEWAY_DEPLOYMENT_ID when pinned (the
                          gateway must name it), else GET /v1/gateway's, shown
  earnings ID [--from SECONDS] [--to SECONDS] [--json]
                          the offer's requests, tokens and credits by settlement state, and the
                          batches that settled them (default: the last 30 days; the API key must be
                          bound to the offer, see bind-key)

The endpoint URL is the server root (the gateway appends /v1/models and /v1/chat/completions).
Gateway:  GATEWAY_URL and GATEWAY_API_KEY (or --gateway / --api-key)
Operator: OPERATOR_PRIVATE_KEY, or --keystore FILE (an encrypted JSON keystore) with KEYSTORE_PASSWORD;
          --operator ADDRESS for a contract operator (ERC-1271) and a key it accepts
Chain:    register and bind-key: MARKET_ADDRESS, and RPC_URL (its chain id) or CHAIN_ID
          (or --market / --rpc-url / --chain-id): the chain a signature is for is never taken
          from the gateway

register and bind-key build the typed data themselves and compare the gateway's challenge with it
field by field: on any difference they sign nothing and exit 1 naming the field. What they sign
is printed to stderr first; when stdin is a terminal they ask (--yes: do not ask). bind-key with
no one to ask (no terminal, or --yes) signs only with the deployment pinned (exit 2 otherwise,
before anything is sent). GATEWAY_URL is https://, or http:// to this machine only; redirects are
not followed.`;

export class ProviderUsageError extends BaseError {
  override readonly name = "ProviderUsageError";
  readonly reason = "usage";
}

/** The offer operator's key, loaded as every signing command loads its key (cli/signer.ts). */
async function operatorAccount(
  keystore: string | undefined,
  env: NodeJS.ProcessEnv,
): Promise<LocalAccount> {
  try {
    return await loadSigner(keystore, env, "OPERATOR_PRIVATE_KEY");
  } catch (error) {
    if (error instanceof SignerUsageError) throw new ProviderUsageError(error.message);
    throw error;
  }
}

function offerId(raw: string | undefined): Hex {
  if (raw === undefined || !isHex32(raw))
    throw new ProviderUsageError("an offer id (0x + 64 hex digits) is required");
  return raw;
}

/** An optional Unix-seconds option; a usage error when it is not a non-negative integer. */
function seconds(raw: string | undefined, name: string): number | undefined {
  if (raw === undefined) return undefined;
  if (!/^[0-9]{1,15}$/.test(raw)) throw new ProviderUsageError(`${name} takes Unix seconds`);
  return Number(raw);
}

/**
 * The earnings as lines a person reads: amounts in the model's token units with the symbol, the
 * exact base units beside them.
 */
function earningsText(e: EarningsJson, units: TokenUnits): string[] {
  const amount = (credits: string) => formatAmountExact(BigInt(credits), units);
  const lines = [
    `offer ${e.offer_id}, payout ${e.payout}, charges completed in [${e.from}, ${e.to})`,
    "state          requests  input tokens  output tokens  credits",
  ];
  for (const state of ["unsettled", "settling", "settled", "unsettleable"] as const) {
    const t = e[state];
    lines.push(
      `${state.padEnd(14)} ${String(t.requests).padStart(8)}  ${t.input_tokens.padStart(12)}  ` +
        `${t.output_tokens.padStart(13)}  ${amount(t.credits)}`,
    );
  }
  for (const r of e.unsettleable_reasons)
    lines.push(`  unsettleable: ${r.reason}: ${r.requests} requests, ${amount(r.credits)}`);
  for (const b of e.batches) {
    lines.push(
      `batch ${b.batch_id} ${b.status} tx ${b.tx_hash ?? "-"} settled_at ${b.settled_at ?? "-"}: ` +
        `${b.requests} requests, ${amount(b.credits)}`,
    );
  }
  if (e.batches_truncated) lines.push("(more batches than listed: narrow the window)");
  return lines;
}

/**
 * `gateway provider …`: what an offer operator runs to onboard and check an
 * endpoint. Writes results to `out`; returns the exit code (0 done, 1 the
 * gateway refused, 2 usage).
 */
export async function runProviderCommand(
  args: string[],
  env: NodeJS.ProcessEnv,
  out: CommandOutput,
): Promise<number> {
  const { values, positionals } = parseArgs({
    args,
    allowPositionals: true,
    options: {
      offer: { type: "string" },
      endpoint: { type: "string" },
      "endpoint-token": { type: "string" },
      operator: { type: "string" },
      "key-id": { type: "string" },
      yes: { type: "boolean" },
      ...signingFlags,
      "expires-at": { type: "string" },
      from: { type: "string" },
      to: { type: "string" },
      json: { type: "boolean" },
    },
  });
  const [action, target] = positionals;
  try {
    // Flags win over the environment; both are parsed in one place (src/config.ts).
    const settings = settingsFromFlags(env, values);
    const gateway: GatewayConnection | undefined = parseGatewayClientConfig(settings);
    if (gateway === undefined) {
      throw new ProviderUsageError(
        "set GATEWAY_URL and GATEWAY_API_KEY (or --gateway and --api-key)",
      );
    }
    const operator = values.operator;
    if (operator !== undefined && !isAddress(operator, { strict: false }))
      throw new ProviderUsageError("--operator must be an address (0x + 40 hex digits)");
    const keyId = values["key-id"];
    if (keyId !== undefined && !apiKeyIdPattern.test(keyId))
      throw new ProviderUsageError(
        "--key-id must be an API key's public id (key_..., as 'gateway keys create' printed it)",
      );
    const signing = {
      ...(operator === undefined ? {} : { operator: operator as Address }),
      confirm: confirmOn(out, values.yes === true),
    };
    switch (action) {
      case "register": {
        if (values.endpoint === undefined)
          throw new ProviderUsageError("--endpoint URL is required");
        try {
          canonicalEndpointUrl(values.endpoint);
        } catch (error) {
          if (error instanceof GatewayError)
            throw new ProviderUsageError(`--endpoint: ${error.message}`);
          throw error;
        }
        const offer = offerId(values.offer);
        const signer = await operatorAccount(values.keystore, settings);
        const chain = await signingChain(settings);
        const registered = await registerEndpoint(gateway, {
          offerId: offer,
          endpointUrl: values.endpoint,
          endpointToken: values["endpoint-token"],
          signer,
          chain,
          ...signing,
        });
        out.log(
          `registered an endpoint for offer ${registered.offer_id} (signed by ${signer.address})`,
        );
        out.log(`next: gateway provider verify ${registered.offer_id}`);
        return 0;
      }
      case "health": {
        const health = await offerHealth(gateway, offerId(target));
        out.log(JSON.stringify(health, null, 2));
        return 0;
      }
      case "verify": {
        const { offer, verification } = await verifyOffer(gateway, offerId(target));
        out.log(
          `offer ${offer.offer_id} verified at ${offer.verified_at}, eligible until ${offer.verification_expires_at}`,
        );
        // Inside the bound the gateway ran nothing: say so, or a fixed endpoint looks checked.
        if (verification.replayed) {
          out.log(
            `(the last run's outcome, from ${verification.ran_at}; the checks run again from ${verification.next_run_at})`,
          );
        }
        return 0;
      }
      case "bind-key": {
        const offer = offerId(target);
        const expiresAt = seconds(values["expires-at"], "--expires-at");
        const deployment = pinnedDeployment(settings);
        requirePinsWithoutConfirmation(out, values.yes === true, deployment, "bind-key");
        const signer = await operatorAccount(values.keystore, settings);
        const chain = await signingChain(settings);
        const binding = await bindKey(gateway, {
          offerId: offer,
          signer,
          chain,
          ...signing,
          ...(keyId === undefined ? {} : { keyId }),
          ...(deployment === undefined ? {} : { deployment }),
          ...(expiresAt === undefined ? {} : { expiresAt }),
        });
        out.log(
          `bound API key ${binding.api_key_id} to offer ${binding.offer_id} until ${binding.expires_at} ` +
            `(signed by ${signer.address}); binding ${binding.id}`,
        );
        out.log(`next: gateway provider earnings ${binding.offer_id}`);
        return 0;
      }
      case "earnings": {
        const from = seconds(values.from, "--from");
        const to = seconds(values.to, "--to");
        const earnings = await offerEarnings(gateway, offerId(target), {
          ...(from === undefined ? {} : { from }),
          ...(to === undefined ? {} : { to }),
        });
        if (values.json === true) {
          out.log(JSON.stringify(earnings, null, 2));
          return 0;
        }
        const units = await gatewayModelUnits(gateway, earnings.model_id);
        for (const line of earningsText(earnings, units)) out.log(line);
        return 0;
      }
      default:
        throw new ProviderUsageError(
          action === undefined
            ? "missing provider command"
            : `unknown provider command '${action}'`,
        );
    }
  } catch (error) {
    if (error instanceof ProviderUsageError) {
      out.error(`${error.message}\n\n${providerUsage}`);
      return 2;
    }
    const code = reportClientFailure(error, out, providerUsage);
    if (code !== undefined) return code;
    throw error;
  }
}

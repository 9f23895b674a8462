import { parseArgs } from "node:util";
import { BaseError } from "../errors.js";
import type { Hex, LocalAccount } from "viem";
import { isHex32 } from "../domain/hex.js";
import {
  GatewayRequestError,
  offerHealth,
  registerEndpoint,
  verifyOffer,
  type GatewayConnection,
} from "../provider/client.js";
import { loadSigner, SignerUsageError } from "./signer.js";

export const providerUsage = `usage: gateway provider <command>

  register --offer ID --endpoint URL [--endpoint-token T] [--keystore FILE]
                          sign a registration challenge with the offer operator's key and submit it
                          (the signature covers the endpoint URL and the token's hash: it registers
                          exactly that token, or none)
  health ID               the offer's chain status, liveness and verification
  verify ID               probe the registered endpoint now and refresh its verification

The endpoint URL is the server root (the gateway appends /v1/models and /v1/chat/completions).
Gateway:  GATEWAY_URL and GATEWAY_API_KEY (or --gateway / --api-key)
Operator: OPERATOR_PRIVATE_KEY, or --keystore FILE (an encrypted JSON keystore) with KEYSTORE_PASSWORD`;

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

/**
 * `gateway provider …`: what an offer operator runs to onboard and check an
 * endpoint. Writes results to `out`; returns the exit code (0 done, 1 the
 * gateway refused, 2 usage).
 */
export async function runProviderCommand(
  args: string[],
  env: NodeJS.ProcessEnv,
  out: { log(line: string): void; error(line: string): void },
): Promise<number> {
  const { values, positionals } = parseArgs({
    args,
    allowPositionals: true,
    options: {
      offer: { type: "string" },
      endpoint: { type: "string" },
      "endpoint-token": { type: "string" },
      keystore: { type: "string" },
      gateway: { type: "string" },
      "api-key": { type: "string" },
    },
  });
  const [action, target] = positionals;
  try {
    const baseUrl = values.gateway ?? env.GATEWAY_URL;
    const apiKey = values["api-key"] ?? env.GATEWAY_API_KEY;
    if (baseUrl === undefined || apiKey === undefined) {
      throw new ProviderUsageError(
        "set GATEWAY_URL and GATEWAY_API_KEY (or --gateway and --api-key)",
      );
    }
    const gateway: GatewayConnection = { baseUrl, apiKey };
    switch (action) {
      case "register": {
        if (values.endpoint === undefined)
          throw new ProviderUsageError("--endpoint URL is required");
        const signer = await operatorAccount(values.keystore, env);
        const offer = await registerEndpoint(gateway, {
          offerId: offerId(values.offer),
          endpointUrl: values.endpoint,
          endpointToken: values["endpoint-token"],
          signer,
        });
        out.log(`registered an endpoint for offer ${offer.offer_id} (signed by ${signer.address})`);
        out.log(`next: gateway provider verify ${offer.offer_id}`);
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
    if (error instanceof GatewayRequestError) {
      out.error(`the gateway refused (${error.status} ${error.code}): ${error.message}`);
      return 1;
    }
    throw error;
  }
}

import { parseArgs } from "node:util";
import { BaseError } from "../errors.js";
import { isAddress, type Address, type Hex } from "viem";
import { isHex32 } from "../domain/hex.js";
import { authorizeApiKey, revokeAuthorizationAsPayer } from "../permit/client.js";
import { GatewayRequestError, type GatewayConnection } from "../provider/client.js";
import { isAuditUsageError, runPermitAudit } from "./permit-audit.js";
import { loadSigner, SignerUsageError } from "./signer.js";

export const permitUsage = `usage: gateway permit <command>

  authorize [--permit ID] [--expires-at UNIX_SECONDS] [--payer ADDRESS] [--keystore FILE] [--json]
                          let the API key GATEWAY_API_KEY spend the payer's permits: asks the
                          challenge with that key, signs it as the payer, submits it
                          (no --permit: every permit of the payer; default expiry 30 days)
  revoke ID [--keystore FILE] [--json]
                          revoke authorization ID with the payer's signature (any API key)
  audit PERMIT_ID [--json]
                          check the permit's signed usage receipts against the chain (RPC_URL,
                          MARKET_ADDRESS): exit 0 when the settled receipts add up to what settled

Gateway: GATEWAY_URL and GATEWAY_API_KEY (or --gateway / --api-key)
Payer:   PAYER_PRIVATE_KEY, or --keystore FILE (an encrypted JSON keystore) with KEYSTORE_PASSWORD;
         for a contract wallet (ERC-1271), --payer ADDRESS and a key the wallet accepts`;

class PermitUsageError extends BaseError {
  override readonly name = "PermitUsageError";
  readonly reason = "usage";
}

/**
 * `gateway permit …`: what a payer runs to authorize an API key (or revoke one). Writes results
 * to `out`; returns the exit code (0 done, 1 the gateway refused, 2 usage).
 */
export async function runPermitCommand(
  args: string[],
  env: NodeJS.ProcessEnv,
  out: { log(line: string): void; error(line: string): void },
): Promise<number> {
  try {
    const { values, positionals } = parseArgs({
      args,
      allowPositionals: true,
      options: {
        permit: { type: "string" },
        "expires-at": { type: "string" },
        payer: { type: "string" },
        keystore: { type: "string" },
        gateway: { type: "string" },
        "api-key": { type: "string" },
        json: { type: "boolean" },
      },
    });
    const [action, target] = positionals;
    const baseUrl = values.gateway ?? env.GATEWAY_URL;
    const apiKey = values["api-key"] ?? env.GATEWAY_API_KEY;
    if (baseUrl === undefined || apiKey === undefined) {
      throw new PermitUsageError(
        "set GATEWAY_URL and GATEWAY_API_KEY (or --gateway and --api-key)",
      );
    }
    const gateway: GatewayConnection = { baseUrl, apiKey };
    switch (action) {
      case "authorize": {
        const permitId = values.permit;
        if (permitId !== undefined && !isHex32(permitId))
          throw new PermitUsageError("--permit must be a permit id (0x + 64 hex digits)");
        const expires = values["expires-at"];
        if (expires !== undefined && !/^[1-9]\d{0,15}$/.test(expires))
          throw new PermitUsageError("--expires-at must be Unix seconds");
        if (values.payer !== undefined && !isAddress(values.payer, { strict: false }))
          throw new PermitUsageError("--payer must be an address (0x + 40 hex digits)");
        const signer = await loadSigner(values.keystore, env, "PAYER_PRIVATE_KEY");
        const authorization = await authorizeApiKey(gateway, {
          signer,
          ...(values.payer === undefined ? {} : { payer: values.payer as Address }),
          ...(permitId === undefined ? {} : { permitId: permitId as Hex }),
          ...(expires === undefined ? {} : { expiresAt: Number(expires) }),
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
        if (target === undefined) throw new PermitUsageError("an authorization id is required");
        const signer = await loadSigner(values.keystore, env, "PAYER_PRIVATE_KEY");
        const authorization = await revokeAuthorizationAsPayer(gateway, { id: target, signer });
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
          gateway,
          env,
          out,
        );
      }
      default:
        throw new PermitUsageError(
          action === undefined ? "missing permit command" : `unknown permit command '${action}'`,
        );
    }
  } catch (error) {
    if (
      error instanceof PermitUsageError ||
      error instanceof SignerUsageError ||
      isAuditUsageError(error) ||
      (error as { code?: string }).code?.startsWith("ERR_PARSE_ARGS") === true
    ) {
      out.error(`${(error as Error).message}\n\n${permitUsage}`);
      return 2;
    }
    if (error instanceof GatewayRequestError) {
      out.error(`the gateway refused (${error.status} ${error.code}): ${error.message}`);
      return 1;
    }
    throw error;
  }
}

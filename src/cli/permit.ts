import { MarketRefusedError } from "../adapters/chain/permit-transactions.js";
import { parseGatewayClientConfig } from "../config.js";
import { isHex32 } from "../domain/hex.js";
import type { Hex } from "viem";
import { AmountError } from "./amounts.js";
import { PayerControlUsageError } from "./payer-control.js";
import { isAuditUsageError, runPermitAudit } from "./permit-audit.js";
import {
  gatewayOf,
  parsePermitArgs,
  permitIdArg,
  PermitUsageError,
  WrongChainError,
} from "./permit-args.js";
import { authorize, listAsPayer, revoke } from "./permit-authorize.js";
import {
  balance,
  closePermit,
  finalizePermit,
  open,
  payerChainFacts,
  permitUnitsReader,
} from "./permit-chain.js";
import { reportClientFailure, settingsFromFlags, type CommandOutput } from "./signing.js";
import { SignerUsageError } from "./signer.js";

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
            [--per-request-cap CREDITS] [--period day|week|month --period-cap CREDITS]
            [--warn-at CREDITS] [--tokens] [--key-id KEY_ID] [--payer ADDRESS] [--keystore FILE]
            [--yes] [--json]
                          let the API key GATEWAY_API_KEY spend the payer's permits: builds the
                          AuthorizeKey typed data itself, compares the gateway's challenge with it
                          field by field (any difference: nothing signed, exit 1), shows it, signs
                          as the payer, submits it. No --permit: every permit of the payer;
                          default expiry 30 days, at most 90; caps (they need --permit) in base
                          units (2500000) or token units (2.5tokens, or 2.5 with --tokens: the
                          permit's token's decimals, read from the chain with RPC_URL; a finer
                          fraction is refused), shown in tokens before signing; --period with --period-cap: at
                          most that much per UTC day, week (from Monday) or month; --warn-at: the
                          use (of the period, else in all) from which answers carry a warning
                          (x_gateway.budget_warning); the key id is derived from
                          GATEWAY_API_KEY (--key-id: a key issued before ids were derived, the id
                          'gateway keys create' printed), which the challenge must name
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
         --key/--permit/--all need GATEWAY_URL only (https://, or http:// on loopback).
         authorize, authorizations and revoke --key/--permit/--all sign for a deployment:
         GATEWAY_DEPLOYMENT_ID or --deployment pins it (GET /v1/gateway and the challenge must
         name it); unpinned, GET /v1/gateway's is shown and asked about at a terminal, and
         without a terminal (or with --yes) nothing is sent or signed (exit 2)
Chain:   RPC_URL, MARKET_ADDRESS, and optionally CHAIN_ID, which the RPC must report
         (or --rpc-url / --market / --chain-id); authorize and revoke take CHAIN_ID without
         RPC_URL too: the chain a signature is for is never taken from the gateway
Payer:   PAYER_PRIVATE_KEY, or --keystore FILE (an encrypted JSON keystore) with KEYSTORE_PASSWORD;
         for a contract wallet (ERC-1271), --payer ADDRESS and a key the wallet accepts (authorize)

GATEWAY_URL is https://, or http:// to this machine only (127.0.0.0/8, ::1, localhost); redirects
are not followed. authorize and revoke print what they are about to sign to stderr and, when
stdin is a terminal, ask before signing (--yes: do not ask). A revocation by key, permit or all
applies up to the later of this machine's clock and the gateway's (a warning when they differ),
and what was signed before it and is submitted later is refused.

Exit codes: 0 done, 1 refused (by the gateway or the chain, a challenge that differs from what
was asked for, or not confirmed: nothing signed), 2 usage.`;

type Output = CommandOutput;

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
    const { values, positionals } = parsePermitArgs(args);
    const [action, target, extra] = positionals;
    if (extra !== undefined) throw new PermitUsageError(`unexpected argument '${extra}'`);
    // Flags win over the environment; both are parsed in one place (src/config.ts).
    const settings = settingsFromFlags(env, values);
    // The payer's own calls need GATEWAY_URL only: a key alone is not asked for.
    const payerCall = action === "authorizations" || (action === "revoke" && target === undefined);
    const gateway = payerCall ? undefined : parseGatewayClientConfig(settings);
    /** The chain id and market the payer configured (the RPC's chain id, checked). */
    const payerChain = () => payerChainFacts(settings);
    /** A permit's credit token units, from the market (amounts typed and shown in tokens). */
    const permitUnits = permitUnitsReader(settings);
    switch (action) {
      case "authorizations":
        await listAsPayer(target, values, settings, payerChain, out, permitUnits);
        return 0;
      case "open":
        await open(target, values, settings, gateway, out);
        return 0;
      case "authorize":
        await authorize(values, settings, gateway, out, permitUnits);
        return 0;
      case "revoke":
        await revoke(target, values, settings, gateway, payerChain, out, permitUnits);
        return 0;
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
      case "close":
        await closePermit(target, values, settings, out);
        return 0;
      case "finalize":
        await finalizePermit(target, values, settings, out);
        return 0;
      default:
        throw new PermitUsageError(
          action === undefined ? "missing permit command" : `unknown permit command '${action}'`,
        );
    }
  } catch (error) {
    return report(error, out);
  }
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

/**
 * `gateway permit` on the payer's authorizations of API keys: authorize one, revoke one, and
 * (signed as the payer, without any API key) list them or revoke by key, permit or all.
 */
import type { Address, Hex } from "viem";
import type { GatewayClientConfig } from "../config.js";
import { apiKeyIdPattern } from "../clients/signing-guard.js";
import { GatewayError } from "../domain/errors.js";
import { isHex32 } from "../domain/hex.js";
import {
  anyPermit,
  defaultMaxAuthorizationLifetimeSeconds,
  readCaps,
} from "../domain/permit-authorization/index.js";
import { authorizeApiKey, revokeAuthorizationAsPayer } from "../clients/permit.js";
import type { TokenUnits } from "../domain/token-units.js";
import { parseCredits, parseDuration } from "./amounts.js";
import {
  listAuthorizationsAsPayer,
  revokeAuthorizationsAsPayer,
  type PayerChainFacts,
} from "./payer-control.js";
import {
  expiryFlags,
  gatewayOf,
  payerArg,
  PermitUsageError,
  type PermitFlags,
} from "./permit-args.js";
import {
  confirmOn,
  pinnedDeployment,
  requirePinsWithoutConfirmation,
  signingChain,
  type CommandOutput,
} from "./signing.js";
import { loadSigner } from "./signer.js";

/** `authorizations`: every authorization made for the payer's address, signed as the payer. */
export async function listAsPayer(
  target: string | undefined,
  values: PermitFlags,
  settings: NodeJS.ProcessEnv,
  payerChain: () => Promise<PayerChainFacts>,
  out: CommandOutput,
  permitUnits?: PermitUnits,
): Promise<void> {
  if (target !== undefined) throw new PermitUsageError(`unexpected argument '${target}'`);
  const signer = await loadSigner(values.keystore, settings, "PAYER_PRIVATE_KEY");
  await listAuthorizationsAsPayer(
    {
      signer,
      ...(values.payer === undefined ? {} : { payer: values.payer }),
      json: values.json === true,
      env: settings,
      chain: payerChain,
      ...(permitUnits === undefined ? {} : { units: permitUnits }),
      ...payerPins(values, settings),
    },
    out,
  );
}

/** A permit's credit token units as the market states them (permit-chain.ts). */
export type PermitUnits = (permitId: Hex) => Promise<TokenUnits | undefined>;

/** `authorize`: let the API key spend the payer's permits, signed as the payer. */
export async function authorize(
  values: PermitFlags,
  settings: NodeJS.ProcessEnv,
  gateway: GatewayClientConfig | undefined,
  out: CommandOutput,
  permitUnits?: PermitUnits,
): Promise<void> {
  // The caps may be typed in the permit's token units: its decimals are read from the chain
  // first (the permit id checked before), and shown with the symbol before signing.
  const permitId = permitFlag(values);
  const units =
    permitId === undefined || permitUnits === undefined ? undefined : await permitUnits(permitId);
  const request = authorizeArgs(values, units);
  const connection = gatewayOf(gateway);
  const deployment = pinnedDeployment(settings);
  requirePinsWithoutConfirmation(out, values.yes === true, deployment, "authorize");
  const signer = await loadSigner(values.keystore, settings, "PAYER_PRIVATE_KEY");
  const chain = await signingChain(settings);
  const authorization = await authorizeApiKey(connection, {
    signer,
    chain,
    ...request,
    ...(units === undefined ? {} : { units }),
    ...(deployment === undefined ? {} : { deployment }),
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
}

/**
 * `revoke ID` (one authorization, on the payer's signature) or `revoke --key/--permit/--all`
 * (signed as the payer, without any API key).
 */
export async function revoke(
  target: string | undefined,
  values: PermitFlags,
  settings: NodeJS.ProcessEnv,
  gateway: GatewayClientConfig | undefined,
  payerChain: () => Promise<PayerChainFacts>,
  out: CommandOutput,
  permitUnits?: PermitUnits,
): Promise<void> {
  if (target === undefined) {
    const signer = await loadSigner(values.keystore, settings, "PAYER_PRIVATE_KEY");
    await revokeAuthorizationsAsPayer(
      {
        signer,
        ...(permitUnits === undefined ? {} : { units: permitUnits }),
        ...(values.payer === undefined ? {} : { payer: values.payer }),
        ...(values.key === undefined ? {} : { keyId: values.key }),
        ...(values.permit === undefined ? {} : { permitId: values.permit }),
        all: values.all === true,
        json: values.json === true,
        env: settings,
        chain: payerChain,
        ...payerPins(values, settings),
      },
      out,
    );
    return;
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
}

/**
 * What `authorize` asks for, from its arguments only: the permit, the expiry (in the future, at
 * most 90 days away: gateways refuse more by default, AUTHORIZATION_MAX_EXPIRY_SECONDS), the
 * caps (the domain's rules, src/domain/permit-authorization/checks.ts `readCaps`), the key id.
 */
function permitFlag(values: Record<string, string | boolean | undefined>): Hex | undefined {
  const permitId = values.permit as string | undefined;
  if (permitId !== undefined && !isHex32(permitId))
    throw new PermitUsageError("--permit must be a permit id (0x + 64 hex digits)");
  return permitId?.toLowerCase() as Hex | undefined;
}

/**
 * The caps as typed (`--total-cap`, `--per-request-cap`, `--period-cap`, `--warn-at`): base units
 * (`2500000`), or token units (`2.5tokens`, or any with `--tokens`) in the permit's token's
 * decimals (`units`, read from the chain; unknown: base units only), as signed: base units.
 */
function capArgs(
  values: Record<string, string | boolean | undefined>,
  units: TokenUnits | undefined,
): { totalCap?: string; perRequestCap?: string; periodCap?: string; warnAt?: string } {
  const read = (flag: string) => {
    const text = values[flag] as string | undefined;
    return text === undefined
      ? undefined
      : parseCredits(text, `--${flag}`, units?.decimals, values.tokens === true);
  };
  const caps = {
    totalCap: read("total-cap"),
    perRequestCap: read("per-request-cap"),
    periodCap: read("period-cap"),
    warnAt: read("warn-at"),
  };
  return Object.fromEntries(Object.entries(caps).filter(([, v]) => v !== undefined));
}

function authorizeArgs(
  values: Record<string, string | boolean | undefined>,
  units: TokenUnits | undefined,
): {
  payer?: Address;
  permitId?: Hex;
  expiresAt?: number;
  totalCap?: string;
  perRequestCap?: string;
  period?: string;
  periodCap?: string;
  warnAt?: string;
  keyId?: string;
} {
  const permitId = permitFlag(values);
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
  const { totalCap, perRequestCap, periodCap, warnAt } = capArgs(values, units);
  const period = values.period as string | undefined;
  try {
    readCaps(totalCap, perRequestCap, permitId ?? anyPermit, period, periodCap, warnAt);
  } catch (error) {
    if (error instanceof GatewayError)
      throw new PermitUsageError(
        `${error.message} (--total-cap, --per-request-cap, --period, --period-cap, --warn-at, --permit)`,
      );
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
    ...(permitId === undefined ? {} : { permitId }),
    ...(expiresAt === undefined ? {} : { expiresAt }),
    ...(totalCap === undefined ? {} : { totalCap }),
    ...(perRequestCap === undefined ? {} : { perRequestCap }),
    ...(period === undefined ? {} : { period }),
    ...(periodCap === undefined ? {} : { periodCap }),
    ...(warnAt === undefined ? {} : { warnAt }),
    ...(keyId === undefined ? {} : { keyId }),
  };
}

/** What a payer's control command is told beside its flags: the pinned deployment, `--yes`. */
function payerPins(
  values: PermitFlags,
  settings: NodeJS.ProcessEnv,
): { deployment?: string; yes: boolean } {
  const deployment = pinnedDeployment(settings);
  return { ...(deployment === undefined ? {} : { deployment }), yes: values.yes === true };
}

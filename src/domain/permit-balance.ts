import type { Hex } from "viem";
import { GatewayError } from "./errors.js";
import { isHex32, normalizeHex } from "./hex.js";
import { readPermit, type Permit, type PermitReader, type PermitState } from "./permits.js";

/**
 * A permit's balance (`GET /v1/permits/{id}`, `InferenceService.GetPermit`): what the chain holds
 * for the permit, combined with what the gateway's ledger holds against it. Amounts are bigint
 * base units of the model's credit token; times are Unix seconds.
 */

/** The gateway's ledger of one permit (the `permit_ledgers` row; all zero when there is none). */
export interface PermitLedger {
  /** Held for open requests. */
  readonly reserved: bigint;
  /** Charged for final requests, settled or not (unsettleable ones included). */
  readonly charged: bigint;
  /** The part of `charged` this gateway has settled on chain. */
  readonly settled: bigint;
  /** The part of `charged` that can never settle (it stays counted in `charged`). */
  readonly unsettleable: bigint;
}

/** A zero ledger: a permit the gateway never reserved against. */
export const emptyPermitLedger: PermitLedger = {
  reserved: 0n,
  charged: 0n,
  settled: 0n,
  unsettleable: 0n,
};

/**
 * The credits a permit can still reserve, by the rule `gw_reserve` applies in SQL:
 * `deposit - (charged + max(0, chainSettled - settled)) - reserved`. The charges include what
 * this gateway has settled; settlements on chain that the ledger has not recorded (another
 * gateway's, or one whose record is not written yet) count too. Negative when over-committed
 * (the deposit was read lower than before). Says nothing about the permit's state or expiry.
 */
export function availableCredits(
  ledger: Pick<PermitLedger, "reserved" | "charged" | "settled">,
  deposit: bigint,
  chainSettled: bigint,
): bigint {
  const beyondOurs = chainSettled - ledger.settled;
  return deposit - (ledger.charged + (beyondOurs > 0n ? beyondOurs : 0n)) - ledger.reserved;
}

export interface PermitBalance {
  readonly permitId: Hex;
  readonly state: PermitState;
  readonly modelId: Hex;
  /** The offer the permit is pinned to; undefined when any offer of its model may serve it. */
  readonly offerId: Hex | undefined;
  readonly payer: Hex;
  readonly expiresAt: number;
  /** When the payer may finalise the close; undefined unless closing or closed. */
  readonly closableAt: number | undefined;
  /** Escrowed on chain. */
  readonly deposit: bigint;
  /** Settled on chain (the chain's figure). */
  readonly settled: bigint;
  /** Charged by the gateway and not settled on chain yet, including charges that never will. */
  readonly chargedUnsettled: bigint;
  /** Held for requests in flight. */
  readonly reserved: bigint;
  /** What a request could reserve now: 0 unless the permit is open and unexpired. */
  readonly available: bigint;
}

/**
 * The balance of `permit` (read from the chain) given its `ledger`, at `now` (Unix seconds):
 *
 * - `settled` is the chain's; `chargedUnsettled` is `ledger.charged - ledger.settled`, so a
 *   charge that can no longer settle (its permit closed first, ...) stays in it;
 * - `available` is {@link availableCredits} clamped at 0, and 0 unless the permit is `open` and
 *   `expiresAt > now` (a request could not spend it otherwise);
 * - `closableAt` only for a permit that is closing or closed.
 */
export function permitBalance(permit: Permit, ledger: PermitLedger, now: number): PermitBalance {
  const spendable = permit.state === "open" && permit.expiresAt > now;
  const available = spendable ? availableCredits(ledger, permit.deposit, permit.settled) : 0n;
  return {
    permitId: permit.permitId,
    state: permit.state,
    modelId: permit.modelId,
    offerId: permit.offerId,
    payer: permit.payer,
    expiresAt: permit.expiresAt,
    closableAt: permit.state === "open" ? undefined : permit.closableAt,
    deposit: permit.deposit,
    settled: permit.settled,
    chargedUnsettled: ledger.charged - ledger.settled,
    reserved: ledger.reserved,
    available: available > 0n ? available : 0n,
  };
}

export interface PermitBalanceDeps {
  readonly permits: PermitReader;
  /** The permit's ledger (zeros when it has none). Throws when the database cannot be read. */
  readonly ledger: (permitId: Hex) => Promise<PermitLedger>;
  /** Unix seconds. */
  readonly now: number;
  /** Throws (`permit_not_authorized`) when the caller may not see this permit's ledger. */
  readonly authorize?: (permit: Permit) => void;
}

/**
 * Reads a permit's balance by its id. Throws {@link GatewayError}: `invalid_hex` (not Hex32,
 * nothing read), `chain_unavailable` (the chain cannot be read), `permit_not_found` (the market
 * has no such permit), what `authorize` throws, `database_unavailable` (the ledger cannot be
 * read). The chain is read first, the ledger only for a caller `authorize` lets through.
 */
export async function readPermitBalance(
  permitIdInput: string,
  deps: PermitBalanceDeps,
): Promise<PermitBalance> {
  if (!isHex32(permitIdInput)) {
    throw new GatewayError(
      "invalid_hex",
      "the permit id must be a Hex32 (0x followed by 64 hex digits)",
    );
  }
  const permitId = normalizeHex(permitIdInput);
  // The chain first: who may see the ledger depends on the permit's payer, and a caller who may
  // not costs no database read.
  const permit = await readPermit(deps.permits, permitId);
  deps.authorize?.(permit);
  let ledger: PermitLedger;
  try {
    ledger = await deps.ledger(permitId);
  } catch (err) {
    throw new GatewayError("database_unavailable", "the permit's ledger could not be read", {
      cause: err,
    });
  }
  return permitBalance(permit, ledger, deps.now);
}

import type { Hex } from "viem";
import { GatewayError } from "./errors.js";
import { isHex32, normalizeHex } from "./hex.js";

/**
 * Inference permits: the on-chain authorisation to spend a payer's escrowed credits on one model
 * (DESIGN.md section 2). The chain is the source of truth; the gateway reads a permit live (with
 * a short, bounded cache, see `adapters/chain/permits.ts`) before every chat request and refuses
 * to spend on one that is missing, expired, closing, closed, bound to another model or pinned to
 * another offer. Whether its deposit covers the request is the ledger's question, not this one.
 */

export const permitStates = ["open", "closing", "closed"] as const;
export type PermitState = (typeof permitStates)[number];

/** A permit as the market holds it. Ids are lower-case hex. */
export interface Permit {
  readonly permitId: Hex;
  readonly payer: Hex;
  readonly modelId: Hex;
  /** The one offer the permit may pay; undefined when any offer of the model may (zero on chain). */
  readonly offerId: Hex | undefined;
  /** Credits escrowed when the permit was opened (base units). */
  readonly deposit: bigint;
  /** Credits already settled from the deposit on chain (base units). */
  readonly settled: bigint;
  /** Unix seconds; the permit may not be spent from then on. */
  readonly expiresAt: number;
  readonly state: PermitState;
  /**
   * Unix seconds from which the payer may finalise the close (refund); undefined unless the
   * close was requested (closing or closed; zero on chain).
   */
  readonly closableAt: number | undefined;
}

/** Reads permits from the chain (the chain adapter). */
export interface PermitReader {
  /** The permit, or undefined when the market has none with this id. Throws when the chain cannot be read. */
  get(permitId: Hex): Promise<Permit | undefined>;
  /** Forgets anything cached about the permit, so the next `get` reads the chain. */
  invalidate(permitId: Hex): void;
}

/**
 * The clock a permit's expiry is judged by: the later of the gateway's clock and the latest
 * block time the gateway has seen. `expiresAt` is the chain's time (the market compares it with
 * `block.timestamp`), so a gateway whose clock runs behind the chain's would otherwise admit
 * spending on a permit the chain already holds expired. Block times come from the heads the
 * gateway reads anyway (the indexer's poll), so judging costs no RPC per request; until one is
 * seen, the gateway's clock alone decides. A later clock of the gateway's still wins: a stalled
 * chain (or node) cannot keep a permit spendable past its expiry by the gateway's clock.
 */
export interface PermitClock {
  /** Unix seconds: the later of the gateway's clock and {@link latestBlockTime}. */
  now(): number;
  /**
   * Remembers a block's timestamp (Unix seconds) the gateway has read. Only a later one moves
   * the clock: an older head from a lagging node (or a reorg) does not turn it back.
   */
  observeBlock(timestamp: number): void;
  /** The latest block time seen; undefined before the first. */
  readonly latestBlockTime: number | undefined;
}

export function createPermitClock(clock: () => number): PermitClock {
  let latest: number | undefined;
  return {
    now() {
      const own = clock();
      return latest !== undefined && latest > own ? latest : own;
    },
    observeBlock(timestamp) {
      if (Number.isFinite(timestamp) && (latest === undefined || timestamp > latest))
        latest = timestamp;
    },
    get latestBlockTime() {
      return latest;
    },
  };
}

/** The offer a permit is pinned to, or undefined when any offer of its model may serve it. */
export function permitOfferPin(permit: Permit): Hex | undefined {
  return permit.offerId;
}

/**
 * Reads a permit from the chain, for every caller that needs one to exist (the chat path, a
 * permit's balance, its receipts). Throws {@link GatewayError}: `chain_unavailable` when the
 * chain cannot be read (fail closed; the reader's own `chain_unavailable` passes unchanged),
 * `permit_not_found` when the market has no permit `permitId` (lower-case Hex32).
 */
export async function readPermit(reader: PermitReader, permitId: Hex): Promise<Permit> {
  let permit: Permit | undefined;
  try {
    permit = await reader.get(permitId);
  } catch (err) {
    if (err instanceof GatewayError && err.code === "chain_unavailable") throw err;
    throw new GatewayError("chain_unavailable", "the permit could not be read from the chain", {
      cause: err,
    });
  }
  if (permit === undefined) {
    throw new GatewayError("permit_not_found", `permit ${permitId} does not exist`);
  }
  return permit;
}

/**
 * Checks the `X-Gateway-Permit` header against the chain for a request on `modelId`, and returns
 * the permit. Throws {@link GatewayError}, checking in this order:
 * `permit_missing` (no header), `invalid_hex` (not Hex32), `chain_unavailable` (the chain cannot
 * be read: fail closed), `permit_not_found`, `permit_closed`, `permit_closing`, `permit_expired`
 * (`expiresAt <= now`, Unix seconds: pass {@link PermitClock.now}, so the chain's time counts),
 * `permit_model_mismatch`, and `permit_offer_mismatch` when
 * the permit is pinned to an offer and the request is pinned (`pinnedOfferId`, by its `offer`
 * field or its quote) to another. A pinned permit with an unpinned request is fine: routing then
 * only considers the permit's offer.
 */
export async function checkPermit(
  header: string | undefined,
  reader: PermitReader,
  ctx: { modelId: Hex; pinnedOfferId?: Hex | undefined; now: number },
): Promise<Permit> {
  if (header === undefined || header.trim() === "") {
    throw new GatewayError("permit_missing", "the X-Gateway-Permit header is required");
  }
  const value = header.trim();
  if (!isHex32(value)) {
    throw new GatewayError(
      "invalid_hex",
      "X-Gateway-Permit must be a Hex32 permit id (0x followed by 64 hex digits)",
    );
  }
  const permitId = normalizeHex(value);
  const permit = await readPermit(reader, permitId);
  if (permit.state === "closed") {
    throw new GatewayError("permit_closed", `permit ${permitId} is closed`);
  }
  if (permit.state === "closing") {
    throw new GatewayError(
      "permit_closing",
      `permit ${permitId} is closing and can no longer be spent`,
    );
  }
  if (permit.expiresAt <= ctx.now) {
    throw new GatewayError("permit_expired", `permit ${permitId} has expired`);
  }
  if (normalizeHex(permit.modelId) !== normalizeHex(ctx.modelId)) {
    throw new GatewayError(
      "permit_model_mismatch",
      `permit ${permitId} is bound to another model (${permit.modelId})`,
    );
  }
  const pin = permitOfferPin(permit);
  if (
    pin !== undefined &&
    ctx.pinnedOfferId !== undefined &&
    normalizeHex(pin) !== normalizeHex(ctx.pinnedOfferId)
  ) {
    throw new GatewayError(
      "permit_offer_mismatch",
      `permit ${permitId} is pinned to offer ${pin}, not ${normalizeHex(ctx.pinnedOfferId)}`,
    );
  }
  return permit;
}

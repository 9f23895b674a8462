import { zeroAddress, zeroHash, type Address, type Hex, type PublicClient } from "viem";
import { GatewayError } from "../../domain/errors.js";
import { normalizeHex } from "../../domain/hex.js";
import { permitStates, type Permit, type PermitReader } from "../../domain/permits.js";
import { marketAbi } from "../../../gen/contracts/artifacts.js";
import { setBounded } from "../../domain/bounded-cache.js";

export interface ChainPermitReaderOptions {
  readonly client: PublicClient;
  readonly market: Address;
  /** How old a cached read may be when it is served (default 2000 ms). 0 disables the cache. */
  readonly maxStalenessMs?: number;
  /**
   * How long "no such permit" is remembered (default: the smaller of 500 ms and
   * `maxStalenessMs`). Short, because a payer typically opens a permit and uses it at once; the
   * indexer's invalidation on `PermitOpened` usually clears it sooner.
   */
  readonly notFoundTtlMs?: number;
  /** Most permits cached at once; the oldest entry goes first (default 10 000). */
  readonly maxEntries?: number;
  /** Milliseconds clock for the cache, for tests (default `Date.now`). */
  readonly now?: () => number;
}

interface Entry {
  readonly permit: Permit | undefined;
  /** When the read that produced it was sent: its age counts from the chain state it saw. */
  readonly readAt: number;
}

export interface ChainPermitReader extends PermitReader {
  /** Entries currently cached (for metrics and tests). */
  readonly size: number;
}

/**
 * Permits read live from the market's `getPermit`, behind a short cache.
 *
 * - Concurrent reads of one permit share one in-flight call; reads of different permits made in
 *   the same tick go out as one JSON-RPC batch when the client's transport batches
 *   (`http(url, { batch: true })`).
 * - A result is served for at most `maxStalenessMs` after its read was sent; an unknown permit
 *   for at most `notFoundTtlMs`. `invalidate` (called by the indexer on the market's
 *   `Permit*` and `ChargeSettled` events, and by the settlement flusher for the permits of a
 *   batch it records settled) drops the entry at once, and a read already in flight
 *   when it is called does not repopulate the cache, since it may predate the event.
 * - Failures are never cached: each `get` after one asks the chain again. They are thrown as
 *   `chain_unavailable`, so the request fails closed.
 * - At most `maxEntries` permits are held; the oldest is evicted first.
 */
export function createChainPermitReader(opts: ChainPermitReaderOptions): ChainPermitReader {
  const { client, market } = opts;
  const maxStalenessMs = opts.maxStalenessMs ?? 2000;
  const notFoundTtlMs = opts.notFoundTtlMs ?? Math.min(500, maxStalenessMs);
  const maxEntries = opts.maxEntries ?? 10_000;
  const now = opts.now ?? Date.now;
  if (maxStalenessMs < 0 || notFoundTtlMs < 0 || maxEntries < 1) {
    throw new RangeError("permit cache limits must not be negative and maxEntries at least 1");
  }

  // Map iteration order is insertion order: the first key is the oldest entry.
  const cache = new Map<Hex, Entry>();
  // The read in flight per permit. `invalidate` removes it, so a read that started before the
  // event neither serves later callers nor stores its (possibly older) result.
  const inFlight = new Map<
    Hex,
    { readonly token: object; readonly promise: Promise<Permit | undefined> }
  >();

  const store = (permitId: Hex, entry: Entry): void => {
    setBounded(cache, permitId, entry, maxEntries);
  };

  const readThrough = async (permitId: Hex, token: object): Promise<Permit | undefined> => {
    const current = (): boolean => inFlight.get(permitId)?.token === token;
    const readAt = now();
    try {
      const raw = await client.readContract({
        address: market,
        abi: marketAbi,
        functionName: "getPermit",
        args: [permitId],
      });
      const permit = toPermit(permitId, raw);
      if (current()) store(permitId, { permit, readAt });
      return permit;
    } catch (err) {
      throw new GatewayError("chain_unavailable", "the permit could not be read from the chain", {
        cause: err,
      });
    } finally {
      if (current()) inFlight.delete(permitId);
    }
  };

  return {
    get size() {
      return cache.size;
    },

    get(permitIdInput: Hex): Promise<Permit | undefined> {
      const permitId = normalizeHex(permitIdInput);
      const entry = cache.get(permitId);
      if (entry !== undefined) {
        const ttl = entry.permit === undefined ? notFoundTtlMs : maxStalenessMs;
        if (now() - entry.readAt < ttl) return Promise.resolve(entry.permit);
        cache.delete(permitId);
      }
      const pending = inFlight.get(permitId);
      if (pending !== undefined) return pending.promise;
      const token = {};
      // Registered before the read starts, so even a synchronous failure finds its own entry.
      const promise = Promise.resolve().then(() => readThrough(permitId, token));
      inFlight.set(permitId, { token, promise });
      return promise;
    },

    invalidate(permitIdInput: Hex): void {
      const permitId = normalizeHex(permitIdInput);
      cache.delete(permitId);
      inFlight.delete(permitId);
    },
  };
}

type RawPermit = {
  payer: Address;
  modelId: Hex;
  offerId: Hex;
  deposit: bigint;
  settled: bigint;
  expiresAt: bigint;
  state: number;
  closableAt: bigint;
};

/** The market answers an unknown id with a zeroed struct (state None, no payer). */
function toPermit(permitId: Hex, raw: RawPermit): Permit | undefined {
  if (raw.state === 0 || raw.payer === zeroAddress) return undefined;
  const state = permitStates[raw.state - 1];
  if (state === undefined) throw new Error(`permit ${permitId} has unknown state ${raw.state}`);
  return {
    permitId,
    payer: normalizeHex(raw.payer),
    modelId: normalizeHex(raw.modelId),
    offerId: raw.offerId === zeroHash ? undefined : normalizeHex(raw.offerId),
    deposit: raw.deposit,
    settled: raw.settled,
    expiresAt: seconds(raw.expiresAt),
    state,
    // Zero until the payer requests the close.
    closableAt: state === "open" || raw.closableAt === 0n ? undefined : seconds(raw.closableAt),
  };
}

/** uint64 seconds; beyond 2^53 is "never" for any clock this gateway will run on. */
function seconds(value: bigint): number {
  return value > BigInt(Number.MAX_SAFE_INTEGER) ? Number.MAX_SAFE_INTEGER : Number(value);
}

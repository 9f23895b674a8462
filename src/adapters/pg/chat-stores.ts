import type pg from "pg";
import type { Hex } from "viem";
import type { Ledger, QuoteRecord, QuoteStore } from "../../domain/chat/index.js";
import type { WakeFeeClaimer } from "../../domain/chat/wake-fees.js";
import { claimWakeFee } from "./endpoint-health.js";
import * as ledger from "./ledger/index.js";
import { getQuote, insertQuote } from "./quotes.js";

/**
 * The chat pipeline's stores on PostgreSQL (src/domain/chat/ports.ts): the per-request ledger,
 * the quotes and the wake-fee claim. The composition root builds each once.
 */

/**
 * The reservation ledger, one transaction per call: reservations and finalisations that arrive
 * together share one transaction (group commit, migration 006); unloaded, each still goes at
 * once. Bounded: behind a hung batch, a request fails closed in time (503, no upstream call).
 */
export function createPgLedger(
  pool: pg.Pool,
  options: {
    readonly instanceId: string;
    readonly maxQueued: number;
    readonly maxWaitMs: number;
  },
): Ledger {
  const { instanceId } = options;
  const batcher = ledger.createLedgerBatcher(pool, {
    maxQueued: options.maxQueued,
    maxWaitMs: options.maxWaitMs,
  });
  return {
    reserve: (input) => batcher.reserve({ ...input, instanceId }),
    markStreaming: (requestId) => ledger.markStreaming(pool, requestId),
    finalize: (input) => batcher.finalize(input),
    voidReservation: (reservation, close) =>
      ledger.voidReservation(pool, { ...reservation, instanceId }, close),
    switchOffer: (input) => ledger.switchOffer(pool, input),
    recordOfferFlag: (input) => ledger.recordOfferFlag(pool, input),
  };
}

/** Quotes, as issued and used (migration 003). */
export function createPgQuoteStore(pool: pg.Pool): QuoteStore {
  return {
    insert: (quote) => insertQuote(pool, quote),
    get: async (quoteId: Hex) => (await getQuote(pool, quoteId)) as QuoteRecord | undefined,
  };
}

/** Claimed on the endpoint's row: one request per offer per window, fleet-wide (migration 025). */
export function createPgWakeFeeClaimer(pool: pg.Pool): WakeFeeClaimer {
  return (offerId, now, windowSeconds) => claimWakeFee(pool, offerId, now, windowSeconds);
}

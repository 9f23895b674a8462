import { randomBytes } from "node:crypto";
import type { Hex } from "viem";
import type pg from "pg";
import type { FinalizeInput, ReserveInput } from "../../src/adapters/pg/ledger/index.js";
import type { NewQuote } from "../../src/adapters/pg/quotes.js";

// Fixtures of the ledger suites: reservations with their own internal quote and completions,
// with fresh random ids so tests sharing a database never meet.

export const NOW = 1_700_000_000;

export function hex32(): Hex {
  return `0x${randomBytes(32).toString("hex")}`;
}

export function id(prefix: string): string {
  return `${prefix}_${randomBytes(8).toString("hex")}`;
}

export function newQuote(overrides: Partial<NewQuote> = {}): NewQuote {
  return {
    quoteId: id("qt"),
    apiKeyId: "key_a",
    model: "org/model",
    modelId: hex32(),
    offerId: hex32(),
    tariffVersion: 1n,
    inputTokens: 100n,
    maxOutputTokens: 200n,
    wakesEndpoint: false,
    maximumCredits: 1_000n,
    fingerprint: "f".repeat(64),
    createdAt: NOW,
    expiresAt: NOW + 60,
    internal: true,
    ...overrides,
  };
}

/** A reservation with its own internal quote; `permitId`/`offerId` shared through overrides. */
export function reservation(overrides: Partial<ReserveInput> = {}): ReserveInput {
  const requestId = overrides.requestId ?? id("req");
  const offerId = overrides.offerId ?? hex32();
  const maximumCredits = overrides.maximumCredits ?? 1_000n;
  const quote = newQuote({ offerId, maximumCredits });
  return {
    requestId,
    apiKeyId: "key_a",
    instanceId: "instance_live",
    model: "org/model",
    modelId: quote.modelId,
    offerId,
    permitId: hex32(),
    quoteId: quote.quoteId,
    stream: false,
    maximumCredits,
    tariffVersion: 1n,
    inputTokens: 100n,
    deposit: 10_000n,
    chainSettled: 0n,
    maxConcurrency: 100,
    createdAt: NOW,
    quote,
    ...overrides,
  };
}

export function completion(requestId: string, creditsCharged: bigint): FinalizeInput {
  return {
    requestId,
    status: "completed",
    inputTokens: 90n,
    outputTokens: 150n,
    creditsCharged,
    billing: "billed",
    usageSource: "provider",
    now: NOW + 5,
  };
}

/** Requests in flight on an offer, as the ledger counts them (0 when it has no row yet). */
export async function offerInFlight(db: Pick<pg.Pool, "query">, offerId: Hex): Promise<number> {
  const { rows } = await db.query<{ in_flight: number }>(
    "SELECT in_flight FROM offer_loads WHERE offer_id = $1",
    [offerId.toLowerCase()],
  );
  return rows[0]?.in_flight ?? 0;
}

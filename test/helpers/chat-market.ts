import type { Hex } from "viem";
import {
  createCatalog,
  ModelDirectory,
  type Catalog,
  type ModelRecord,
  type OfferRecord,
} from "../../src/domain/catalog.js";
import type { UpstreamReply } from "../../src/domain/chat/index.js";
import {
  createKeyAuthorities,
  type SpendingAuthority,
} from "../../src/domain/permit-authorization/index.js";
import type { Permit } from "../../src/domain/permits.js";
import { flowFromEvents } from "./upstream-flow.js";

/** One model `m`, its offers and an open permit, for the chat domain's in-memory tests. */

export const modelId = `0x${"11".repeat(32)}` as Hex;
export const permitId = `0x${"33".repeat(32)}` as Hex;
export const offerA = `0x${"0a".repeat(32)}` as Hex;
export const offerB = `0x${"0b".repeat(32)}` as Hex;
export const now = 1_800_000_000;
export const payer = `0x${"05".repeat(20)}` as Hex;

/**
 * What API key "key" may spend: the test permit, as its payer authorized (DESIGN.md section 8),
 * held the way the gateway holds a key's authorizations.
 */
export const payerAuthority: SpendingAuthority = createKeyAuthorities({ ttlMs: 60_000 }).load(
  "key",
  [
    {
      id: "pauth_000000000000000000000001",
      apiKeyId: "key",
      payer,
      permitId,
      expiresAt: now + 3600,
      issuedAt: now,
      totalCap: 0n,
      perRequestCap: 0n,
      period: "",
      periodCap: 0n,
      warnAt: 0n,
      createdAt: now,
      revokedAt: null,
      revokedBy: null,
    },
  ],
  0,
);

export function testModel(activeOffers: number): ModelRecord {
  return {
    modelId,
    creator: `0x${"01".repeat(20)}`,
    creditToken: `0x${"02".repeat(20)}`,
    repository: "r",
    revision: "v1",
    task: "chat",
    poolId: `0x${"03".repeat(32)}`,
    positionTokenId: 1n,
    status: "active",
    activeOffers,
  };
}

/** An active, verified, running offer of the test model; `overrides` for what a test varies. */
export function testOffer(offerId: Hex, overrides: Partial<OfferRecord> = {}): OfferRecord {
  return {
    offerId,
    modelId,
    owner: `0x${"04".repeat(20)}`,
    operator: `0x${"04".repeat(20)}`,
    payout: `0x${"04".repeat(20)}`,
    status: "active",
    tariff: { version: 1n, inputPricePerMTok: 1n, outputPricePerMTok: 1n, wakeFee: 0n },
    region: "eu",
    hardware: "cpu",
    maxConcurrency: 8,
    capabilities: { max_output_tokens: 16 },
    verifiedAt: now - 10,
    verificationExpiresAt: now + 1000,
    endpointRegistered: true,
    endpointRunning: true,
    inFlight: 0,
    ...overrides,
  };
}

export function testPermit(deposit: bigint = 10n ** 18n): Permit {
  return {
    permitId,
    payer,
    modelId,
    offerId: undefined,
    deposit,
    settled: 0n,
    expiresAt: now + 1000,
    state: "open",
    closableAt: undefined,
  };
}

/** A catalog of the test model with `offers` (read fresh on every request). */
export function testCatalog(offers: () => OfferRecord[]): Catalog {
  const model = testModel(offers().length);
  return createCatalog({
    directory: new ModelDirectory([{ id: "m", modelId, aliases: [] }]),
    store: {
      listModels: async () => [model],
      getModel: async () => model,
      listOffers: async () => offers(),
      getOffer: async () => undefined,
    },
  });
}

export function upstreamReply(
  status: number,
  text: () => Promise<string>,
  events: () => AsyncGenerator<string, void, undefined> = async function* () {},
): UpstreamReply {
  return {
    status,
    text,
    stream: (into) => flowFromEvents(events(), into),
    discard: async () => undefined,
  };
}

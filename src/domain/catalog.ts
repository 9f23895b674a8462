import type { Hex } from "viem";
import { GatewayError } from "./errors.js";
import { isHex32, normalizeHex } from "./hex.js";
import type { OfferFeature } from "./offer-features.js";
import { createTtlCache } from "./ttl-cache.js";

export const modelStatuses = ["pending", "active", "paused", "retired"] as const;
export type ModelStatus = (typeof modelStatuses)[number];
export const offerStatuses = ["active", "paused", "retired"] as const;
export type OfferStatus = (typeof offerStatuses)[number];

export type JsonValue =
  string | number | boolean | null | JsonValue[] | { [key: string]: JsonValue };

/** A model as indexed from the chain. */
export interface ModelRecord {
  readonly modelId: Hex;
  readonly creator: Hex;
  readonly creditToken: Hex;
  readonly repository: string;
  readonly revision: string;
  readonly task: string;
  readonly poolId: Hex;
  readonly positionTokenId: bigint;
  readonly status: ModelStatus;
  /** Active offers of this model (the spec's provider_count). */
  readonly activeOffers: number;
  /**
   * Set when the chain states a value the catalog cannot hold (see docs/decisions/catalog-and-indexing.md,
   * "Quarantine"): the model is stored with neutral values and nothing of it is routed to.
   */
  readonly quarantineReason?: string | undefined;
}

export interface Tariff {
  readonly version: bigint;
  readonly inputPricePerMTok: bigint;
  readonly outputPricePerMTok: bigint;
  readonly wakeFee: bigint;
}

/** An offer as indexed from the chain, with the gateway's verification state. */
export interface OfferRecord {
  readonly offerId: Hex;
  readonly modelId: Hex;
  readonly owner: Hex;
  readonly operator: Hex;
  readonly payout: Hex;
  readonly status: OfferStatus;
  readonly tariff: Tariff;
  readonly region: string;
  readonly hardware: string;
  readonly maxConcurrency: number;
  readonly capabilities: { [key: string]: JsonValue };
  readonly verifiedAt: number | undefined;
  readonly verificationExpiresAt: number | undefined;
  /** A provider endpoint is registered for the offer (through a signed challenge). */
  readonly endpointRegistered: boolean;
  /** The prober's last verdict on the endpoint (undefined: never probed). */
  readonly endpointRunning: boolean | undefined;
  /**
   * Features the endpoint's last successful verification proved (`provider.require_parameters`);
   * absent: none.
   */
  readonly verifiedFeatures?: readonly OfferFeature[] | undefined;
  /** Requests in flight on the offer, across all gateway processes. */
  readonly inFlight: number;
  /**
   * Set when the offer (or its model: `model_quarantined`) is quarantined: the chain states a
   * value the catalog cannot hold. A quarantined offer is never eligible.
   */
  readonly quarantineReason?: string | undefined;
}

/**
 * Whether chat may be routed to an offer at `now` (Unix seconds): the offer
 * and its model are active and not quarantined, an endpoint is registered, and
 * its verification has not lapsed. Capacity and pins are checked by routing on
 * top of this.
 */
export function isEligible(
  offer: OfferRecord,
  model: Pick<ModelRecord, "status" | "quarantineReason">,
  now: number,
): boolean {
  return (
    offer.quarantineReason === undefined &&
    model.quarantineReason === undefined &&
    offer.status === "active" &&
    model.status === "active" &&
    offer.endpointRegistered &&
    offer.verifiedAt !== undefined &&
    offer.verificationExpiresAt !== undefined &&
    offer.verificationExpiresAt > now
  );
}

/** Read side of the indexed market (PostgreSQL in production). */
export interface CatalogStore {
  listModels(status?: ModelStatus): Promise<ModelRecord[]>;
  getModel(modelId: Hex): Promise<ModelRecord | undefined>;
  listOffers(modelId: Hex, status?: OfferStatus): Promise<OfferRecord[]>;
  getOffer(offerId: Hex): Promise<OfferRecord | undefined>;
}

/** One entry of the catalog file: the public id and aliases of a ModelID. */
export interface CatalogEntry {
  readonly id: string;
  readonly modelId: Hex;
  readonly aliases: readonly string[];
}

/**
 * Public names of models. A model without a catalog entry is known by its
 * ModelID. Names are matched exactly; ModelIDs in any hex case.
 */
export class ModelDirectory {
  readonly #byModelId = new Map<Hex, CatalogEntry>();
  readonly #byName = new Map<string, Hex>();

  constructor(entries: readonly CatalogEntry[] = []) {
    for (const entry of entries) {
      const modelId = normalizeHex(entry.modelId);
      if (this.#byModelId.has(modelId)) throw new Error(`catalog lists model ${modelId} twice`);
      this.#byModelId.set(modelId, { ...entry, modelId });
      for (const name of [entry.id, ...entry.aliases]) {
        if (isHex32(name)) throw new Error(`catalog name "${name}" looks like a ModelID`);
        if (this.#byName.has(name)) throw new Error(`catalog name "${name}" is used twice`);
        this.#byName.set(name, modelId);
      }
    }
  }

  publicId(modelId: Hex): string {
    return this.#byModelId.get(modelId)?.id ?? modelId;
  }

  aliases(modelId: Hex): readonly string[] {
    return this.#byModelId.get(modelId)?.aliases ?? [];
  }

  /** The ModelID a public id, alias or ModelID names, if any. */
  resolve(ref: string): Hex | undefined {
    if (isHex32(ref)) return normalizeHex(ref);
    return this.#byName.get(ref);
  }
}

/** A model and its offers, as routing reads them. */
export interface RoutingView {
  readonly model: ModelRecord;
  readonly offers: readonly OfferRecord[];
}

export interface Catalog {
  readonly directory: ModelDirectory;
  /**
   * The model a request names and its offers, for routing. Served from a short-lived cache
   * (`routingCacheMs`): a chat request is the hot path, and a change on chain reaches routing
   * at most that much later (this process drops the cache at once on changes it makes or sees).
   */
  routingView(ref: string): Promise<RoutingView>;
  /** Drops the routing cache (after indexing, registration or verification). */
  invalidate(): void;
  listModels(status?: ModelStatus): Promise<ModelRecord[]>;
  /** Throws `model_not_found` for an unknown reference. */
  getModel(ref: string): Promise<ModelRecord>;
  listOffers(ref: string, status?: OfferStatus): Promise<OfferRecord[]>;
  getOffer(offerId: Hex): Promise<OfferRecord | undefined>;
}

export function createCatalog(deps: {
  store: CatalogStore;
  directory: ModelDirectory;
  /** How long a routing view is reused; 0 disables the cache. */
  routingCacheMs?: number;
  /** Milliseconds (tests inject a clock). */
  now?: () => number;
}): Catalog {
  const { store, directory } = deps;
  const routingCacheMs = deps.routingCacheMs ?? 0;
  const now = deps.now ?? Date.now;
  const views = createTtlCache<Hex, Promise<RoutingView>>({ ttlMs: routingCacheMs, now });
  const getModel = async (ref: string): Promise<ModelRecord> => {
    const modelId = directory.resolve(ref);
    const model = modelId === undefined ? undefined : await store.getModel(modelId);
    if (model === undefined) {
      throw new GatewayError("model_not_found", `model '${ref.slice(0, 200)}' does not exist`);
    }
    return model;
  };
  return {
    directory,
    async routingView(ref) {
      const modelId = directory.resolve(ref);
      const cached = modelId === undefined ? undefined : views.get(modelId);
      if (cached !== undefined) return cached;
      const view = (async () => {
        const model = await getModel(ref);
        return { model, offers: await store.listOffers(model.modelId) };
      })();
      if (modelId !== undefined) {
        views.set(modelId, view);
        // A failed read is not reused.
        view.catch(() => views.delete(modelId));
      }
      return view;
    },
    invalidate: () => views.clear(),
    listModels: (status) => store.listModels(status),
    getModel,
    async listOffers(ref, status) {
      const model = await getModel(ref);
      return store.listOffers(model.modelId, status);
    },
    getOffer: (offerId) => store.getOffer(normalizeHex(offerId)),
  };
}

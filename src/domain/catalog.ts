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
  /**
   * The credit token's decimals and symbol as its contract answered them (read once per token by
   * the indexer, migration 040): absent while unread or when the token answered nothing the
   * gateway shows (src/domain/token-units.ts); amounts stay in base units everywhere but the
   * text a person reads.
   */
  readonly creditTokenDecimals?: number | undefined;
  readonly creditTokenSymbol?: string | undefined;
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
  /**
   * How the gateway meters the model's tokens (its tokenizer by repository and revision, or the
   * byte bound): set by the catalog ({@link Catalog}) on every model it returns; absent from a
   * store's row, where it means bound.
   */
  readonly metering?: Metering | undefined;
  /**
   * Set on a routing view ({@link Catalog.routingView}) while the model's tokenizer is still
   * loading: none of its offers is routable until it is loaded (a request never waits on a load).
   */
  readonly tokenizerLoading?: boolean | undefined;
}

export interface Tariff {
  readonly version: bigint;
  readonly inputPricePerMTok: bigint;
  readonly outputPricePerMTok: bigint;
  readonly wakeFee: bigint;
  /**
   * Reasoning the client never saw may be charged up to this many times the visible output, on a
   * model that hides its reasoning (src/domain/chat/usage.ts `reasoningPolicyOf`, capped by
   * `HIDDEN_REASONING_RATIO_MAX`). A priced term of the version: read from the offer's
   * `capabilities.hidden_reasoning_ratio` when the gateway records the version, and kept while
   * the version stands (migration 032), so a quote, bound to the version, binds it too. Absent: 0.
   */
  readonly hiddenReasoningRatio?: bigint | undefined;
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
  /** How a model is metered (the token counters' word; bound without them). */
  metering(model: ModelRef): Metering;
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
  /** The offers of a model already read (no second read of the model). */
  offersOf(model: ModelRecord, status?: OfferStatus): Promise<OfferRecord[]>;
  getOffer(offerId: Hex): Promise<OfferRecord | undefined>;
}

/**
 * How a model is metered: tokens.ts's `Metering`, restated, because the token port sits above
 * the catalog (it reads chat requests, which read the catalog's types).
 */
export type Metering =
  { readonly kind: "exact"; readonly tokenizer: string } | { readonly kind: "bound" };

/** A model as the token counters name it (tokens.ts's `ModelRef`). */
type ModelRef = Pick<ModelRecord, "repository" | "revision">;

/**
 * What the catalog asks of the token counters (tokens.ts's `TokenCounters`): how a model is
 * metered, and whether its counter is ready (`forModel` is undefined while its tokenizer loads).
 */
export interface CatalogMeter {
  forModel(model: ModelRef): object | undefined;
  meteringOf(model: ModelRef): Metering;
}

const bound: Metering = { kind: "bound" };

export function createCatalog(deps: {
  store: CatalogStore;
  directory: ModelDirectory;
  /** How long a routing view is reused; 0 disables the cache. */
  routingCacheMs?: number;
  /** Milliseconds (tests inject a clock). */
  now?: () => number;
  /**
   * The token counters: how each model is metered, and whether its tokenizer is loaded (a model
   * whose tokenizer loads is listed, but not routable). Absent: every model is metered by the
   * byte bound and routable.
   */
  tokens?: CatalogMeter | undefined;
}): Catalog {
  const { store, directory, tokens } = deps;
  const metering = (model: ModelRef): Metering => tokens?.meteringOf(model) ?? bound;
  const metered = (model: ModelRecord): ModelRecord => ({ ...model, metering: metering(model) });
  const routingCacheMs = deps.routingCacheMs ?? 0;
  const now = deps.now ?? Date.now;
  const views = createTtlCache<Hex, Promise<RoutingView>>({ ttlMs: routingCacheMs, now });
  const getModel = async (ref: string): Promise<ModelRecord> => {
    const modelId = directory.resolve(ref);
    const model = modelId === undefined ? undefined : await store.getModel(modelId);
    if (model === undefined) {
      throw new GatewayError("model_not_found", `model '${ref.slice(0, 200)}' does not exist`);
    }
    return metered(model);
  };
  // A cached view holds what the store said; whether the model's tokenizer is loaded is asked
  // on every use (a map lookup), so a model becomes routable as soon as its load ends.
  const routable = async (view: Promise<RoutingView>): Promise<RoutingView> => {
    const read = await view;
    if (tokens === undefined || tokens.forModel(read.model) !== undefined) return read;
    return { model: { ...read.model, tokenizerLoading: true }, offers: read.offers };
  };
  return {
    directory,
    metering,
    routingView(ref) {
      const modelId = directory.resolve(ref);
      const cached = modelId === undefined ? undefined : views.get(modelId);
      if (cached !== undefined) return routable(cached);
      const view = (async () => {
        const model = await getModel(ref);
        return { model, offers: await store.listOffers(model.modelId) };
      })();
      if (modelId !== undefined) {
        views.set(modelId, view);
        // A failed read is not reused.
        view.catch(() => views.delete(modelId));
      }
      return routable(view);
    },
    invalidate: () => views.clear(),
    listModels: async (status) => (await store.listModels(status)).map(metered),
    getModel,
    async listOffers(ref, status) {
      const model = await getModel(ref);
      return store.listOffers(model.modelId, status);
    },
    offersOf: (model, status) => store.listOffers(model.modelId, status),
    getOffer: (offerId) => store.getOffer(normalizeHex(offerId)),
  };
}

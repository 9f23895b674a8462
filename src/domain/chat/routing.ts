import type { Hex } from "viem";
import { isEligible, type ModelRecord, type OfferRecord } from "../catalog.js";
import {
  inputTokenUpperBound,
  outputBound,
  outputLimit,
  type ChatRequest,
} from "./request/index.js";
import { GatewayError } from "../errors.js";
import { maximumCredits } from "../pricing.js";
import type { OfferFeature } from "../offer-features.js";
import type { ProviderPreferences } from "../provider-preferences.js";
import { isModelMismatch, modelMismatch } from "../audits/standing.js";
import type { AuditState } from "../audits/types.js";
import { coolingDown } from "../reputation/cooldowns.js";
import { isDivergenceFlagged } from "../reputation/divergence.js";
import { isFailing } from "../reputation/reputation.js";
import type { OfferMeasurement } from "../reputation/measurement-types.js";

/** A candidate offer with what a request would cost on it. */
export interface Candidate {
  readonly offer: OfferRecord;
  readonly wakes: boolean;
  readonly inputTokens: bigint;
  /** The output limit on this offer: the most output tokens of each choice (request/quote.ts). */
  readonly outputLimit: bigint;
  /** The output bound: the output limit times the request's `n`, what is priced. */
  readonly maxOutputTokens: bigint;
  readonly maximumCredits: bigint;
}

/** An endpoint the prober last saw down is sleeping: calling it wakes it (and costs the wake fee). */
function wakes(offer: OfferRecord): boolean {
  return offer.endpointRunning === false;
}

function candidateFor(offer: OfferRecord, req: ChatRequest): Candidate {
  const inputTokens = inputTokenUpperBound(req);
  const maxOutputTokens = outputBound(req, offer.capabilities);
  const w = wakes(offer);
  return {
    offer,
    wakes: w,
    inputTokens,
    outputLimit: outputLimit(req, offer.capabilities),
    maxOutputTokens,
    maximumCredits: maximumCredits(
      offer.tariff,
      { inputTokenBound: inputTokens, outputBound: maxOutputTokens },
      w,
    ),
  };
}

/**
 * What routing reads besides the catalog: what was measured of offers over the reputation's
 * window (their median latency and throughput, how many requests they failed, how many of
 * their usage claims diverged, and whether they stand excluded for it).
 */
export interface RoutingContext {
  readonly measured?: ((offerId: Hex) => OfferMeasurement | undefined) | undefined;
  /**
   * Milliseconds left of an offer's cooldown (its provider answered 429, or 503 with
   * Retry-After; reputation/cooldowns.ts), undefined when it is not cooling down.
   */
  readonly coolingMs?: ((offerId: Hex) => number | undefined) | undefined;
  /**
   * The offer's audit state (src/domain/audits/standing.ts; `unaudited` without a standing):
   * `flagged` and `excluded` offers sort last, `excluded` ones are out of routing (503
   * `offer_model_mismatch` when nothing else is left), `provider.require_audited` keeps `passing`.
   */
  readonly audit?: ((offerId: Hex) => AuditState) | undefined;
}

/**
 * The candidates whose audits do not exclude them, in their order; when every one is excluded
 * (a pinned request's offer, or all the model's), 503 `offer_model_mismatch` naming why.
 */
function withoutMismatched(list: Candidate[], ctx: RoutingContext): Candidate[] {
  const audit = ctx.audit;
  if (audit === undefined || list.length === 0) return list;
  const kept = list.filter((c) => audit(c.offer.offerId) !== "excluded");
  if (kept.length > 0) return kept;
  throw modelMismatch(list.map((c) => c.offer.offerId));
}

/**
 * The candidates not cooling down, in their order; when every one is (a pinned request's offer,
 * or all the model's), 503 `offer_cooling_down` with the soonest end as Retry-After.
 */
function withoutCooling(list: Candidate[], ctx: RoutingContext): Candidate[] {
  const left = ctx.coolingMs;
  if (left === undefined || list.length === 0) return list;
  const kept = list.filter((c) => left(c.offer.offerId) === undefined);
  if (kept.length > 0) return kept;
  const soonest = Math.min(...list.map((c) => left(c.offer.offerId) ?? 0));
  return failCooling(list, soonest);
}

function failCooling(list: readonly Candidate[], soonestMs: number): never {
  throw coolingDown(
    list.map((c) => c.offer.offerId),
    soonestMs,
  );
}

/**
 * The features a request uses that an offer's verification can prove (`require_parameters`):
 * tools (a non-empty `tools` or a `tool_choice` other than "none"), a `response_format` of type
 * `json_schema`, usage on a stream (the gateway always asks for it there), and `logprobs: true`.
 */
export function requiredFeatures(req: ChatRequest): OfferFeature[] {
  const features: OfferFeature[] = [];
  const toolChoice = req.toolChoice;
  if (
    (req.tools !== undefined && req.tools.length > 0) ||
    (toolChoice !== undefined && toolChoice !== "none")
  )
    features.push("tools");
  const format = req.responseFormat;
  if (
    typeof format === "object" &&
    format !== null &&
    !Array.isArray(format) &&
    format["type"] === "json_schema"
  )
    features.push("json_schema");
  if (req.stream) features.push("stream_usage");
  if (req.body["logprobs"] === true) features.push("logprobs");
  return features;
}

const compareBig = (a: bigint, b: bigint): number => (a < b ? -1 : a > b ? 1 : 0);

/** Measured first, lowest (or highest with `descending`) first; unmeasured offers last. */
function compareMeasured(
  a: number | undefined,
  b: number | undefined,
  descending: boolean,
): number {
  if (a === undefined || b === undefined) return Number(a === undefined) - Number(b === undefined);
  return descending ? b - a : a - b;
}

function refused(what: string): GatewayError {
  return new GatewayError(
    "no_eligible_offer",
    `no eligible offer of this model satisfies ${what}; relax the provider preferences`,
  );
}

/**
 * The refusal of a model whose tokenizer is still loading (at start-up, or just indexed): its
 * offers become routable once it is loaded, and no request waits on a load (issue 35, item 5).
 */
export function tokenizerLoading(model: Pick<ModelRecord, "repository">): GatewayError {
  return new GatewayError(
    "no_eligible_offer",
    `the tokenizer of model ${model.repository.slice(0, 200)} is still loading: its offers are routable once it is loaded; try again shortly`,
  );
}

/**
 * Applies the request's provider preferences (provider-preferences.ts) to the ranked
 * candidates. Filters first (only, ignore, require_audited, require_parameters, max_price: each one that leaves
 * nothing is named in the refusal), then the order: `sort` replaces the default ranking, and
 * `order` puts its offers first; `allow_fallbacks: false` keeps only the `order` list (without
 * one, only the first offer).
 */
function applyPreferences(
  ranked: Candidate[],
  prefs: ProviderPreferences,
  req: ChatRequest,
  ctx: RoutingContext,
): Candidate[] {
  let list = ranked;
  const narrow = (keep: (c: Candidate) => boolean, what: string) => {
    const before = list.length;
    list = list.filter(keep);
    if (before > 0 && list.length === 0) throw refused(what);
  };
  if (prefs.only !== undefined) {
    const only = new Set(prefs.only);
    narrow((c) => only.has(c.offer.offerId), "provider.only");
  }
  if (prefs.ignore !== undefined) {
    const ignore = new Set(prefs.ignore);
    narrow((c) => !ignore.has(c.offer.offerId), "provider.ignore");
  }
  if (prefs.requireAudited) narrow((c) => isAudited(c, ctx), auditedOnly);
  if (prefs.requireParameters) {
    const needed = requiredFeatures(req);
    narrow(
      (c) => needed.every((f) => c.offer.verifiedFeatures?.includes(f) === true),
      `provider.require_parameters (features used: ${needed.join(", ") || "none"})`,
    );
  }
  list = withinMaxPrice(list, prefs.maxPrice);
  if (prefs.sort !== undefined) {
    const by = prefs.sort;
    if (by === "price") {
      // Array.prototype.sort is stable: ties keep the default ranking.
      list = [...list].sort((a, b) => compareBig(a.maximumCredits, b.maximumCredits));
    } else {
      // Read once per candidate: the comparator runs O(n log n) times.
      const measured = new Map(list.map((c) => [c, ctx.measured?.(c.offer.offerId)]));
      const key = (c: Candidate) => {
        const m = measured.get(c);
        return by === "latency" ? m?.latencyMs : m?.throughput;
      };
      // Failing offers (reputation/reputation.ts) last, whatever their speed: a quick failure is no answer.
      const failing = (c: Candidate) => Number(isFailing(measured.get(c)));
      list = [...list].sort(
        (a, b) => failing(a) - failing(b) || compareMeasured(key(a), key(b), by === "throughput"),
      );
    }
    list = flaggedLast(list, ctx);
  }
  if (prefs.order !== undefined) {
    const order = prefs.order;
    const ordered = order.flatMap((id) => list.filter((c) => c.offer.offerId === id));
    const rest = list.filter((c) => !order.includes(c.offer.offerId));
    if (!prefs.allowFallbacks) {
      if (list.length > 0 && ordered.length === 0)
        throw refused("provider.order with provider.allow_fallbacks false");
      return ordered;
    }
    return [...ordered, ...rest];
  }
  // Without fallbacks, the first offer neither excluded by its audits nor cooling down.
  return prefs.allowFallbacks
    ? list
    : withoutCooling(withoutMismatched(list, ctx), ctx).slice(0, 1);
}

/** What a request with `provider.require_audited` is refused naming. */
const auditedOnly =
  "provider.require_audited (only offers whose audits pass: Offer.audit.state passing)";

/** Whether the offer's audits pass (`provider.require_audited`). */
function isAudited(c: Candidate, ctx: RoutingContext): boolean {
  return ctx.audit?.(c.offer.offerId) === "passing";
}

/**
 * Offers flagged for diverging usage claims (src/domain/reputation/divergence.ts) or by their
 * audits (`model_mismatch`, src/domain/audits/standing.ts) after every offer that is not, each
 * part in its order (a stable partition): whatever `provider.sort` says, a cheap or quick offer
 * that overstates its usage or serves another model is not preferred to an honest one.
 */
function flaggedLast(list: readonly Candidate[], ctx: RoutingContext): Candidate[] {
  const flagged = (c: Candidate) =>
    isDivergenceFlagged(ctx.measured?.(c.offer.offerId)) ||
    (ctx.audit !== undefined && isModelMismatch(ctx.audit(c.offer.offerId)));
  return [...list.filter((c) => !flagged(c)), ...list.filter(flagged)];
}

/**
 * DESIGN section 6: eligible offers matching every pin, ranked by quoted
 * maximum credits, then running over sleeping, then in-flight load, offers flagged for
 * diverging usage claims last; then the request's
 * provider preferences (DESIGN.md section 9), except where a pin (the request's `offer`, its
 * quote's or its permit's offer) decides: a pin wins over every preference but `max_price`
 * (the prices the client set hold whatever pins the request).
 * Capacity is enforced atomically at reservation, not here. Throws `no_eligible_offer` when the
 * preferences exclude every eligible offer.
 *
 * An offer excluded for diverging usage claims is not eligible, pinned or not: a request or quote
 * pinned to it finds no offer (503 `no_eligible_offer`) until its operator verifies it again.
 * An offer its audits exclude (`ctx.audit`) is left out after the pins and preferences chose,
 * before the cooldowns: a request left with none but such offers (pinned to one, `provider.only`
 * or `order` without fallbacks naming only such offers, or a model whose every offer is one) is
 * refused 503 `offer_model_mismatch`. `provider.require_audited` keeps only offers whose audits
 * pass, pinned or not (like `require_exact_metering`, a term of the client's).
 * No offer of a model whose tokenizer is still loading is routable (the catalog's routing view
 * says so); `provider.require_exact_metering` refuses a model metered by the byte bound, pinned
 * or not. Offers cooling down (`ctx.coolingMs`) are left out last, after the pins and preferences
 * chose: a request left with none of them is refused 503 `offer_cooling_down` (Retry-After).
 */
export function rankCandidates(
  offers: readonly OfferRecord[],
  model: ModelRecord,
  req: ChatRequest,
  pins: readonly (Hex | undefined)[],
  now: number,
  ctx: RoutingContext = {},
): Candidate[] {
  if (model.tokenizerLoading === true) throw tokenizerLoading(model);
  const pinned = pins.filter((p): p is Hex => p !== undefined);
  let ranked = offers
    .filter(
      (o) =>
        isEligible(o, model, now) &&
        pinned.every((p) => p === o.offerId) &&
        ctx.measured?.(o.offerId)?.excluded !== true,
    )
    .map((o) => candidateFor(o, req))
    .sort(
      (a, b) =>
        (a.maximumCredits < b.maximumCredits ? -1 : a.maximumCredits > b.maximumCredits ? 1 : 0) ||
        Number(a.wakes) - Number(b.wakes) ||
        a.offer.inFlight - b.offer.inFlight,
    );
  ranked = flaggedLast(ranked, ctx);
  return withoutCooling(withoutMismatched(preferred(ranked, model, req, pinned, ctx), ctx), ctx);
}

/** The ranked candidates as the request's pins and provider preferences leave them. */
function preferred(
  ranked: Candidate[],
  model: ModelRecord,
  req: ChatRequest,
  pinned: readonly Hex[],
  ctx: RoutingContext,
): Candidate[] {
  if (req.provider === undefined) return ranked;
  // How the request is counted is the client's term, pinned or not (like max_price).
  if (req.provider.requireExactMetering && ranked.length > 0 && model.metering?.kind !== "exact") {
    throw refused(
      `provider.require_exact_metering: model ${model.repository.slice(0, 200)} (revision ${model.revision.slice(0, 80)}) is metered by the byte bound, no tokenizer being registered for it`,
    );
  }
  // So is whether it is served by an offer whose audits pass (the model it pays for).
  if (req.provider.requireAudited && ranked.length > 0 && !ranked.some((c) => isAudited(c, ctx)))
    throw refused(auditedOnly);
  // A pin wins over every preference but the prices the client set.
  if (pinned.length > 0) return withinMaxPrice(ranked, req.provider.maxPrice);
  return applyPreferences(ranked, req.provider, req, ctx);
}

type MaxPrice = NonNullable<ProviderPreferences["maxPrice"]>;

/** What `provider.max_price` judges of a candidate (a supplied quote's figures fit too). */
export type PricedOffer = Pick<
  Candidate,
  "offer" | "inputTokens" | "maxOutputTokens" | "maximumCredits"
>;

/**
 * Whether an offer's price for this request is within `provider.max_price` (docs/decisions/providers-and-routing.md,
 * "Provider preferences"): its input and output prices at most `prompt` and `completion`, and
 * its maximum credits for the request, the wake fee included when it may be charged, at most
 * the same request's maximum at the client's prices (a price the client left open counts at the
 * offer's own). A per-request fee has no per-token price to compare; this way it must fit in the
 * headroom the client's prices leave for this request. A `max_price` without either price sets
 * no limit.
 */
export function fitsMaxPrice(c: PricedOffer, max: MaxPrice): boolean {
  if (max.prompt === undefined && max.completion === undefined) return true;
  const { tariff } = c.offer;
  if (max.prompt !== undefined && tariff.inputPricePerMTok > max.prompt) return false;
  if (max.completion !== undefined && tariff.outputPricePerMTok > max.completion) return false;
  return c.maximumCredits <= maxPriceBudget(c, max);
}

/** The request's maximum at the client's prices (no wake fee): what `fitsMaxPrice` allows. */
function maxPriceBudget(c: PricedOffer, max: MaxPrice): bigint {
  const { tariff } = c.offer;
  return maximumCredits(
    {
      inputPricePerMTok: max.prompt ?? tariff.inputPricePerMTok,
      outputPricePerMTok: max.completion ?? tariff.outputPricePerMTok,
      wakeFee: 0n,
    },
    { inputTokenBound: c.inputTokens, outputBound: c.maxOutputTokens },
    false,
  );
}

/**
 * The candidates within `max_price` (all of them without one); throws `no_eligible_offer`
 * naming it when it excludes every one.
 */
function withinMaxPrice(list: Candidate[], max: MaxPrice | undefined): Candidate[] {
  if (max === undefined || list.length === 0) return list;
  const kept = list.filter((c) => fitsMaxPrice(c, max));
  if (kept.length === 0) throw maxPriceRefusal(list, max);
  return kept;
}

/**
 * The refusal of a request whose every offer is above `max_price`; with one offer (a pin), its
 * id and figures, so that the client sees what to raise.
 */
export function maxPriceRefusal(list: readonly PricedOffer[], max: MaxPrice): GatewayError {
  const limit = `provider.max_price (prompt ${max.prompt ?? "any"}, completion ${max.completion ?? "any"} credits per million tokens, wake fee included)`;
  const [only] = list;
  if (list.length !== 1 || only === undefined) return refused(limit);
  const { tariff } = only.offer;
  return new GatewayError(
    "no_eligible_offer",
    `offer ${only.offer.offerId} costs up to ${only.maximumCredits} credits for this request ` +
      `(prompt ${tariff.inputPricePerMTok}, completion ${tariff.outputPricePerMTok} credits per ` +
      `million tokens${only.maximumCredits > priceWithoutFee(only) ? `, wake fee ${tariff.wakeFee}` : ""}), ` +
      `above ${limit}, which allows up to ${maxPriceBudget(only, max)}; raise max_price or choose another offer`,
  );
}

function priceWithoutFee(c: PricedOffer): bigint {
  return maximumCredits(
    c.offer.tariff,
    { inputTokenBound: c.inputTokens, outputBound: c.maxOutputTokens },
    false,
  );
}

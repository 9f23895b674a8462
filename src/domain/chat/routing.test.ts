import type { Hex } from "viem";
import { describe, expect, it } from "vitest";
import type { ModelRecord, OfferRecord } from "../catalog.js";
import { parseChatRequest } from "./request/index.js";
import { GatewayError } from "../errors.js";
import { createOfferMeasurements } from "../reputation/measurements.js";
import type { AuditState } from "../audits/types.js";
import { fitsMaxPrice, rankCandidates, requiredFeatures } from "./routing.js";

const modelId = `0x${"ab".repeat(32)}` as Hex;
const model = { modelId, status: "active" } as ModelRecord;
const id = (n: number) => `0x${n.toString(16).padStart(2, "0").repeat(32)}` as Hex;
const [cheap, middle, dear] = [id(1), id(2), id(3)];

function offer(offerId: Hex, price: bigint, features: OfferRecord["verifiedFeatures"] = []) {
  return {
    offerId,
    modelId,
    owner: id(9),
    operator: id(9),
    payout: id(9),
    status: "active",
    tariff: { version: 1n, inputPricePerMTok: price, outputPricePerMTok: price, wakeFee: 0n },
    region: "eu",
    hardware: "cpu",
    maxConcurrency: 4,
    capabilities: {},
    verifiedAt: 1,
    verificationExpiresAt: 10_000,
    verifiedFeatures: features,
    endpointRegistered: true,
    endpointRunning: true,
    inFlight: 0,
  } satisfies OfferRecord;
}

const offers = [offer(dear, 300n, ["tools"]), offer(cheap, 100n), offer(middle, 200n)];
const messages = [{ role: "user", content: "hi" }];
const request = (extra: object) =>
  parseChatRequest(new TextEncoder().encode(JSON.stringify({ model: "m", messages, ...extra })), {
    maxBytes: 1 << 20,
  });
const rank = (provider: object | undefined, pins: (Hex | undefined)[] = [], extra: object = {}) => {
  const measurements = createOfferMeasurements();
  // latency: middle < dear < cheap; throughput: dear > cheap > middle
  measurements.served(cheap, { latencyMs: 300, outputTokens: 100n, generationMs: 2000 });
  measurements.served(middle, { latencyMs: 50, outputTokens: 100n, generationMs: 5000 });
  measurements.served(dear, { latencyMs: 150, outputTokens: 100n, generationMs: 500 });
  return rankCandidates(offers, model, request({ provider, ...extra }), pins, 5, {
    measured: (o) => measurements.get(o),
  }).map((c) => c.offer.offerId);
};
const refusal = (fn: () => unknown): GatewayError => {
  try {
    fn();
  } catch (error) {
    if (error instanceof GatewayError) return error;
  }
  throw new Error("not refused");
};

describe("provider preferences in routing (OpenRouter's provider object)", () => {
  it("ranks by price by default", () => {
    expect(rank(undefined)).toEqual([cheap, middle, dear]);
  });

  it("order: the listed offers first, in order, then the others", () => {
    expect(rank({ order: [dear, middle] })).toEqual([dear, middle, cheap]);
  });

  it("allow_fallbacks false: only the order list; without one, only the first offer", () => {
    expect(rank({ order: [dear], allow_fallbacks: false })).toEqual([dear]);
    expect(rank({ allow_fallbacks: false })).toEqual([cheap]);
  });

  it("only restricts and ignore excludes", () => {
    expect(rank({ only: [dear, middle] })).toEqual([middle, dear]);
    expect(rank({ ignore: [cheap] })).toEqual([middle, dear]);
    expect(refusal(() => rank({ only: [cheap], ignore: [cheap] })).message).toContain(
      "provider.ignore",
    );
  });

  it("sort by price, latency (lowest first) and throughput (highest first), unmeasured last", () => {
    expect(rank({ sort: "price" })).toEqual([cheap, middle, dear]);
    expect(rank({ sort: "latency" })).toEqual([middle, dear, cheap]);
    expect(rank({ sort: "throughput" })).toEqual([dear, cheap, middle]);
    const unmeasured = rankCandidates(
      offers,
      model,
      request({ provider: { sort: "latency" } }),
      [],
      5,
      {
        measured: (o) =>
          o === dear
            ? {
                latencyMs: 10,
                throughput: undefined,
                served: 1,
                failed: 0,
                samples: 1,
                claimed: 0,
                diverged: 0,
                excluded: false,
              }
            : undefined,
      },
    ).map((c) => c.offer.offerId);
    expect(unmeasured).toEqual([dear, cheap, middle]);
  });

  it("sorts failing offers last by latency (below 80 % over 10 requests), not by price", () => {
    const sorted = (by: string, failedOfMiddle: number, servedOfMiddle = 0) => {
      const measurements = createOfferMeasurements();
      measurements.served(cheap, { latencyMs: 300, outputTokens: 100n, generationMs: 2000 });
      measurements.served(dear, { latencyMs: 150, outputTokens: 100n, generationMs: 500 });
      // middle: the quickest to its first token and the slowest stream, when it answers.
      measurements.served(middle, { latencyMs: 50, outputTokens: 100n, generationMs: 5000 });
      for (let i = 0; i < servedOfMiddle; i++) measurements.served(middle);
      for (let i = 0; i < failedOfMiddle; i++) measurements.failed(middle);
      return rankCandidates(offers, model, request({ provider: { sort: by } }), [], 5, {
        measured: (o) => measurements.get(o),
      }).map((c) => c.offer.offerId);
    };
    // 1 served, 9 failed: 10 % over 10 requests.
    expect(sorted("latency", 9)).toEqual([dear, cheap, middle]);
    expect(sorted("price", 9)).toEqual([cheap, middle, dear]);
    // 8 served of 10 is not failing (80 %); 7 of 10 is.
    expect(sorted("latency", 2, 7)).toEqual([middle, dear, cheap]);
    expect(sorted("latency", 3, 6)).toEqual([dear, cheap, middle]);
    // Under 10 requests nothing is failing: 1 served, 8 failed.
    expect(sorted("latency", 8)).toEqual([middle, dear, cheap]);
  });

  it("order with sort: the order list first, the rest sorted", () => {
    expect(rank({ order: [cheap], sort: "latency" })).toEqual([cheap, middle, dear]);
  });

  it("max_price excludes offers above it, and refuses naming max_price when none remain", () => {
    expect(rank({ max_price: { prompt: "200", completion: "250" } })).toEqual([cheap, middle]);
    expect(rank({ max_price: { completion: "100" } })).toEqual([cheap]);
    const error = refusal(() => rank({ max_price: { prompt: "99", completion: "99" } }));
    expect(error.code).toBe("no_eligible_offer");
    expect(error.message).toContain("provider.max_price");
  });

  it("require_parameters keeps the offers whose verification proved the request's features", () => {
    const tools = { tools: [{ type: "function", function: { name: "f" } }] };
    expect(rank({ require_parameters: true }, [], tools)).toEqual([dear]);
    expect(rank(undefined, [], tools)).toEqual([cheap, middle, dear]);
    expect(rank({ require_parameters: true })).toEqual([cheap, middle, dear]);
    const error = refusal(() => rank({ require_parameters: true }, [], { ...tools, stream: true }));
    expect(error.message).toContain("provider.require_parameters");
  });

  it("a pin wins over every preference but max_price", () => {
    expect(rank({ ignore: [middle], order: [dear], allow_fallbacks: false }, [middle])).toEqual([
      middle,
    ]);
    const error = refusal(() => rank({ ignore: [middle], max_price: { prompt: "1" } }, [middle]));
    expect(error.code).toBe("no_eligible_offer");
    expect(error.message).toContain(`offer ${middle} costs up to`);
    expect(rank({ max_price: { prompt: "200" } }, [middle])).toEqual([middle]);
  });

  it("max_price counts the wake fee against the request's maximum at the client's prices", () => {
    // A million tokens in and out: the maximum is the two prices plus the fee, 100 + 100 + 50.
    const priced = {
      offer: {
        ...offer(cheap, 100n),
        tariff: { version: 1n, inputPricePerMTok: 100n, outputPricePerMTok: 100n, wakeFee: 50n },
      },
      inputTokens: 1_000_000n,
      maxOutputTokens: 1_000_000n,
      maximumCredits: 250n,
    };
    const fits = (max: { prompt?: bigint; completion?: bigint }) => fitsMaxPrice(priced, max);
    expect(fits({ prompt: 100n, completion: 150n })).toBe(true);
    expect(fits({ prompt: 100n, completion: 149n })).toBe(false);
    // A price left open counts at the offer's own: the fee must fit in the other's headroom.
    expect(fits({ prompt: 150n })).toBe(true);
    expect(fits({ prompt: 149n })).toBe(false);
    expect(fits({ completion: 100n })).toBe(false);
    // A per-token price above the client's is excluded whatever the headroom.
    expect(fits({ prompt: 99n, completion: 10_000n })).toBe(false);
    // Without either price, no limit.
    expect(fits({})).toBe(true);
    // Not waking (no fee in the maximum): the tariff's own prices fit.
    expect(
      fitsMaxPrice({ ...priced, maximumCredits: 200n }, { prompt: 100n, completion: 100n }),
    ).toBe(true);
  });

  it("a sleeping offer's wake fee counts in routing's max_price, pinned or not", () => {
    const sleeping = {
      ...offer(cheap, 100n),
      endpointRunning: false,
      tariff: {
        version: 1n,
        inputPricePerMTok: 100n,
        outputPricePerMTok: 100n,
        wakeFee: 10n ** 6n,
      },
    };
    const req = request({ provider: { max_price: { prompt: "100", completion: "100" } } });
    for (const pins of [[], [cheap]]) {
      const error = refusal(() => rankCandidates([sleeping], model, req, pins, 5));
      expect(error.message).toContain("max_price");
    }
    const awake = { ...sleeping, endpointRunning: true };
    expect(rankCandidates([awake], model, req, [cheap], 5).map((c) => c.offer.offerId)).toEqual([
      cheap,
    ]);
  });

  it("names the features a request uses", () => {
    const used = (extra: object) => requiredFeatures(request(extra));
    expect(used({})).toEqual([]);
    expect(used({ tools: [{}], stream: true })).toEqual(["tools", "stream_usage"]);
    expect(used({ tool_choice: "none" })).toEqual([]);
    expect(used({ response_format: { type: "json_schema" } })).toEqual(["json_schema"]);
    expect(used({ response_format: { type: "json_object" } })).toEqual([]);
    expect(used({ logprobs: true, top_logprobs: 3 })).toEqual(["logprobs"]);
    expect(used({ logprobs: false })).toEqual([]);
  });
});

describe("provider object validation", () => {
  const invalid = (provider: unknown) => refusal(() => request({ provider }));
  it.each([
    ["provider", "not an object"],
    ["provider.order", { order: "0x01" }],
    ["provider.only[0]", { only: ["nope"] }],
    ["provider.ignore[1]", { ignore: [id(1), 7] }],
    ["provider.allow_fallbacks", { allow_fallbacks: "no" }],
    ["provider.require_parameters", { require_parameters: 1 }],
    ["provider.require_exact_metering", { require_exact_metering: "yes" }],
    ["provider.sort", { sort: "cheapest" }],
    ["provider.max_price", { max_price: 5 }],
    ["provider.max_price.prompt", { max_price: { prompt: 0.5 } }],
    ["provider.max_price.completion", { max_price: { completion: "-1" } }],
    ["provider.max_price.request", { max_price: { request: "1" } }],
    ["provider.data_collection", { data_collection: "deny" }],
  ])("refuses 400 invalid_request naming '%s'", (field, provider) => {
    const error = invalid(provider);
    expect(error.code).toBe("invalid_request");
    expect(error.message).toContain(`'${field}'`);
  });

  it("accepts a full object, offer ids in any hex case, null members as absent", () => {
    const req = request({
      provider: {
        order: [id(10).toUpperCase().replace("0X", "0x")],
        only: null,
        allow_fallbacks: false,
        sort: "throughput",
        max_price: { prompt: "5", completion: "0" },
        require_parameters: true,
      },
    });
    expect(req.provider).toEqual({
      order: [id(10)],
      only: undefined,
      ignore: undefined,
      allowFallbacks: false,
      sort: "throughput",
      maxPrice: { prompt: 5n, completion: 0n },
      requireParameters: true,
      requireExactMetering: false,
      requireAudited: false,
    });
  });
});

describe("metering in routing (issue 35: loaded before served, metering shown)", () => {
  const exact = { ...model, repository: "Qwen/Qwen3-8B", revision: "main" } as ModelRecord;
  const metered = (metering: ModelRecord["metering"], extra: Partial<ModelRecord> = {}) =>
    ({ ...exact, metering, ...extra }) as ModelRecord;
  const ranked = (m: ModelRecord, provider?: object, pins: (Hex | undefined)[] = []) =>
    rankCandidates(offers, m, request(provider === undefined ? {} : { provider }), pins, 5).map(
      (c) => c.offer.offerId,
    );

  it("routes no offer of a model whose tokenizer is still loading, whatever the request", () => {
    const loading = metered({ kind: "exact", tokenizer: "qwen3" }, { tokenizerLoading: true });
    for (const pins of [[], [cheap]]) {
      const error = refusal(() => ranked(loading, undefined, pins));
      expect(error.code).toBe("no_eligible_offer");
      expect(error.message).toContain("tokenizer of model Qwen/Qwen3-8B is still loading");
    }
    expect(ranked(metered({ kind: "exact", tokenizer: "qwen3" }))).toEqual([cheap, middle, dear]);
  });

  it("provider.require_exact_metering keeps exact offers and refuses bound ones, naming why", () => {
    const exactModel = metered({ kind: "exact", tokenizer: "qwen3" });
    expect(ranked(exactModel, { require_exact_metering: true })).toEqual([cheap, middle, dear]);
    // A model metered by the byte bound (or one the catalog did not say: bound).
    for (const bound of [metered({ kind: "bound" }), metered(undefined)]) {
      expect(ranked(bound)).toEqual([cheap, middle, dear]);
      expect(ranked(bound, { require_exact_metering: false })).toEqual([cheap, middle, dear]);
      const error = refusal(() => ranked(bound, { require_exact_metering: true }));
      expect(error.code).toBe("no_eligible_offer");
      expect(error.message).toContain("provider.require_exact_metering");
      expect(error.message).toContain("byte bound");
      // Pinned too: how a request is counted is the client's term.
      const pinned = refusal(() => ranked(bound, { require_exact_metering: true }, [cheap]));
      expect(pinned.message).toContain("provider.require_exact_metering");
    }
  });
});

describe("usage divergence in routing (docs/decisions/metering-and-tokens.md, Usage divergence)", () => {
  /** cheap's claims: `diverged` of 20 diverged; the others' 20 are honest. */
  const measuredWith = (diverged: number, excluded: string[] = []) => {
    const measurements = createOfferMeasurements();
    measurements.served(cheap, { latencyMs: 30, outputTokens: 100n, generationMs: 500 });
    measurements.served(middle, { latencyMs: 50, outputTokens: 100n, generationMs: 5000 });
    measurements.served(dear, { latencyMs: 150, outputTokens: 100n, generationMs: 2000 });
    for (let i = 0; i < 20; i++) {
      // Diverged answers of distinct payers (divergence counts across independent payers).
      measurements.claimed(cheap, i < diverged, `0x${(i + 1).toString(16).padStart(40, "0")}`);
      measurements.claimed(middle, false);
      measurements.claimed(dear, false);
    }
    measurements.setExclusions(
      excluded.map((offerId) => ({ offerId: offerId as Hex, excludedAt: 1, clearedAt: undefined })),
    );
    return measurements;
  };
  const ranked = (
    measurements: ReturnType<typeof createOfferMeasurements>,
    provider: object | undefined,
    pins: (Hex | undefined)[] = [],
  ) =>
    rankCandidates(offers, model, request({ provider }), pins, 5, {
      measured: (o) => measurements.get(o),
    }).map((c) => c.offer.offerId);

  it("sorts an offer flagged for diverging claims after every other, whatever provider.sort", () => {
    // 2 of 20 diverged (10 %): not flagged; cheap leads by price and by latency.
    const honestEnough = measuredWith(2);
    expect(ranked(honestEnough, undefined)).toEqual([cheap, middle, dear]);
    expect(ranked(honestEnough, { sort: "latency" })).toEqual([cheap, middle, dear]);
    // 3 of 20 (15 %): flagged, last by every key.
    const flagged = measuredWith(3);
    expect(ranked(flagged, undefined)).toEqual([middle, dear, cheap]);
    expect(ranked(flagged, { sort: "price" })).toEqual([middle, dear, cheap]);
    expect(ranked(flagged, { sort: "latency" })).toEqual([middle, dear, cheap]);
    // By throughput cheap (200 tokens/s) would lead dear (50) and middle (20).
    expect(ranked(honestEnough, { sort: "throughput" })).toEqual([cheap, dear, middle]);
    expect(ranked(flagged, { sort: "throughput" })).toEqual([dear, middle, cheap]);
    // An explicit order is the client's: it stands (the rest still puts the flagged last).
    expect(ranked(flagged, { order: [cheap] })).toEqual([cheap, middle, dear]);
    // Still routed to when it is the only one a request allows.
    expect(ranked(flagged, { only: [cheap] })).toEqual([cheap]);
  });

  it("leaves an excluded offer out of routing, also when a pin names it", () => {
    const excluded = measuredWith(0, [cheap]);
    expect(ranked(excluded, undefined)).toEqual([middle, dear]);
    expect(ranked(excluded, undefined, [cheap])).toEqual([]);
    expect(refusal(() => ranked(excluded, { only: [cheap] })).code).toBe("no_eligible_offer");
    // Cleared (a verification passed): routed again, first by price.
    excluded.setExclusions([{ offerId: cheap, excludedAt: 1, clearedAt: 2 }]);
    expect(ranked(excluded, undefined, [cheap])).toEqual([cheap]);
    expect(ranked(excluded, undefined)).toEqual([cheap, middle, dear]);
  });
});

describe("offers cooling down (a provider's 429; reputation/cooldowns.ts)", () => {
  const cooling = new Map<Hex, number>([
    [cheap, 30_000],
    [middle, 4_500],
  ]);
  const rankCooling = (provider: object | undefined, pins: (Hex | undefined)[] = []) =>
    rankCandidates(offers, model, request({ provider }), pins, 5, {
      coolingMs: (o) => cooling.get(o),
    }).map((c) => c.offer.offerId);

  it("leaves them out of the ranking and of allow_fallbacks false's one offer", () => {
    expect(rankCooling(undefined)).toEqual([dear]);
    expect(rankCooling({ allow_fallbacks: false })).toEqual([dear]);
    expect(rankCooling({ sort: "price" })).toEqual([dear]);
  });

  it("refuses 503 offer_cooling_down, Retry-After the seconds left, when none is left", () => {
    const pinned = refusal(() => rankCooling(undefined, [cheap]));
    expect(pinned.code).toBe("offer_cooling_down");
    expect(pinned.retryAfterSeconds).toBe(30);
    expect(pinned.message).toContain(`offer ${cheap} is cooling down`);
    // The soonest end of those the preferences left, rounded up.
    const only = refusal(() => rankCooling({ only: [cheap, middle] }));
    expect(only.code).toBe("offer_cooling_down");
    expect(only.retryAfterSeconds).toBe(5);
    expect(only.message).toContain("every eligible offer of this model is cooling down");
    expect(
      refusal(() => rankCooling({ order: [middle], allow_fallbacks: false })).retryAfterSeconds,
    ).toBe(5);
  });
});

describe("offers by their audits (audits/standing.ts)", () => {
  const rankAudited = (
    states: Partial<Record<Hex, AuditState>>,
    provider: object | undefined,
    pins: (Hex | undefined)[] = [],
    cooling: Partial<Record<Hex, number>> = {},
  ) =>
    rankCandidates(offers, model, request({ provider }), pins, 5, {
      audit: (o) => states[o] ?? "unaudited",
      coolingMs: (o) => cooling[o],
    }).map((c) => c.offer.offerId);

  it("sorts flagged offers after every other, whatever provider.sort says", () => {
    expect(rankAudited({ [cheap]: "flagged" }, undefined)).toEqual([middle, dear, cheap]);
    expect(rankAudited({ [cheap]: "flagged" }, { sort: "price" })).toEqual([middle, dear, cheap]);
    expect(rankAudited({ [cheap]: "flagged" }, { allow_fallbacks: false })).toEqual([middle]);
    // A pin to a flagged offer is served by it.
    expect(rankAudited({ [cheap]: "flagged" }, undefined, [cheap])).toEqual([cheap]);
  });

  it("leaves excluded offers out; a request left with none but them is 503 offer_model_mismatch", () => {
    const excluded = { [cheap]: "excluded" } as const;
    expect(rankAudited(excluded, undefined)).toEqual([middle, dear]);
    expect(rankAudited(excluded, { allow_fallbacks: false })).toEqual([middle]);
    expect(rankAudited(excluded, { order: [cheap] })).toEqual([middle, dear]);
    for (const [provider, pins] of [
      [undefined, [cheap]],
      [{ only: [cheap] }, []],
      [{ order: [cheap], allow_fallbacks: false }, []],
    ] as const) {
      const error = refusal(() => rankAudited(excluded, provider, [...pins]));
      expect(error.code).toBe("offer_model_mismatch");
      expect(error.message).toContain(`offer ${cheap} is out of routing`);
    }
    const all = refusal(() =>
      rankAudited({ [cheap]: "excluded", [middle]: "excluded", [dear]: "excluded" }, undefined),
    );
    expect(all.code).toBe("offer_model_mismatch");
    expect(all.message).toContain("every eligible offer of this model is out of routing");
    // Excluded and cooling down: the exclusion is what the client is told (it lasts).
    expect(refusal(() => rankAudited(excluded, undefined, [cheap], { [cheap]: 5000 })).code).toBe(
      "offer_model_mismatch",
    );
  });

  it("provider.require_audited keeps only passing offers, pinned or not, naming itself", () => {
    const states = { [cheap]: "unaudited", [middle]: "flagged", [dear]: "passing" } as const;
    expect(rankAudited(states, { require_audited: true })).toEqual([dear]);
    expect(rankAudited(states, { require_audited: true }, [dear])).toEqual([dear]);
    for (const pins of [[cheap], []]) {
      const error = refusal(() =>
        rankAudited({ ...states, [dear]: "excluded" }, { require_audited: true }, pins),
      );
      expect(error.code).toBe("no_eligible_offer");
      expect(error.message).toContain("provider.require_audited");
    }
    expect(refusal(() => rankAudited(states, { require_audited: true }, [cheap])).code).toBe(
      "no_eligible_offer",
    );
  });
});

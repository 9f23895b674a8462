import { Type, type TSchema } from "@sinclair/typebox";
import {
  ModelSchema,
  OfferReputationSchema,
  OfferSchema,
  OfferUsageDivergenceSchema,
  TariffSchema,
} from "../../../gen/gateway/v1/market_pb.js";
import {
  InferenceRequestSchema,
  PermitBalanceSchema,
  RequestSettlementSchema,
  UsageFiguresSchema,
} from "../../../gen/gateway/v1/inference_pb.js";
import { PermitAuthorizationSchema } from "../../../gen/gateway/v1/permit_pb.js";
import {
  EarningsBatchSchema,
  EarningsDaySchema,
  EarningsTotalsSchema,
  OfferEarningsSchema,
  OfferHealthSchema,
  OfferKeyBindingSchema,
  UnsettleableEarningsSchema,
  VerificationRunSchema,
} from "../../../gen/gateway/v1/provider_pb.js";
import { QuoteSchema } from "../../../gen/gateway/v1/quote_pb.js";
import {
  BatchRecordSchema,
  FlushResponseSchema,
  SettlementBatchSchema,
  UnsettleableChargeSchema,
} from "../../../gen/gateway/v1/settlement_pb.js";
import { component, Hex32 } from "../../schema/common.js";
import { protoView } from "./proto-view.js";
import { maxTokenDecimals } from "../../domain/token-units.js";
import { offerFeatures } from "../../domain/offer-features.js";
import { auditFields, offerAuditResource } from "./audits.js";

/**
 * The REST resources: each the view of the protobuf message it mirrors (proto-view.ts), with
 * only what REST says beyond the message (a constant `object`, a description, a field shown as
 * null when empty). Lists and envelopes wrap them.
 */

/** The usage details of a request, wherever they are shown (record, `x_gateway`). */
export const usageDetails = {
  cached_input_tokens: {
    description:
      "Of input_tokens, those the provider reported served from its prompt cache: a safe integer at most prompt_tokens, else 0; 0 when it reported none (or an Idempotency-Key replay of an answer stored before they were recorded). Shown, never priced",
  },
  reasoning_tokens: {
    description:
      "Of output_tokens, those the provider reported spent on reasoning: a safe integer at most completion_tokens, else 0; 0 when it reported none. Shown, never priced",
  },
} as const;

/** A provider's usage claim or the gateway's count (DESIGN.md section 10), as REST shows it. */
export const usageFiguresResource = protoView(UsageFiguresSchema, "UsageFigures", {
  description:
    "Token figures of one answer (decimal strings): a provider's usage claim, or the gateway's own count",
});

/**
 * Both numbers of a request (record, `x_gateway`): the provider's claim, the gateway's count and
 * which of them the usage charged (input_tokens ... reasoning_tokens) comes from.
 */
export const usageFigureFields = {
  usage_claimed: {
    emptyIsNull: true,
    description:
      "The provider's usage claim as it reported it; null when it reported none (or the request closed before the gateway kept it)",
  },
  usage_counted: {
    emptyIsNull: true,
    description:
      "The gateway's own count of the answer (its tokenizer, or a documented upper bound); null when nothing was counted (nothing reached the client)",
  },
  usage_source: {
    emptyIsNull: true,
    description:
      "Whose figures were charged: provider (its claim, every kind within the gateway's count plus tolerance) or gateway (its count plus tolerance: lower than the claim in at least one kind, or no claim); null while open",
  },
} as const;

/** The nested views of {@link usageFigureFields}. */
export const usageFigureViews = {
  usage_claimed: usageFiguresResource,
  usage_counted: usageFiguresResource,
} as const;

/**
 * How a model, offer or quote is metered (DESIGN.md section 10), wherever it is shown: `exact`
 * with the tokenizer's name, or `bound`.
 */
const meteringFields = (what: string, unknown?: string) =>
  ({
    metering: {
      ...(unknown === undefined ? {} : { emptyIsNull: true }),
      description: `How the gateway counts ${what}'s tokens: exact (its model's own tokenizer and chat template, named in tokenizer) or bound (no tokenizer is registered for the model: a sound upper bound stands in, output at most the UTF-8 bytes delivered, input at most the bytes sent plus a per-message allowance, so charges run above an exact count). provider.require_exact_metering routes only to exact offers.${unknown ?? ""}`,
    },
    tokenizer: {
      emptyIsNull: true,
      description: `The tokenizer registry entry that counts ${what}'s tokens when metering is exact; null when bound${unknown === undefined ? "" : " or unknown"}.`,
    },
  }) as const;

export const modelResource = protoView(ModelSchema, "Model", {
  constants: { object: "model" },
  fields: {
    id: { description: "public model id (catalog id, else the ModelID)" },
    ...meteringFields("the model"),
    credit_token_decimals: {
      schema: Type.Integer({ minimum: 0, maximum: maxTokenDecimals }),
      description:
        "The credit token's decimals, as its contract answers decimals(). Every amount of this model (offer prices, quotes, permit balances, request charges, usage) is in the token's base units; amount / 10^credit_token_decimals is the amount in tokens. null when unknown (the token answered nothing usable, or is not read yet): show base units then, never assume 18.",
    },
    credit_token_symbol: {
      schema: Type.String({ pattern: "^[A-Za-z0-9$._+-]{1,16}$" }),
      description:
        "The credit token's symbol, as its contract answers symbol(), when it is 1-16 ASCII letters, digits or $._+- (a token's answer is untrusted text: anything else is not shown); null otherwise.",
    },
  },
});

const tariffResource = protoView(TariffSchema, "Tariff");

const basisPoints = Type.Integer({ minimum: 0, maximum: 10000 });

const reputationResource = protoView(OfferReputationSchema, "OfferReputation", {
  description:
    "What the gateway measured of the offer over the last window_seconds (docs/decisions.md, Offer reputation). Rates and the score in basis points (10000 = 100 %); a measure without data in the window is null (a new offer: every measure but its verification pass rate null, score null, requests 0).",
  fields: {
    score: {
      schema: basisPoints,
      description:
        "floor(weighted mean of the terms with data: success_rate_bps x4, 10000*1000/(1000+time_to_first_token_ms) x2, 10000*tps/(tps+50) x2, verification_pass_rate_bps x2) * (10000 - min(10000, 10 * flagged basis points of requests)) / 10000, then * (10000 - min(10000, 10 * usage_divergence.share_bps)) / 10000 once usage_divergence.claimed is at least 20 (0 while excluded), each product rounded down; 0 while model_mismatch (the offer's audits flag or exclude it); null until a request is counted in the window",
    },
    success_rate_bps: {
      schema: basisPoints,
      description:
        "Requests the provider served / requests it served or failed (no answer or a 5xx, also when the request failed over; an invalid answer; a stream it broke off). A 429 counts only when it repeats a recent cooldown (docs/decisions/providers-and-routing.md, Cooldowns). A client's cancel, a 4xx answer, a first 429 and the gateway's own failures are not counted.",
    },
    time_to_first_token_ms: {
      description:
        "Median time from the provider call to the first token of served answers (a JSON answer: to its whole body); provider.sort latency orders by it.",
    },
    output_tokens_per_second: {
      description:
        "Median output tokens per second after the first token of served answers; provider.sort throughput orders by it.",
    },
    verification_pass_rate_bps: {
      schema: basisPoints,
      description:
        "Verification runs that passed / runs that passed or answered wrongly (runs that got no answer are not counted).",
    },
    flags: { description: "Requests whose provider reported more usage than it could have." },
    requests: { description: "Requests counted: served plus failed by the provider." },
    model_mismatch: auditFields.reputation,
  },
});

const usageDivergenceResource = protoView(OfferUsageDivergenceSchema, "OfferUsageDivergence", {
  description:
    "The offer's usage claims against the gateway's own count over the reputation's window, since its last exclusion was cleared (docs/decisions.md, Usage divergence).",
  fields: {
    claimed: { description: "Answers that carried a provider usage claim." },
    diverged: {
      description:
        "Of those, claims of input or output tokens above the gateway's count plus tolerance.",
    },
    share_bps: {
      schema: basisPoints,
      description: "diverged / claimed in basis points, rounded down; null without a claim.",
    },
    flagged: {
      description:
        "More than 10 % of at least 20 claimed answers diverged (or the offer is excluded): routed after every unflagged offer, whatever provider.sort says.",
    },
    excluded: {
      description:
        "More than 50 % of at least 20 claimed answers diverged: out of routing (a request or quote pinned to it gets 503 no_eligible_offer) until a verification of the offer passes (POST /v1/provider-offers/{id}/verify).",
    },
  },
});

export const offerResource = protoView(OfferSchema, "Offer", {
  nested: {
    tariff: tariffResource,
    reputation: reputationResource,
    usage_divergence: usageDivergenceResource,
    audit: offerAuditResource,
  },
  fields: {
    audit: auditFields.offer,
    usage_divergence: {
      emptyIsNull: true,
      description:
        "How often the offer's usage claims diverged from the gateway's count: shown by the catalog (GET /v1/models/{id}, /v1/models/{id}/offers); null in other answers.",
    },
    reputation: {
      emptyIsNull: true,
      description:
        "The offer's reputation: shown by the catalog (GET /v1/models/{id}, /v1/models/{id}/offers); null in other answers.",
    },
    ...meteringFields(
      "the offer",
      " Shown by the catalog (GET /v1/models/{id}, /v1/models/{id}/offers); null in other answers.",
    ),
    cooldown_until: {
      integer: true,
      description:
        "When the offer's cooldown ends (Unix seconds): its provider answered 429 (or 503 with Retry-After) and no gateway process routes to it until then (a request pinned to it gets 503 offer_cooling_down with Retry-After). Null when it is not cooling down, and in answers other than the catalog's.",
    },
    verified_features: {
      schema: Type.Unsafe<string>({ enum: [...offerFeatures] }),
      description:
        "Features the endpoint's last successful verification proved: tools (a tool call answered), json_schema (a response_format json_schema answered with parseable JSON), stream_usage (a stream carried usage), logprobs (a temperature-0 completion's log-probabilities spelled its text and passed the gateway's checks; offers with it also get logprob audits). provider.require_parameters routes only to offers that proved every feature a request uses.",
    },
  },
});

export const offerHealthResource = protoView(OfferHealthSchema, "OfferHealth");

export const verificationRunResource = protoView(VerificationRunSchema, undefined, {
  description: "The verification run this answer rests on.",
  fields: {
    ran_at: { description: "When the run ended." },
    replayed: {
      description:
        "True when no run was made for this call: it came within the bound of the last run, whose outcome it is answered.",
    },
    next_run_at: { description: "From when a verify runs the checks again." },
  },
});

export const quoteResource = protoView(QuoteSchema, "Quote", {
  nested: { audit: offerAuditResource },
  fields: {
    audit: auditFields.quote,
    max_output_tokens: {
      description:
        "The output tokens maximum_credits pays for: the output limit times n (every choice may use the whole limit)",
    },
    ...meteringFields("the quoted request"),
  },
});

export const settlementOfRequest = protoView(RequestSettlementSchema, undefined, {
  fields: {
    batch_id: { emptyIsNull: true },
    tx_hash: { emptyIsNull: true },
    reason: { emptyIsNull: true },
  },
});

export const requestResource = protoView(InferenceRequestSchema, "InferenceRequest", {
  constants: { object: "inference.request" },
  nested: { settlement: settlementOfRequest, ...usageFigureViews },
  fields: {
    id: { schema: Hex32 },
    billing: { emptyIsNull: true },
    error: { emptyIsNull: true },
    ...usageDetails,
    ...usageFigureFields,
  },
});

export const permitBalanceResource = protoView(PermitBalanceSchema, "PermitBalance", {
  fields: { offer_id: { emptyIsNull: true } },
});

export const permitAuthorizationResource = protoView(
  PermitAuthorizationSchema,
  "PermitAuthorization",
  {
    constants: { object: "permit_authorization" },
    fields: {
      id: { schema: Type.String({ pattern: "^pauth_[0-9a-f]{24}$" }) },
      api_key_id: { description: "the public id of the key that may spend" },
      permit_id: { description: "the permit; all zeros: every permit of the payer" },
      revoked_by: {
        emptyIsNull: true,
        schema: Type.Unsafe<string>({ enum: ["key", "payer"] }),
      },
    },
  },
);

export const flushResource = protoView(FlushResponseSchema, "FlushResponse", {
  nested: {
    batches: protoView(SettlementBatchSchema, undefined, {
      fields: {
        requests: { integer: true },
        charges: { integer: true },
        tx_hash: { emptyIsNull: true },
        gas: { emptyIsNull: true },
        error: { emptyIsNull: true },
      },
    }),
    unsettleable: protoView(UnsettleableChargeSchema, undefined, {
      fields: { requests: { integer: true } },
    }),
  },
  fields: { settled_requests: { integer: true } },
});

export const offerKeyBindingResource = protoView(OfferKeyBindingSchema, "OfferKeyBinding", {
  constants: { object: "offer_key_binding" },
  fields: {
    id: { schema: Type.String({ pattern: "^okb_[0-9a-f]{24}$" }) },
    api_key_id: { description: "the public id of the key that may read the offer's earnings" },
    operator: { description: "the operator who signed the binding" },
  },
});

const earningsTotals = protoView(EarningsTotalsSchema, "EarningsTotals", {
  fields: { requests: { integer: true } },
});

export const offerEarningsResource = protoView(OfferEarningsSchema, "OfferEarnings", {
  constants: { object: "offer_earnings" },
  nested: {
    unsettled: earningsTotals,
    settling: earningsTotals,
    settled: earningsTotals,
    unsettleable: earningsTotals,
    unsettleable_reasons: protoView(UnsettleableEarningsSchema, undefined, {
      fields: { requests: { integer: true } },
    }),
    batches: protoView(EarningsBatchSchema, undefined, {
      fields: {
        requests: {
          integer: true,
          description: "the offer's requests of the window in the batch",
        },
        credits: { description: "the offer's credits of the window in the batch" },
        tx_hash: { emptyIsNull: true },
      },
    }),
    days: protoView(EarningsDaySchema, "EarningsDay", {
      fields: {
        starts_at: { description: "Unix seconds: the start of the UTC day of completion" },
        requests: { integer: true },
        credits: { description: "credits charged that day, every settlement state (base units)" },
        settled_credits: { description: "of them, settled on chain (base units)" },
      },
    }),
  },
  fields: {
    from: { integer: true, description: "Unix seconds: charges completed at or after this" },
    to: { integer: true, description: "Unix seconds: charges completed before this" },
    payout: { description: "the offer's payout address, where settled credits go" },
  },
});

export const batchRecordResource = protoView(BatchRecordSchema, "SettlementBatchRecord", {
  fields: {
    requests: { integer: true },
    tx_hash: { emptyIsNull: true },
    error: { emptyIsNull: true },
  },
});

// ---------------------------------------------------------------- lists and envelopes

/** `{object: "list", data: [...]}` of a resource. */
export function listOf(name: string, item: TSchema) {
  return component(name, Type.Object({ object: Type.Literal("list"), data: Type.Array(item) }));
}

export const ModelList = listOf("ModelList", modelResource.schema);
export const OfferList = listOf("OfferList", offerResource.schema);
export const PermitAuthorizationList = listOf(
  "PermitAuthorizationList",
  permitAuthorizationResource.schema,
);

export const SettlementBatchList = listOf("SettlementBatchList", batchRecordResource.schema);

export const OfferKeyBindingList = component(
  "OfferKeyBindingList",
  Type.Object({
    object: Type.Literal("list"),
    data: Type.Array(offerKeyBindingResource.schema, {
      description: "the calling key's active bindings, newest first",
    }),
  }),
);

export const OfferKeyBindingEnvelope = component(
  "OfferKeyBindingEnvelope",
  Type.Object({ binding: offerKeyBindingResource.schema }),
);

export const ModelWithOffers = component(
  "ModelWithOffers",
  Type.Composite([modelResource.schema, Type.Object({ offers: OfferList.properties.data })]),
);

export const OfferEnvelope = component(
  "OfferEnvelope",
  Type.Object({ offer: offerResource.schema }),
);

export const VerifiedOffer = component(
  "VerifiedOffer",
  Type.Object({ offer: offerResource.schema, verification: verificationRunResource.schema }),
);

export const PayerAuthorizationList = component(
  "PayerAuthorizationList",
  Type.Object({
    object: Type.Literal("list"),
    data: Type.Array(permitAuthorizationResource.schema, {
      description: "every key's authorizations of the payer, newest first",
    }),
    has_more: Type.Boolean({
      description: "more follow: ask again with `startingAfter` = the last id",
    }),
  }),
);

export const PayerRevocation = component(
  "PayerRevocation",
  Type.Object({
    object: Type.Literal("payer_revocation"),
    revoked: Type.Integer({
      minimum: 0,
      description: "how many authorizations this revoked (those revoked before are not counted)",
    }),
    authorizations: Type.Array(permitAuthorizationResource.schema, {
      description: "the authorizations it revoked, newest first (at most 100)",
    }),
    epoch: Type.Union([Type.Integer({ minimum: 0 }), Type.Null()], {
      description:
        "revoke all: the payer's epoch now (Unix seconds; every AuthorizeKey issued at or before it is refused); null otherwise",
    }),
    revoked_before: Type.Integer({
      minimum: 0,
      description:
        "what was revoked is what was issued at or before this (Unix seconds): the later of the signed `before` and the gateway's clock; an AuthorizeKey of the revocation's scope (key, permit, all) issued at or before it is refused when submitted later",
    }),
    warning: Type.Union([Type.String(), Type.Null()], {
      description:
        "set when the payer's clock (`before`) and the gateway's differ by more than 5 seconds",
    }),
  }),
);

export const PermitAuthorizationEnvelope = component(
  "PermitAuthorizationEnvelope",
  Type.Object({ authorization: permitAuthorizationResource.schema }),
);

// ---------------------------------------------------------------- operations

export const Health = component("Health", Type.Object({ status: Type.Literal("ok") }));

export const Readiness = component(
  "Readiness",
  Type.Object({
    status: Type.Unsafe<string>({ enum: ["ready", "unavailable", "shutting_down"] }),
    checks: Type.Optional(
      Type.Record(
        Type.String(),
        Type.Object({
          ok: Type.Boolean(),
          error: Type.Optional(Type.String()),
          loading: Type.Optional(
            Type.Array(Type.String(), {
              description:
                "tokenizers: the tokenizers loading now; not ready while one a model with an active offer needs is among them (its offers are not routable until it is loaded)",
            }),
          ),
          failed: Type.Optional(
            Type.Array(Type.String(), {
              description:
                "tokenizers: those whose last load failed (logged); their models are not routable, the rest of the gateway serves",
            }),
          ),
        }),
      ),
    ),
  }),
);

/** The spec's error body; each route's answers narrow `code` and `type` (src/rest/document.ts). */
export const ErrorBody = component(
  "Error",
  Type.Object({
    error: Type.Object({
      code: Type.String(),
      type: Type.String(),
      message: Type.String(),
    }),
  }),
);

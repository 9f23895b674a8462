import { Type } from "@sinclair/typebox";
import { AuditStandingSchema, AuditTestEvidenceSchema } from "../../../gen/gateway/v1/audit_pb.js";
import { OfferAuditSchema } from "../../../gen/gateway/v1/market_pb.js";
import { component } from "../../schema/common.js";
import { protoView, type FieldRule } from "./proto-view.js";

/**
 * The audits' REST views (docs/decisions/audits.md): an offer's standing as the catalog and
 * quotes show it, and the operator's view with the evidence.
 */

/** A statistic: a decimal string of six significant digits, never in exponent notation. */
const Statistic = component(
  "AuditStatistic",
  Type.String({
    pattern: "^-?(0|[1-9][0-9]*)(\\.[0-9]+)?$",
    description: "a decimal string of six significant digits (never exponent notation)",
  }),
);

export const offerAuditResource = protoView(OfferAuditSchema, "OfferAudit", {
  description:
    "What the offer's audits say (docs/decisions/audits.md): blind audit requests compared with the model's reference, evidence accumulated as an anytime-valid e-value with false-discovery control across the market's offers.",
  fields: {
    state: {
      description:
        "unaudited: not enough evidence yet either way (a new offer, a model without a reference, or evidence cleared by a verification that passed); passing: audited, below the first threshold (provider.require_audited routes only to these); flagged: beyond flag_at (model_mismatch), routed after every offer that is not; excluded: beyond exclude_at, out of routing (a request or quote pinned to it gets 503 offer_model_mismatch) until a verification of the offer passes (POST /v1/provider-offers/{id}/verify).",
    },
    e_value: {
      schema: Statistic,
      description:
        "The offer's accumulated e-value: 1 is no evidence, larger is evidence that it serves another model.",
    },
    flag_at: {
      schema: Statistic,
      emptyIsNull: true,
      description: "The e-value that flags at the market's size; null when never judged.",
    },
    exclude_at: {
      schema: Statistic,
      emptyIsNull: true,
      description: "The e-value that takes the offer out of routing; null when never judged.",
    },
    reference_kind: {
      emptyIsNull: true,
      description:
        "What the offer was compared with: anchor (an offer the operator named), majority (the model's offers), data (reference data shipped pinned); null when never judged.",
    },
    updated_at: { description: "When the standing was last written; null when never judged." },
    model_mismatch: {
      description: "true when flagged or excluded: its audits found it serving another model.",
    },
  },
});

const evidenceResource = protoView(AuditTestEvidenceSchema, "AuditTestEvidence", {
  description: "What one test says of the offer (since its evidence was last cleared).",
  fields: {
    test: {
      description:
        "border_probe (first tokens at temperature 0 on border inputs), mmd (completions at temperature 1: MMD with a Hamming kernel, permutation test), logprob (teacher-forced log-probabilities of fixed sequences)",
    },
    samples: { description: "Samples of the offer the test used." },
    reference_samples: { description: "Samples of the reference it compared them with." },
    statistic: { schema: Statistic, description: "The test's own statistic." },
    p_value: {
      schema: Statistic,
      description: "Its p-value when the test computes one (permutation tests); else null.",
    },
    e_value: { schema: Statistic, description: "The e-value this test contributes." },
  },
});

export const auditStandingResource = protoView(AuditStandingSchema, "AuditStanding", {
  constants: { object: "audit_standing" },
  nested: { audit: offerAuditResource, tests: evidenceResource },
  fields: {
    reference_offer_id: {
      emptyIsNull: true,
      description: "The anchor offer it was compared with; null for a majority or data reference.",
    },
    cleared_at: {
      description:
        "When a verification that passed last cleared its evidence (samples before it do not count); null: never.",
    },
  },
});

export const AuditStandingList = component(
  "AuditStandingList",
  Type.Object({ object: Type.Literal("list"), data: Type.Array(auditStandingResource.schema) }),
);

/** How the offer, its reputation and a quote describe their audit members. */
export const auditFields = {
  offer: {
    emptyIsNull: true,
    description:
      "What the offer's audits say (state, e-value, thresholds, reference; model_mismatch when flagged or excluded): shown by the catalog for every offer (GET /v1/models/{id}, /v1/models/{id}/offers; unaudited when never judged); null in other answers.",
  },
  quote: {
    description:
      "What the quoted offer's audits say, as the catalog shows it (unaudited when never judged).",
  },
  reputation: {
    description:
      "The offer's audits found it serving another model than the one it sells (Offer.audit flagged or excluded): its score is 0.",
  },
} as const satisfies Record<string, FieldRule>;

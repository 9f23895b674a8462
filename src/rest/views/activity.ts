import { Type } from "@sinclair/typebox";
import { GetUsageResponseSchema, UsageGroupSchema } from "../../../gen/gateway/v1/inference_pb.js";
import { Address, component } from "../../schema/common.js";
import { protoView } from "./proto-view.js";
import { permitBalanceResource, requestResource } from "./resources.js";

/** The activity resources (DESIGN.md section 13): a key's requests, usage, spendable permits. */

export const RequestList = component(
  "InferenceRequestList",
  Type.Object({
    object: Type.Literal("list"),
    data: Type.Array(requestResource.schema),
    has_more: Type.Boolean({
      description: "more records follow: ask again with `starting_after` = the last id",
    }),
  }),
);

const usageGroupResource = protoView(UsageGroupSchema, "UsageGroup", {
  fields: {
    starts_at: { description: "Unix seconds: the start of the UTC hour or day" },
    requests: { integer: true },
    input_tokens: { description: "tokens charged (the records' input_tokens)" },
    output_tokens: { description: "tokens charged (the records' output_tokens)" },
    credits: { description: "credits charged, in the credit token's base units" },
  },
});

export const usageResource = protoView(GetUsageResponseSchema, "Usage", {
  constants: { object: "usage" },
  nested: { groups: usageGroupResource },
  fields: {
    permit_id: { emptyIsNull: true, description: "the permit; null: the caller's requests" },
    from: { integer: true, description: "Unix seconds: requests made at or after this" },
    to: { integer: true, description: "Unix seconds: requests made before this" },
  },
});

export const SpendablePermitList = component(
  "SpendablePermitList",
  Type.Object({
    object: Type.Literal("list"),
    data: Type.Array(permitBalanceResource.schema, {
      description:
        "the permits the key's active authorizations name, and the newest 100 the payers of its every-permit authorizations opened, with their balances",
    }),
    every_permit_payers: Type.Array(Address, {
      description: "payers whose every permit the key may spend (their permits are in data)",
    }),
  }),
);

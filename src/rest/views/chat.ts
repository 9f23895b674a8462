import { Type } from "@sinclair/typebox";
import {
  BudgetWarningSchema,
  ChatCompletedSchema,
  type SignedUsageReceipt as SignedUsageReceiptMessage,
} from "../../../gen/gateway/v1/inference_pb.js";
import { usageReceiptView } from "./challenges.js";
import { SignedUsageReceipt } from "./receipts.js";
import { component } from "../../schema/common.js";
import { protoView } from "./proto-view.js";
import { usageDetails, usageFigureFields, usageFigureViews } from "./resources.js";

/**
 * The chat completion answers (OpenAI's chat.completion and its chunks) and `x_gateway`, the
 * view of the chat RPC's ChatCompleted message that every dialect's answer carries. The request
 * is declared in src/schema/chat.ts (TypeBox only, for the domain to validate with).
 */

/**
 * `x_gateway`, the charge of a completed answer (every dialect's last event and JSON answer): the
 * view of the chat RPC's ChatCompleted message.
 */
/** A payer's soft threshold reached (issue 38), in `x_gateway.budget_warning`. */
const budgetWarningResource = protoView(BudgetWarningSchema, "BudgetWarning", {
  fields: {
    code: { description: "authorization_warn_threshold_reached" },
    period: {
      description: 'the periodic cap\'s period ("day", "week", "month"), or "" (the total)',
    },
  },
});

export const xGatewayResource = protoView(ChatCompletedSchema, "XGateway", {
  nested: {
    ...usageFigureViews,
    budget_warning: budgetWarningResource,
    receipt: {
      schema: SignedUsageReceipt,
      view: (m) => {
        const signed = m as SignedUsageReceiptMessage;
        return {
          receipt: usageReceiptView(signed.receipt!),
          signature: signed.signature,
          signer: signed.signer,
        };
      },
    },
  },
  fields: {
    receipt: {
      optional: true,
      description:
        "The request's signed usage receipt, as `GET /v1/requests/{id}/receipt` answers it: on the last event of a streamed answer paid with x402 (its headers are gone by then), when the gateway signs receipts and something was charged",
    },
    budget_warning: {
      optional: true,
      description:
        "The payer's soft threshold (warn_at, signed in its authorization of the key) reached: the use of the authorization that admitted the request, the current period's with a periodic cap, else the total's (charged and held), was at or over it just after this request's admission. Absent below it or without one",
    },
    // usage_source says the same, in words.
    usage_from_provider: { omit: true },
    billing: { emptyIsNull: true },
    ...usageDetails,
    ...usageFigureFields,
  },
});
export const XGateway = xGatewayResource.schema;

export const ChatCompletion = component(
  "ChatCompletion",
  Type.Object(
    {
      id: Type.Optional(Type.String()),
      object: Type.Optional(Type.String()),
      choices: Type.Optional(Type.Array(Type.Unknown())),
      usage: Type.Optional(Type.Object({}, { additionalProperties: true })),
    },
    {
      additionalProperties: true,
      description:
        "The provider's OpenAI-compatible chat.completion object, as it came but for `usage`: what was charged (the provider's claim is on the request's record); choices the request did not ask for are removed",
    },
  ),
);

export const ChatCompletionChunk = component(
  "ChatCompletionChunk",
  Type.Object(
    {
      id: Type.Optional(Type.String()),
      object: Type.Optional(Type.String()),
      choices: Type.Array(Type.Unknown()),
    },
    {
      additionalProperties: true,
      not: { required: ["x_gateway"] },
      description:
        "An upstream chat.completion.chunk, as it came (the gateway's last one is ChatStreamFinalChunk); the usage chunk (`stream_options.include_usage`) shows what was charged",
    },
  ),
);

export const ChatStreamFinalChunk = component(
  "ChatStreamFinalChunk",
  Type.Object(
    {
      id: Type.String(),
      object: Type.Literal("chat.completion.chunk"),
      created: Type.Integer(),
      model: Type.String(),
      choices: Type.Array(Type.Unknown(), { maxItems: 0 }),
      x_gateway: XGateway,
    },
    { description: "The last chunk before `[DONE]`: no choices, and the charge" },
  ),
);

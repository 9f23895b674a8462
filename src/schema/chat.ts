import { Type, type Static } from "@sinclair/typebox";
import { ChatCompletedSchema } from "../../gen/gateway/v1/inference_pb.js";
import { component, Decimal, Hex32, OptionalNullable } from "./common.js";
import { protoView } from "./proto-view.js";

/**
 * The chat completion bodies (spec: Chat request; OpenAI's chat.completion and its chunks),
 * declared once: validation (src/domain/chat-request.ts), types and the OpenAPI document.
 */

export const chatRoles = ["system", "developer", "user", "assistant", "tool", "function"] as const;

export const ChatMessage = component(
  "ChatMessage",
  Type.Object(
    {
      role: Type.Unsafe<(typeof chatRoles)[number]>({ enum: [...chatRoles] }),
      content: Type.Unknown(),
    },
    { additionalProperties: true },
  ),
);

export const ProviderPreferences = component(
  "ProviderPreferences",
  Type.Object(
    {
      order: Type.Optional(Type.Array(Hex32, { maxItems: 64 })),
      only: Type.Optional(Type.Array(Hex32, { maxItems: 64 })),
      ignore: Type.Optional(Type.Array(Hex32, { maxItems: 64 })),
      allow_fallbacks: Type.Optional(Type.Boolean({ default: true })),
      sort: Type.Optional(Type.Unsafe<string>({ enum: ["price", "latency", "throughput"] })),
      max_price: Type.Optional(
        Type.Object(
          { prompt: Type.Optional(Decimal), completion: Type.Optional(Decimal) },
          { additionalProperties: false },
        ),
      ),
      require_parameters: Type.Optional(Type.Boolean({ default: false })),
    },
    {
      description:
        "OpenRouter's provider routing object, applied to this market's offers (offer ids).",
    },
  ),
);

export const ChatRequest = component(
  "ChatRequest",
  Type.Object(
    {
      model: Type.String({ minLength: 1 }),
      messages: Type.Array(ChatMessage, { minItems: 1 }),
      offer: OptionalNullable(Hex32, { "x-error-code": "invalid_hex" }),
      provider: OptionalNullable(ProviderPreferences),
      max_tokens: OptionalNullable(Type.Integer({ minimum: 1 })),
      max_completion_tokens: OptionalNullable(Type.Integer({ minimum: 1 })),
      n: OptionalNullable(Type.Integer({ minimum: 1, maximum: 128 })),
      best_of: OptionalNullable(Type.Integer()),
      temperature: OptionalNullable(Type.Number()),
      top_p: OptionalNullable(Type.Number()),
      stop: OptionalNullable(Type.Union([Type.String(), Type.Array(Type.String())])),
      stream: OptionalNullable(Type.Boolean()),
      stream_options: OptionalNullable(
        Type.Object({ include_usage: OptionalNullable(Type.Boolean()) }),
      ),
      tools: OptionalNullable(Type.Array(Type.Unknown())),
      tool_choice: Type.Optional(Type.Unknown()),
      response_format: Type.Optional(Type.Unknown()),
      seed: OptionalNullable(Type.Integer()),
      user: OptionalNullable(Type.String()),
    },
    { additionalProperties: true },
  ),
);
export type ChatRequestBody = Static<typeof ChatRequest>;

/**
 * `x_gateway`, the charge of a completed answer (every dialect's last event and JSON answer): the
 * view of the chat RPC's ChatCompleted message.
 */
export const xGatewayResource = protoView(ChatCompletedSchema, "XGateway", {
  fields: {
    usage_from_provider: { omit: true },
    billing: { emptyIsNull: true },
    cached_input_tokens: {
      description:
        "Of input_tokens, those the provider reported served from its prompt cache (0: none reported, or not credible); not priced (an Idempotency-Key replay of an answer stored before they were recorded: 0)",
    },
    reasoning_tokens: {
      description:
        "Of output_tokens, those the provider reported spent on reasoning (0: none reported, or not credible); not priced",
    },
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
      description: "The provider's OpenAI-compatible chat.completion object, as it came",
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
        "An upstream chat.completion.chunk, as it came (the gateway's last one is ChatStreamFinalChunk)",
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

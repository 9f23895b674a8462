import { Type, type TProperties } from "@sinclair/typebox";
import { component, Nullable } from "../../schema/common.js";
import { Tag, Tagged, TokenCount } from "../../schema/dialect-shapes.js";
import { XGateway } from "./chat.js";

/**
 * The Anthropic Messages API answers (POST /v1/messages), declared once: the JSON answer and the
 * stream's events exactly as the translator (src/domain/dialects/messages.ts) emits them, with
 * `x_gateway`. The request is declared in src/schema/messages.ts.
 */

// ---------------------------------------------------------------- answer

export const MessagesContentBlock = component(
  "MessagesContentBlock",
  Tagged("type", [
    Type.Object({ type: Tag(["text"]), text: Type.String() }),
    Type.Object({
      type: Tag(["tool_use"]),
      id: Type.String(),
      name: Type.String(),
      input: Type.Object({}, { additionalProperties: true }),
    }),
  ]),
);

const StopReason = Tag(["end_turn", "max_tokens", "stop_sequence", "tool_use", "refusal"]);

export const MessagesUsage = component(
  "MessagesUsage",
  Type.Object(
    {
      input_tokens: TokenCount,
      output_tokens: TokenCount,
      cache_read_input_tokens: TokenCount,
      cache_creation_input_tokens: TokenCount,
      output_tokens_details: Type.Optional(
        Type.Object(
          { thinking_tokens: TokenCount },
          { description: "Present when the provider reported reasoning tokens" },
        ),
      ),
    },
    {
      description:
        "Anthropic's usage: `input_tokens` excludes the cache reads (`input_tokens + cache_read_input_tokens` is the provider's prompt tokens)",
    },
  ),
);

const stop = { stop_reason: StopReason, stop_sequence: Nullable(Type.String()) };

/** The message object's members. */
const messageMembers = {
  id: Type.String({ description: "`msg_` and the gateway's request id" }),
  type: Tag(["message"]),
  role: Tag(["assistant"]),
  model: Type.String(),
  content: Type.Array(MessagesContentBlock),
  ...stop,
  usage: MessagesUsage,
};

export const MessagesAnswer = component(
  "MessagesAnswer",
  Type.Object(
    { ...messageMembers, x_gateway: XGateway },
    { description: "An Anthropic `message` object, with `x_gateway`" },
  ),
);

export const AnthropicError = component(
  "AnthropicError",
  Type.Object(
    {
      type: Type.Literal("error"),
      error: Type.Object({
        type: Type.String(),
        message: Type.String(),
        code: Type.String(),
        details: Type.Optional(
          Type.Object(
            { error_code: Type.Optional(Type.String()) },
            { description: "`error_code`: the gateway's code, where Anthropic's SDKs read it" },
          ),
        ),
      }),
    },
    { description: "Anthropic's error shape, with the gateway's code at `error.code`" },
  ),
);

// ---------------------------------------------------------------- stream

const event = <T extends TProperties>(type: string, members: T) =>
  Type.Object({ type: Tag([type]), ...members });

export const MessagesStreamEvent = component(
  "MessagesStreamEvent",
  Tagged(
    "type",
    [
      event("message_start", {
        message: Type.Object(
          {
            ...messageMembers,
            content: Type.Array(MessagesContentBlock, { maxItems: 0 }),
            stop_reason: Type.Null(),
            stop_sequence: Type.Null(),
          },
          { description: "`usage` is all zeros here: `message_delta` carries it" },
        ),
      }),
      event("content_block_start", { index: TokenCount, content_block: MessagesContentBlock }),
      event("content_block_delta", {
        index: TokenCount,
        delta: Tagged("type", [
          Type.Object({ type: Tag(["text_delta"]), text: Type.String() }),
          Type.Object({ type: Tag(["input_json_delta"]), partial_json: Type.String() }),
        ]),
      }),
      event("content_block_stop", { index: TokenCount }),
      event("message_delta", { delta: Type.Object(stop), usage: MessagesUsage }),
      event("message_stop", { x_gateway: XGateway }),
      AnthropicError,
    ],
    {
      description:
        "The JSON `data` of one event (`event:` is its `type`): `message_start`, `content_block_*`, `message_delta`, `message_stop` (the last, with `x_gateway`), or `error` after a failure",
    },
  ),
);

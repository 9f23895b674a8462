import { Type } from "@sinclair/typebox";
import { component } from "./common.js";
import { XGateway } from "./chat.js";

/** The Anthropic Messages API bodies (POST /v1/messages), declared once (src/schema/validate.ts). */

export const MessagesRequest = component(
  "MessagesRequest",
  Type.Object(
    {
      model: Type.String({ minLength: 1 }),
      max_tokens: Type.Integer({ minimum: 1 }),
      messages: Type.Array(Type.Unknown()),
      stream: Type.Optional(Type.Boolean()),
    },
    {
      additionalProperties: true,
      description:
        "An Anthropic Messages API request: `model`, `max_tokens`, `system`, `messages` (text, tool_use, tool_result blocks), `tools`, `tool_choice`, `stop_sequences`, `stream`, ...",
    },
  ),
);

export const MessagesAnswer = component(
  "MessagesAnswer",
  Type.Object(
    {
      id: Type.String(),
      type: Type.Literal("message"),
      role: Type.Literal("assistant"),
      content: Type.Array(Type.Unknown()),
      stop_reason: Type.Unknown(),
      usage: Type.Unknown(),
      x_gateway: XGateway,
    },
    { additionalProperties: true, description: "An Anthropic `message` object, with `x_gateway`" },
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

/** The JSON `data` of one event of the Messages stream; `type` is also its `event:` name. */
export const MessagesStreamEvent = component(
  "MessagesStreamEvent",
  Type.Object({ type: Type.String() }, { additionalProperties: true }),
);

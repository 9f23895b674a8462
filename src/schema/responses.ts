import { Type } from "@sinclair/typebox";
import { component } from "./common.js";
import { XGateway } from "./chat.js";

/** The OpenAI Responses API bodies (POST /v1/responses), declared once (src/schema/validate.ts). */

export const ResponsesRequest = component(
  "ResponsesRequest",
  Type.Object(
    {
      model: Type.String({ minLength: 1 }),
      input: Type.Unknown(),
      stream: Type.Optional(Type.Boolean()),
    },
    {
      additionalProperties: true,
      description:
        "An OpenAI Responses API request (stateless): `model`, `input` (text or items), `instructions`, function `tools`, `tool_choice`, `max_output_tokens`, `text.format`, `stream`, ...",
    },
  ),
);

export const ResponsesAnswer = component(
  "ResponsesAnswer",
  Type.Object(
    {
      id: Type.String(),
      object: Type.Literal("response"),
      status: Type.Unsafe<string>({ enum: ["completed", "incomplete"] }),
      output: Type.Array(Type.Unknown()),
      x_gateway: XGateway,
    },
    { additionalProperties: true, description: "An OpenAI `response` object, with `x_gateway`" },
  ),
);

export const OpenAIError = component(
  "OpenAIError",
  Type.Object(
    {
      error: Type.Object({
        code: Type.String(),
        type: Type.String(),
        message: Type.String(),
        param: Type.Optional(Type.Union([Type.String(), Type.Null()])),
      }),
    },
    { description: "OpenAI's error shape, with the gateway's code" },
  ),
);

/** The JSON `data` of one event of the Responses stream; `type` is also its `event:` name. */
export const ResponsesStreamEvent = component(
  "ResponsesStreamEvent",
  Type.Object({ type: Type.String() }, { additionalProperties: true }),
);

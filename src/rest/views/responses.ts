import { Type, type TProperties } from "@sinclair/typebox";
import { component, Nullable, UnixSeconds } from "../../schema/common.js";
import { EmptyArray, Tag, Tagged, TokenCount } from "../../schema/dialect-shapes.js";
import { XGateway } from "./chat.js";

/**
 * The OpenAI Responses API answers (POST /v1/responses), declared once: the JSON answer and the
 * stream's events exactly as the translator (src/domain/dialects/responses.ts) emits them, with
 * `x_gateway`. The request is declared in src/schema/responses.ts.
 */

// ---------------------------------------------------------------- answer

const ItemStatus = Tag(["in_progress", "completed", "incomplete"]);

export const ResponsesOutputPart = component(
  "ResponsesOutputPart",
  Tagged("type", [
    Type.Object({ type: Tag(["output_text"]), text: Type.String(), annotations: EmptyArray }),
    Type.Object({ type: Tag(["refusal"]), refusal: Type.String() }),
  ]),
);

export const ResponsesOutputItem = component(
  "ResponsesOutputItem",
  Tagged("type", [
    Type.Object({
      type: Tag(["message"]),
      id: Type.String(),
      status: ItemStatus,
      role: Tag(["assistant"]),
      content: Type.Array(ResponsesOutputPart),
    }),
    Type.Object({
      type: Tag(["function_call"]),
      id: Type.String(),
      call_id: Type.String({ description: "The provider's tool call id" }),
      name: Type.String(),
      arguments: Type.String(),
      status: ItemStatus,
    }),
  ]),
);

export const ResponsesUsage = component(
  "ResponsesUsage",
  Type.Object(
    {
      input_tokens: TokenCount,
      input_tokens_details: Type.Object({ cached_tokens: TokenCount }),
      output_tokens: TokenCount,
      output_tokens_details: Type.Object({ reasoning_tokens: TokenCount }),
      total_tokens: TokenCount,
    },
    {
      description:
        "The provider's usage (a detail above its total is shown as 0, as recorded), else the gateway's metered counts",
    },
  ),
);

/** The response object's members; request parameters are not echoed (neutral values). */
const responseMembers = {
  id: Type.String({ description: "`resp_` and the gateway's request id" }),
  object: Tag(["response"]),
  created_at: UnixSeconds,
  status: Tag(["in_progress", "completed", "incomplete", "failed"]),
  error: Nullable(Type.Object({ code: Type.String(), message: Type.String() })),
  incomplete_details: Nullable(
    Type.Object({ reason: Tag(["max_output_tokens", "content_filter"]) }),
  ),
  instructions: Type.Null(),
  metadata: Type.Null(),
  model: Type.String(),
  output: Type.Array(ResponsesOutputItem),
  parallel_tool_calls: Type.Literal(true),
  store: Type.Literal(false),
  temperature: Type.Null(),
  tool_choice: Tag(["auto"]),
  tools: EmptyArray,
  top_p: Type.Null(),
  usage: Nullable(ResponsesUsage),
};

export const ResponsesResponse = component(
  "ResponsesResponse",
  Type.Object(responseMembers, {
    description: "The `response` object of the stream's events (`usage` null until it completes)",
  }),
);

export const ResponsesAnswer = component(
  "ResponsesAnswer",
  Type.Object(
    {
      ...responseMembers,
      status: Tag(["completed", "incomplete"]),
      usage: ResponsesUsage,
      x_gateway: XGateway,
    },
    { description: "An OpenAI `response` object, with `x_gateway`" },
  ),
);

// ---------------------------------------------------------------- stream

/** One kind of event: its `type`s, its `sequence_number` (0, 1, ...) and its members. */
const event = <T extends TProperties>(types: readonly [string, ...string[]], members: T) =>
  Type.Object({ type: Tag(types), sequence_number: TokenCount, ...members });

const inPart = { item_id: Type.String(), output_index: TokenCount, content_index: TokenCount };
const inCall = { item_id: Type.String(), output_index: TokenCount };

export const ResponsesStreamEvent = component(
  "ResponsesStreamEvent",
  Tagged(
    "type",
    [
      event(["response.created", "response.in_progress", "response.failed"], {
        response: ResponsesResponse,
      }),
      event(["response.completed", "response.incomplete"], {
        response: ResponsesResponse,
        x_gateway: XGateway,
      }),
      event(["response.output_item.added", "response.output_item.done"], {
        output_index: TokenCount,
        item: ResponsesOutputItem,
      }),
      event(["response.content_part.added", "response.content_part.done"], {
        ...inPart,
        part: ResponsesOutputPart,
      }),
      event(["response.output_text.delta"], {
        ...inPart,
        delta: Type.String(),
        logprobs: EmptyArray,
      }),
      event(["response.output_text.done"], {
        ...inPart,
        text: Type.String(),
        logprobs: EmptyArray,
      }),
      event(["response.refusal.delta"], { ...inPart, delta: Type.String() }),
      event(["response.refusal.done"], { ...inPart, refusal: Type.String() }),
      event(["response.function_call_arguments.delta"], { ...inCall, delta: Type.String() }),
      event(["response.function_call_arguments.done"], {
        ...inCall,
        name: Type.String(),
        arguments: Type.String(),
      }),
    ],
    {
      description:
        "The JSON `data` of one event (`event:` is its `type`), from `response.created` to `response.completed` / `response.incomplete` (with `x_gateway`) or `response.failed`",
    },
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

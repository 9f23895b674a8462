import { Type, type Static, type TProperties, type TSchema } from "@sinclair/typebox";
import { component, Nullable, OptionalNullable, UnixSeconds } from "./common.js";
import { XGateway } from "./chat.js";
import {
  Absent,
  EmptyArray,
  gatewayMembers,
  JsonSchemaObject,
  Name,
  Open,
  OptionallyTagged,
  Refused,
  Tag,
  Tagged,
  TokenCount,
  TokenLimit,
} from "./dialect-shapes.js";

/**
 * The OpenAI Responses API bodies (POST /v1/responses), declared once (src/schema/validate.ts):
 * the request exactly as the translator (src/domain/dialects/responses.ts) accepts it, the JSON
 * answer and the stream's events exactly as it emits them. `null` is read as absent wherever a
 * member is optional, as OpenAI's SDKs send it.
 */

const stateless =
  "this gateway's Responses API is stateless; send the whole conversation in 'input'";
const notSupported = "is not supported by this gateway's Responses API";

/** A member this API has and the gateway does not: refused, null included. */
const Unsupported = Type.Never({ "x-error-message": notSupported });

// ---------------------------------------------------------------- request

/** A member read and not passed on: it tunes or labels the provider's service, not the answer. */
const Ignored = <T extends TSchema>(schema: T) =>
  OptionalNullable(schema, { description: "Accepted, not passed on" });

const TextPart = Open(
  { type: Tag(["input_text", "output_text"]), text: Type.String() },
  { description: "Text (`output_text` in an assistant message the client sends back)" },
);

const ImagePart = Open({
  type: Tag(["input_image"]),
  image_url: Type.String({
    minLength: 1,
    title: "non-empty string (a URL or a data URL)",
    description: "A URL or a data URL",
  }),
  file_id: Absent(
    "is not supported (no files are stored); send 'image_url'",
    "Refused: the gateway stores no files",
  ),
  detail: OptionalNullable(
    Type.String({
      description:
        "`low`, `high` or `auto` are passed on; any other (`original`) is the provider's default",
    }),
  ),
});

const RefusalPart = Open({ type: Tag(["refusal"]), refusal: Type.String() });

const partsOf = <T extends TSchema>(parts: T) =>
  Type.Union([Type.String(), Type.Array(parts)], {
    title: "string or an array of content parts",
  });

/** The messages of `input`, by role: what content parts each may have. */
const roleBranches = [
  component(
    "ResponsesUserMessage",
    Open({ role: Tag(["user"]), content: partsOf(Tagged("type", [TextPart, ImagePart])) }),
  ),
  component(
    "ResponsesAssistantMessage",
    Open({ role: Tag(["assistant"]), content: partsOf(Tagged("type", [TextPart, RefusalPart])) }),
  ),
  component(
    "ResponsesSystemMessage",
    Open({
      role: Tag(["system", "developer"], {
        description: "`developer` becomes `system` (most chat templates know no developer role)",
      }),
      content: partsOf(Tagged("type", [TextPart])),
    }),
  ),
];

/** An input message, whose `type` (declared on the union: `members`) may be "message" or absent. */
const roleMessages = <M extends TProperties>(members: M) =>
  Tagged("role", roleBranches, { members });

const InputMessage = roleMessages({ type: Tag(["message"]) });

const FunctionCallItem = Open(
  {
    type: Tag(["function_call"]),
    call_id: Name,
    name: Name,
    arguments: Type.String({ description: "The call's arguments, as the model wrote them (JSON)" }),
  },
  { description: "A function call of an earlier answer; joins the assistant message before it" },
);

const FunctionCallOutputItem = Open(
  {
    type: Tag(["function_call_output"]),
    call_id: Name,
    output: Type.Union(
      [
        Type.String(),
        Type.Array(
          Tagged("type", [Open({ type: Tag(["input_text"]), text: Type.String() })], {
            unknown: 'must be "input_text" (other tool outputs are not supported)',
          }),
        ),
      ],
      { title: "string or an array of input_text parts" },
    ),
  },
  { description: "A function's result; becomes a `tool` message" },
);

export const ResponsesInputItem = component(
  "ResponsesInputItem",
  OptionallyTagged(
    "type",
    Tagged("type", [
      InputMessage,
      FunctionCallItem,
      FunctionCallOutputItem,
      Open(
        { type: Tag(["reasoning"]) },
        { description: "Another answer's reasoning state: accepted and dropped" },
      ),
      Refused("type", ["item_reference"], `"item_reference" is not supported: ${stateless}`),
    ]),
    roleMessages({ type: Type.Optional(Type.Null()) }),
    {
      title: "object (an input item)",
      description: "A message (`type` may be left out), a function call or its output",
    },
  ),
);

const FunctionTool = Open({
  type: Tag(["function"]),
  name: Name,
  description: OptionalNullable(Type.String()),
  parameters: OptionalNullable(JsonSchemaObject),
  strict: OptionalNullable(Type.Boolean()),
});

const TextFormat = Tagged("type", [
  Open({ type: Tag(["text", "json_object"]) }),
  Open({
    type: Tag(["json_schema"]),
    name: Name,
    schema: JsonSchemaObject,
    description: OptionalNullable(Type.String()),
    strict: OptionalNullable(Type.Boolean()),
  }),
]);

export const ResponsesRequest = component(
  "ResponsesRequest",
  Type.Object(
    {
      model: Type.String({ minLength: 1 }),
      input: Type.Union([Type.String(), Type.Array(ResponsesInputItem, { minItems: 1 })], {
        title: "string or a non-empty array of input items",
        description: "A user message's text, or the whole conversation as items",
      }),
      instructions: OptionalNullable(Type.String(), {
        description: "A system message before the input",
      }),
      tools: OptionalNullable(
        Type.Array(
          Tagged("type", [FunctionTool], {
            unknown:
              'must be "function": this gateway runs no built-in tools; declare a function tool',
          }),
        ),
        { description: "Function tools only" },
      ),
      tool_choice: Type.Optional(
        Type.Union(
          [
            Tag(["auto", "none", "required"]),
            Tagged("type", [Open({ type: Tag(["function"]), name: Name })], {
              unknown: 'must be "function": this gateway runs no built-in tools',
            }),
            Type.Null(),
          ],
          {
            title:
              'string ("auto", "none" or "required") or a function choice ({"type": "function", "name": ...})',
          },
        ),
      ),
      parallel_tool_calls: OptionalNullable(Type.Boolean()),
      max_output_tokens: OptionalNullable(TokenLimit, {
        description: "The canonical request's `max_completion_tokens`",
      }),
      temperature: OptionalNullable(Type.Number()),
      top_p: OptionalNullable(Type.Number()),
      text: OptionalNullable(
        Type.Object(
          {
            format: OptionalNullable(TextFormat, {
              description: "`json_object` and `json_schema` become the canonical `response_format`",
            }),
            verbosity: OptionalNullable(Tag(["low", "medium", "high"])),
          },
          { additionalProperties: Unsupported },
        ),
      ),
      reasoning: OptionalNullable(
        Type.Object(
          {
            effort: OptionalNullable(Type.String(), {
              description: "The canonical request's `reasoning_effort`",
            }),
            summary: Ignored(Type.Unknown()),
            generate_summary: Ignored(Type.Unknown()),
          },
          { additionalProperties: Unsupported },
        ),
      ),
      stream: OptionalNullable(Type.Boolean(), {
        description: "Answer with the Responses API's typed events",
      }),
      store: Type.Optional(
        Type.Union([Type.Literal(false), Type.Null()], {
          "x-error-message": `must be false or left out: ${stateless}`,
          description: "Nothing is stored; `true` is refused",
        }),
      ),
      background: Type.Optional(
        Type.Union([Type.Literal(false), Type.Null()], {
          "x-error-message": "must be false or left out: answers are not stored",
          description: "`true` is refused: answers are not stored",
        }),
      ),
      truncation: OptionalNullable(Type.Literal("disabled"), {
        "x-error-message": 'must be "disabled" (the gateway does not truncate input)',
      }),
      user: OptionalNullable(Type.String()),
      metadata: Ignored(Open({})),
      stream_options: Ignored(Open({})),
      include: Ignored(Type.Array(Type.String())),
      prompt_cache_key: Ignored(Type.String()),
      prompt_cache_retention: Ignored(Type.String()),
      safety_identifier: Ignored(Type.String()),
      service_tier: Ignored(Type.String()),
      previous_response_id: Absent(`is not supported: ${stateless}`, "Refused: nothing is stored"),
      conversation: Absent(`is not supported: ${stateless}`, "Refused: nothing is stored"),
      prompt: Absent(
        "(a stored prompt template) is not supported; send the text in 'input'",
        "Refused: no prompt templates are stored",
      ),
      top_logprobs: Absent(
        "is not supported by this gateway's Responses API",
        "Refused: chat answers relay no log probabilities here",
      ),
      ...gatewayMembers,
    },
    {
      additionalProperties: Unsupported,
      description:
        "An OpenAI Responses API request (stateless), translated to a chat completion. A member this API has and the gateway cannot serve is refused, naming it; so is any unknown member.",
    },
  ),
);
export type ResponsesRequestBody = Static<typeof ResponsesRequest>;

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

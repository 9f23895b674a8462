import { Type, type Static, type TProperties, type TSchema } from "@sinclair/typebox";
import { component, OptionalNullable } from "./common.js";
import {
  Absent,
  gatewayMembers,
  JsonSchemaObject,
  Name,
  Open,
  OptionallyTagged,
  Refused,
  Tag,
  Tagged,
  TokenLimit,
} from "./dialect-shapes.js";

/**
 * The OpenAI Responses API request (POST /v1/responses), declared once (src/schema/validate.ts):
 * exactly as the translator (src/domain/dialects/responses.ts) accepts it. `null` is read as
 * absent wherever a member is optional, as OpenAI's SDKs send it. The JSON answer and the
 * stream's events, which carry `x_gateway`, are in src/rest/views/responses.ts.
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

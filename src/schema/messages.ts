import { Type, type Static, type TSchema } from "@sinclair/typebox";
import { maxStopLength, maxStopStrings } from "./chat.js";
import { component, OptionalNullable } from "./common.js";
import {
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
 * The Anthropic Messages API request (POST /v1/messages), declared once (src/schema/validate.ts):
 * exactly as the translator (src/domain/dialects/messages.ts) accepts it. `null` is read as
 * absent wherever a member is optional. The JSON answer and the stream's events, which carry
 * `x_gateway`, are in src/rest/views/messages.ts.
 */

// ---------------------------------------------------------------- request

const TextBlock = Open(
  { type: Tag(["text"]), text: Type.String() },
  { description: "Text (`cache_control` and `citations` are accepted and not passed on)" },
);

/** `system`, or a tool result's content: a string, or text blocks (joined by a line feed). */
const textOrBlocks = (options: { title: string; description?: string }) =>
  Type.Union([Type.String(), Type.Array(Tagged("type", [TextBlock]))], options);

const ImageBlock = Open({
  type: Tag(["image"]),
  source: Tagged("type", [
    Open(
      {
        type: Tag(["base64"]),
        media_type: Type.String({
          pattern: "^[iI][mM][aA][gG][eE]/[a-zA-Z0-9.+-]+$",
          title: 'image media type such as "image/png"',
        }),
        data: Type.String({ pattern: "^[A-Za-z0-9+/]*={0,2}$", title: "base64 string" }),
      },
      { description: "Becomes a `data:` URL" },
    ),
    Open({
      type: Tag(["url"]),
      url: Type.String({
        pattern: "^[hH][tT][tT][pP][sS]?://",
        title: "string starting with http:// or https://",
      }),
    }),
  ]),
});

const ToolResultBlock = Open(
  {
    type: Tag(["tool_result"]),
    tool_use_id: Type.String({
      minLength: 1,
      description: "A tool_use of the assistant message just before",
    }),
    content: OptionalNullable(textOrBlocks({ title: "string or an array of text blocks" })),
    is_error: OptionalNullable(Type.Boolean(), {
      description: "`true`: the tool message's content starts with `Error: `",
    }),
  },
  { description: "Becomes a `tool` message, before the user message's other blocks" },
);

const ToolUseBlock = Open({
  type: Tag(["tool_use"]),
  id: Name,
  name: Name,
  input: Open({}, { title: "object", description: "The call's arguments" }),
});

const blocksOf = <T extends TSchema>(block: T, minItems: number) =>
  Type.Union([Type.String(), Type.Array(block, { minItems })], {
    title:
      minItems > 0
        ? "string or a non-empty array of content blocks"
        : "string or an array of content blocks",
  });

export const MessagesMessage = component(
  "MessagesMessage",
  Tagged("role", [
    Open({
      role: Tag(["user"]),
      content: blocksOf(Tagged("type", [TextBlock, ImageBlock, ToolResultBlock]), 1),
    }),
    Open({
      role: Tag(["assistant"]),
      content: blocksOf(
        Tagged("type", [
          TextBlock,
          ToolUseBlock,
          Refused(
            "type",
            ["thinking", "redacted_thinking"],
            "is a thinking block: thinking blocks are not supported (see 'thinking')",
          ),
        ]),
        0,
      ),
    }),
    Refused("role", ["system"], `must be "user" or "assistant"; put system text in 'system'`),
  ]),
);

/** A client tool's members; `type` is the only difference between its two forms. */
const clientTool = (type: TSchema) =>
  Open({
    type,
    name: Name,
    description: OptionalNullable(Type.String()),
    input_schema: JsonSchemaObject,
    strict: OptionalNullable(Type.Boolean()),
  });

export const MessagesTool = component(
  "MessagesTool",
  OptionallyTagged(
    "type",
    Tagged("type", [clientTool(Tag(["custom"]))], {
      unknown:
        'must be "custom" or left out: this gateway runs no server tools, only client tools ({name, description, input_schema})',
    }),
    clientTool(Type.Optional(Type.Null())),
    { title: "object (a tool)", description: "A client tool (server tools are refused)" },
  ),
);

const parallel = {
  disable_parallel_tool_use: OptionalNullable(Type.Boolean(), {
    description: "`true`: the canonical request's `parallel_tool_calls: false`",
  }),
};

const ToolChoice = Tagged(
  "type",
  [
    Open({ type: Tag(["auto", "any", "none"]), ...parallel }),
    Open({ type: Tag(["tool"]), name: Name, ...parallel }),
  ],
  {
    title: "object with a 'type' (auto, any, tool or none)",
    description: "`any` and `tool` need `tools`; `auto` and `none` without tools are dropped",
  },
);

export const MessagesRequest = component(
  "MessagesRequest",
  Type.Object(
    {
      model: Type.String({ minLength: 1 }),
      max_tokens: TokenLimit,
      messages: Type.Array(MessagesMessage, {
        minItems: 1,
        title: "non-empty array of messages",
        description:
          "Alternating turns; each tool_use must be answered by a tool_result in the next (user) message",
      }),
      system: OptionalNullable(
        textOrBlocks({
          title: "string or an array of text blocks",
          description: "A system message first",
        }),
      ),
      metadata: OptionalNullable(
        Open(
          {
            user_id: OptionalNullable(Type.String(), {
              description: "The canonical request's `user`",
            }),
          },
          { description: "Only `user_id` is passed on" },
        ),
      ),
      stop_sequences: OptionalNullable(
        Type.Array(Type.String({ maxLength: maxStopLength }), { maxItems: maxStopStrings }),
        {
          description: `The canonical request's \`stop\`, under its bounds: at most ${maxStopStrings} strings of at most ${maxStopLength} characters (400 invalid_request beyond)`,
        },
      ),
      stream: OptionalNullable(Type.Boolean(), {
        description: "Answer with the Messages API's named events",
      }),
      temperature: OptionalNullable(Type.Number({ minimum: 0, maximum: 1 })),
      top_p: OptionalNullable(Type.Number({ minimum: 0, maximum: 1 })),
      top_k: OptionalNullable(Type.Integer({ minimum: 0, title: "non-negative integer" }), {
        description: "Accepted and dropped: chat completions has no such parameter",
      }),
      tools: OptionalNullable(Type.Array(MessagesTool)),
      tool_choice: OptionalNullable(ToolChoice),
      thinking: OptionalNullable(
        Open(
          {
            type: Type.Literal("disabled", {
              "x-error-message":
                'must be "disabled": this gateway\'s providers answer without thinking blocks; leave \'thinking\' out or set {"type": "disabled"}',
            }),
          },
          { title: "object with a 'type'" },
        ),
      ),
      service_tier: OptionalNullable(Type.String(), { description: "Accepted and dropped" }),
      ...gatewayMembers,
    },
    {
      additionalProperties: Type.Null({
        "x-error-message": "is not supported by this gateway's Messages API; leave it out",
      }),
      description:
        "An Anthropic Messages API request, translated to a chat completion. Another member is refused, naming it, unless null.",
    },
  ),
);
export type MessagesRequestBody = Static<typeof MessagesRequest>;

import type { Static } from "@sinclair/typebox";
import { ResponsesInputItem, ResponsesRequest } from "../../schema/responses.js";
import { compileBody } from "../body-check.js";
import { GatewayError } from "../errors.js";
import type { JsonObject as Json } from "./json.js";

/**
 * The Responses dialect's request -> the canonical chat completion request (responses.ts says
 * what is refused, what is dropped, and why).
 */

type Request = Static<typeof ResponsesRequest>;
type InputItem = Static<typeof ResponsesInputItem>;
type InputMessage = Extract<InputItem, { role: unknown }>;

function invalid(message: string): never {
  throw new GatewayError("invalid_request", message);
}

/**
 * The request's shape, refusals included, is the schema's (src/schema/responses.ts). The refused
 * members (what the API keeps on the server, built-in tools, unknown members) are refused by the
 * schema too, not by a check before it: each carries its message (`x-error-message`), so the
 * document states every refusal and why, and the one validator cannot disagree with it; a refused
 * tag is a branch of its discriminated union, so it is refused before any member its kind would
 * need is found missing. What follows trusts the typed value; `null` is absent throughout.
 */
const checkRequest = compileBody(ResponsesRequest);

/** Validates a Responses request and returns the canonical chat completion request. */
export function toCanonical(body: unknown): { chat: Json; stream: boolean } {
  const request = checkRequest(body);
  const messages: Json[] = [];
  if (request.instructions != null) {
    messages.push({ role: "system", content: request.instructions });
  }
  messages.push(...inputMessages(request.input));

  const chat: Json = { model: request.model, messages };
  if (request.tools != null) chat["tools"] = request.tools.map(chatTool);
  if (request.tool_choice != null) chat["tool_choice"] = chatToolChoice(request.tool_choice);
  if (request.parallel_tool_calls != null) {
    chat["parallel_tool_calls"] = request.parallel_tool_calls;
  }
  if (request.max_output_tokens != null) {
    chat["max_completion_tokens"] = request.max_output_tokens;
  }
  if (request.temperature != null) chat["temperature"] = request.temperature;
  if (request.top_p != null) chat["top_p"] = request.top_p;
  if (request.text != null) Object.assign(chat, textConfig(request.text));
  if (request.reasoning?.effort != null) chat["reasoning_effort"] = request.reasoning.effort;
  if (request.user != null) chat["user"] = request.user;
  // The gateway's own, as they came (null included): the chat parser reads them.
  if (request.offer !== undefined) chat["offer"] = request.offer;
  if (request.provider !== undefined) chat["provider"] = request.provider;
  const stream = request.stream === true;
  chat["stream"] = stream;
  // The closing `response.completed` carries usage: the provider must report it on the stream.
  if (stream) chat["stream_options"] = { include_usage: true };
  return { chat, stream };
}

/** `input` -> chat messages. Function calls join the assistant message they follow. */
function inputMessages(input: Request["input"]): Json[] {
  if (typeof input === "string") return [{ role: "user", content: input }];
  const messages: Json[] = [];
  // The assistant message the next function_call item joins; any other item ends it.
  let assistant: Json | undefined;
  for (const item of input) {
    switch (item.type) {
      case "function_call": {
        if (assistant === undefined) {
          assistant = { role: "assistant", content: null };
          messages.push(assistant);
        }
        const calls = (assistant["tool_calls"] ??= []) as Json[];
        calls.push({
          id: item.call_id,
          type: "function",
          function: { name: item.name, arguments: item.arguments },
        });
        break;
      }
      case "function_call_output":
        messages.push({
          role: "tool",
          tool_call_id: item.call_id,
          content:
            typeof item.output === "string"
              ? item.output
              : chatContent(item.output.map((part) => ({ type: "text", text: part.text }))),
        });
        assistant = undefined;
        break;
      case "reasoning":
        // Another provider's opaque reasoning state: chat has no place for it (see the module doc).
        break;
      default: {
        // A message: `type` "message", or left out.
        const message = inputMessage(item);
        messages.push(message);
        assistant = message["role"] === "assistant" ? message : undefined;
      }
    }
  }
  // Semantic, not structural: reasoning items alone make no conversation.
  if (messages.length === 0) invalid("'input' holds no message");
  return messages;
}

function inputMessage(item: InputMessage): Json {
  const role = item.role === "developer" ? "system" : item.role;
  if (typeof item.content === "string") return { role, content: item.content };
  const parts: Json[] = [];
  const refusals: string[] = [];
  for (const part of item.content) {
    if (part.type === "refusal") refusals.push(part.refusal);
    else if (part.type === "input_image") parts.push(imagePart(part));
    else parts.push({ type: "text", text: part.text });
  }
  const message: Json = { role, content: chatContent(parts) };
  if (refusals.length > 0) message["refusal"] = refusals.join("");
  return message;
}

/** One text part is sent as a plain string (what every provider's chat template reads). */
function chatContent(parts: Json[]): unknown {
  const [only] = parts;
  if (parts.length === 1 && only?.["type"] === "text") return only["text"];
  if (parts.length === 0) return "";
  return parts;
}

const imageDetails = new Set(["low", "high", "auto"]);

function imagePart(part: { image_url: string; detail?: string | null }): Json {
  const { image_url: url, detail } = part;
  // "original" has no chat counterpart: the provider's default.
  return {
    type: "image_url",
    image_url: detail != null && imageDetails.has(detail) ? { url, detail } : { url },
  };
}

function chatTool(tool: NonNullable<Request["tools"]>[number]): Json {
  const fn: Json = { name: tool.name };
  if (tool.description != null) fn["description"] = tool.description;
  if (tool.parameters != null) fn["parameters"] = tool.parameters;
  if (tool.strict != null) fn["strict"] = tool.strict;
  return { type: "function", function: fn };
}

function chatToolChoice(choice: NonNullable<Request["tool_choice"]>): unknown {
  if (typeof choice === "string") return choice;
  return { type: "function", function: { name: choice.name } };
}

function textConfig(text: NonNullable<Request["text"]>): Json {
  const out: Json = {};
  if (text.verbosity != null) out["verbosity"] = text.verbosity;
  const format = text.format;
  if (format == null || format.type === "text") return out;
  if (format.type !== "json_schema") return { ...out, response_format: { type: "json_object" } };
  const jsonSchema: Json = { name: format.name, schema: format.schema };
  if (format.description != null) jsonSchema["description"] = format.description;
  if (format.strict != null) jsonSchema["strict"] = format.strict;
  return { ...out, response_format: { type: "json_schema", json_schema: jsonSchema } };
}

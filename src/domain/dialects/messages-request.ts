import type { Static } from "@sinclair/typebox";
import { MessagesRequest } from "../../schema/messages.js";
import { compileBody } from "../body-check.js";
import { GatewayError } from "../errors.js";
import type { JsonObject } from "./json.js";

/**
 * The Messages dialect's request -> the canonical chat completion request (messages.ts says
 * where the two APIs differ, and why).
 */

function invalid(message: string): never {
  throw new GatewayError("invalid_request", message);
}

type Request = Static<typeof MessagesRequest>;
type Message = Request["messages"][number];
type ClientTool = NonNullable<Request["tools"]>[number];
type ImageSource = Extract<
  Extract<Message, { role: "user" }>["content"][number],
  { type: "image" }
>["source"];

/**
 * The request's shape, refusals included, is the schema's (src/schema/messages.ts): unknown
 * members, server tools, thinking and a system role are refused by the schema, each with a message
 * that says why (`x-error-message`), not by a check before it, so the document states every
 * refusal and the one validator cannot disagree with it. What follows trusts the typed value and
 * checks only what spans members: each tool_use answered by the next message, tool names and
 * tool_use ids unique, `tool_choice` naming a declared tool.
 */
const checkRequest = compileBody(MessagesRequest);

export function toCanonical(body: unknown): { chat: JsonObject; stream: boolean } {
  const request = checkRequest(body);
  const messages: JsonObject[] = [];
  if (request.system != null) {
    const text = textOf(request.system);
    if (text.length > 0) messages.push({ role: "system", content: text });
  }
  convertMessages(request.messages, messages);

  const chat: JsonObject = { model: request.model, messages, max_tokens: request.max_tokens };
  if (request.stop_sequences != null && request.stop_sequences.length > 0) {
    chat["stop"] = request.stop_sequences;
  }
  if (request.temperature != null) chat["temperature"] = request.temperature;
  if (request.top_p != null) chat["top_p"] = request.top_p;

  const tools = request.tools == null ? undefined : convertTools(request.tools);
  if (tools !== undefined) chat["tools"] = tools;
  if (request.tool_choice != null) convertToolChoice(request.tool_choice, tools, chat);

  const user = request.metadata?.user_id;
  if (user != null) chat["user"] = user;

  const stream = request.stream === true;
  if (stream) {
    chat["stream"] = true;
    chat["stream_options"] = { include_usage: true };
  }
  if (request.offer != null) chat["offer"] = request.offer;
  if (request.provider != null) chat["provider"] = request.provider;
  return { chat, stream };
}

/** `system` or a tool result's `content`: a string, or text blocks (joined by LF). */
function textOf(value: string | readonly { text: string }[]): string {
  return typeof value === "string" ? value : value.map((block) => block.text).join("\n");
}

function convertMessages(messages: readonly Message[], out: JsonObject[]): void {
  // The tool_use ids of the previous assistant message: the next message must answer each.
  let awaiting: Set<string> | undefined;
  let awaitingPath = "";
  messages.forEach((message, i) => {
    const path = `messages[${i}]`;
    if (message.role === "user") {
      userMessage(message.content, path, awaiting, awaitingPath, out);
      awaiting = undefined;
    } else {
      if (awaiting !== undefined) unanswered(awaiting, awaitingPath);
      awaiting = assistantMessage(message.content, path, out);
      awaitingPath = path;
    }
  });
  if (awaiting !== undefined) unanswered(awaiting, awaitingPath);
}

function unanswered(ids: Set<string>, path: string): never {
  const [id] = ids;
  invalid(
    `tool_use '${id}' in '${path}' has no tool_result: the next message must be a user ` +
      "message with a tool_result block for each tool_use",
  );
}

/** Tool results become `tool` messages (first, answering the assistant's calls), the rest one user message. */
function userMessage(
  content: Extract<Message, { role: "user" }>["content"],
  path: string,
  awaiting: Set<string> | undefined,
  awaitingPath: string,
  out: JsonObject[],
): void {
  if (typeof content === "string") {
    if (awaiting !== undefined) unanswered(awaiting, awaitingPath);
    out.push({ role: "user", content });
    return;
  }
  const parts: JsonObject[] = [];
  const answered = new Set<string>();
  content.forEach((block, j) => {
    if (block.type === "text") {
      parts.push({ type: "text", text: block.text });
    } else if (block.type === "image") {
      parts.push({ type: "image_url", image_url: { url: imageUrl(block.source) } });
    } else {
      const id = block.tool_use_id;
      if (awaiting === undefined || !awaiting.has(id) || answered.has(id)) {
        invalid(
          `'${path}.content[${j}]': tool_result '${id}' answers no tool_use of the previous assistant message`,
        );
      }
      answered.add(id);
      const text = block.content == null ? "" : textOf(block.content);
      out.push({
        role: "tool",
        tool_call_id: id,
        content: block.is_error === true ? `Error: ${text}` : text,
      });
    }
  });
  if (awaiting !== undefined) {
    for (const id of awaiting) if (!answered.has(id)) unanswered(new Set([id]), awaitingPath);
  }
  // Tool results only: no user message (the schema refuses an empty content array).
  if (parts.length === 0) return;
  const only = parts[0];
  out.push({
    role: "user",
    content: parts.length === 1 && only?.["type"] === "text" ? only["text"] : parts,
  });
}

/** An image block's source as a URL: a `data:` URL for base64 data, or the URL itself. */
function imageUrl(source: ImageSource): string {
  return source.type === "base64" ? `data:${source.media_type};base64,${source.data}` : source.url;
}

/** Text blocks become the content, tool_use blocks its tool calls; returns the tool_use ids. */
function assistantMessage(
  content: Extract<Message, { role: "assistant" }>["content"],
  path: string,
  out: JsonObject[],
): Set<string> | undefined {
  if (typeof content === "string") {
    out.push({ role: "assistant", content });
    return undefined;
  }
  const texts: string[] = [];
  const calls: JsonObject[] = [];
  const ids = new Set<string>();
  content.forEach((block, j) => {
    if (block.type === "text") {
      texts.push(block.text);
      return;
    }
    const { id, name, input } = block;
    if (ids.has(id)) invalid(`'${path}.content[${j}].id': tool_use id '${id}' is used twice`);
    ids.add(id);
    calls.push({ id, type: "function", function: { name, arguments: JSON.stringify(input) } });
  });
  const message: JsonObject = {
    role: "assistant",
    content: texts.length === 0 && calls.length > 0 ? null : texts.join("\n"),
  };
  if (calls.length > 0) message["tool_calls"] = calls;
  out.push(message);
  return ids.size > 0 ? ids : undefined;
}

function convertTools(tools: readonly ClientTool[]): JsonObject[] {
  const names = new Set<string>();
  return tools.map((tool, i) => {
    if (names.has(tool.name)) invalid(`'tools[${i}].name': tool '${tool.name}' is defined twice`);
    names.add(tool.name);
    const fn: JsonObject = { name: tool.name };
    if (tool.description != null) fn["description"] = tool.description;
    fn["parameters"] = tool.input_schema;
    if (tool.strict != null) fn["strict"] = tool.strict;
    return { type: "function", function: fn };
  });
}

function convertToolChoice(
  choice: NonNullable<Request["tool_choice"]>,
  tools: JsonObject[] | undefined,
  chat: JsonObject,
): void {
  const hasTools = tools !== undefined && tools.length > 0;
  if (choice.type === "tool") {
    if (!hasTools) invalid("'tool_choice' of type 'tool' needs 'tools'");
    const name = choice.name;
    if (!tools.some((t) => (t["function"] as JsonObject)["name"] === name)) {
      invalid(`'tool_choice.name': no tool named '${name}' in 'tools'`);
    }
    chat["tool_choice"] = { type: "function", function: { name } };
  } else if (choice.type === "any") {
    if (!hasTools) invalid("'tool_choice' of type 'any' needs 'tools'");
    chat["tool_choice"] = "required";
  } else {
    if (!hasTools) return;
    chat["tool_choice"] = choice.type;
  }
  if (choice.disable_parallel_tool_use === true && choice.type !== "none") {
    chat["parallel_tool_calls"] = false;
  }
}

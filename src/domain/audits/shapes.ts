import type { Hex } from "viem";
import type { JsonValue } from "../catalog.js";
import type { ChatRequest } from "../chat/request/index.js";

/**
 * What clients' requests look like to a provider, without what they say (issue 39, item 1):
 * the framing an audit request copies so that nothing but its prompt differs from a client's.
 * A shape keeps the dialect, the top-level members in their order, the parameters' values
 * (numbers, booleans, small enums: `temperature`, `max_tokens`, `stream`...), how the JSON is laid
 * out (a client's bytes reach the provider as written), and how the messages are framed (a
 * system message or not, text as a string or as parts). Never a message's text, a tool, a stop
 * string or a `user`.
 */

/** How a client lays its JSON out (what the provider sees of a plain chat body). */
export type JsonLayout =
  | { readonly kind: "compact" }
  /** `", "` and `": "` (Python's `json.dumps` default, so the OpenAI Python SDK's bodies). */
  | { readonly kind: "spaced" }
  /** One member per line, indented by `indent` spaces. */
  | { readonly kind: "pretty"; readonly indent: number };

export type ShapeDialect = "chat" | "messages" | "responses";

export interface RequestShape {
  readonly dialect: ShapeDialect;
  /** The canonical body's top-level members in their order (the gateway's own left out). */
  readonly members: readonly string[];
  /** The values of the parameter members (every member but `model` and `messages`). */
  readonly params: Readonly<Record<string, JsonValue>>;
  readonly layout: JsonLayout;
  /** The conversation starts with a system message. */
  readonly system: boolean;
  /** User text is sent as an array of text parts rather than a string. */
  readonly parts: boolean;
}

/**
 * Parameters an audit can copy: their values say nothing of the client (an audit that copied
 * `user`, a tool or a stop string would copy a client's content, or carry a value the provider
 * has seen from one client only). A shape with any other member is not copied.
 */
const copiable: ReadonlySet<string> = new Set([
  "model",
  "messages",
  "max_tokens",
  "max_completion_tokens",
  "stream",
  "stream_options",
  "temperature",
  "top_p",
  "top_k",
  "min_p",
  "presence_penalty",
  "frequency_penalty",
  "repetition_penalty",
  "seed",
  "n",
  "logprobs",
  "top_logprobs",
  "reasoning_effort",
]);

/** The gateway's own members: cut before the provider sees the body (upstream.ts). */
const gatewayMembers: ReadonlySet<string> = new Set(["offer", "provider"]);

/** Whether an audit may copy this shape's framing (no member that carries a client's content). */
export function copiableShape(shape: RequestShape): boolean {
  return shape.members.every((m) => copiable.has(m));
}

const SPACE = 0x20;
const NEWLINE = 0x0a;

function layoutOf(req: ChatRequest): JsonLayout {
  const { raw, members } = req;
  const first = members[0];
  if (first === undefined) return { kind: "compact" };
  // Between `{` and the first key: a newline and the indent of a pretty-printed body.
  let i = 1;
  while (i < first.keyStart && raw[i] !== NEWLINE) i += 1;
  if (i < first.keyStart) {
    let indent = 0;
    for (let j = i + 1; j < first.keyStart && raw[j] === SPACE; j += 1) indent += 1;
    return { kind: "pretty", indent };
  }
  return raw[first.valueStart - 1] === SPACE ? { kind: "spaced" } : { kind: "compact" };
}

function isParam(value: JsonValue): boolean {
  if (value === null || typeof value !== "object") return true;
  // `stream_options`: an object of booleans.
  return (
    !Array.isArray(value) && Object.values(value).every((v) => typeof v === "boolean" || v === null)
  );
}

/**
 * A client's request as a shape: `req` is the canonical chat request the pipeline parsed (a
 * dialect's request translated), `dialect` what the client wrote it in.
 */
export function shapeOf(req: ChatRequest, dialect: ShapeDialect): RequestShape {
  const members: string[] = [];
  const params: Record<string, JsonValue> = {};
  for (const member of req.members) {
    if (gatewayMembers.has(member.key)) continue;
    members.push(member.key);
    if (member.key === "model" || member.key === "messages") continue;
    // Only a copiable member's value is kept; any other member (a `user`, tools, a stop string)
    // keeps its name only: the shape is then not copiable, and nothing of the value is kept.
    const value = req.body[member.key];
    if (copiable.has(member.key) && value !== undefined && isParam(value))
      params[member.key] = value;
  }
  const first = req.messages[0];
  const user = req.messages.find((m) => m.role === "user");
  return {
    dialect,
    members,
    params,
    layout: dialect === "chat" ? layoutOf(req) : { kind: "compact" },
    system: first?.role === "system" || first?.role === "developer",
    parts: Array.isArray(user?.content),
  };
}

/**
 * The last {@link shapeSampleSize} shapes of each model's client requests, in memory (one process
 * sees enough traffic to know what its clients send; nothing of it is stored).
 */
export const shapeSampleSize = 64;

export interface ShapeSample {
  /** A client's request (the pipeline calls it once the model is known). */
  observe(
    modelId: Hex,
    req: ChatRequest,
    dialect: ShapeDialect | undefined,
    apiKeyId: string,
  ): void;
  /** The shapes kept for a model, oldest first. */
  shapes(modelId: Hex): readonly RequestShape[];
}

/**
 * The sample. Requests made with `ignoredKey` (the auditor's own API key id) are not observed:
 * audits copy clients, never themselves.
 */
export function createShapeSample(
  options: { ignoredKey?: () => string | undefined; size?: number } = {},
): ShapeSample {
  const size = options.size ?? shapeSampleSize;
  const byModel = new Map<Hex, RequestShape[]>();
  return {
    observe(modelId, req, dialect, apiKeyId) {
      if (apiKeyId === options.ignoredKey?.()) return;
      let ring = byModel.get(modelId);
      if (ring === undefined) byModel.set(modelId, (ring = []));
      ring.push(shapeOf(req, dialect ?? "chat"));
      if (ring.length > size) ring.shift();
    },
    shapes: (modelId) => byModel.get(modelId) ?? [],
  };
}

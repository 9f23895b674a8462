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
 * string or a `user`. Only admitted requests are seen, and an audit copies only what several
 * payers sent ({@link copiableShapes}): a provider that is also a client cannot plant a marker.
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
  /**
   * Parameters whose whole number the client wrote as a float (`1.0`, Python's habit for a
   * `float`; JavaScript writes `1`): an audit writes them so too (chat only: the other
   * dialects reach the provider as the gateway writes them).
   */
  readonly floats?: readonly string[];
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
const DOT = 0x2e;
const EXP = new Set([0x45, 0x65]);

/** Whether `member`'s value, a whole number, is written with a fraction or an exponent. */
function writtenAsFloat(req: ChatRequest, member: { valueStart: number; valueEnd: number }) {
  for (let i = member.valueStart; i < member.valueEnd; i += 1)
    if (req.raw[i] === DOT || EXP.has(req.raw[i]!)) return true;
  return false;
}

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
  const floats: string[] = [];
  for (const member of req.members) {
    if (gatewayMembers.has(member.key)) continue;
    members.push(member.key);
    if (member.key === "model" || member.key === "messages") continue;
    // Only a copiable member's value is kept; any other member (a `user`, tools, a stop string)
    // keeps its name only: the shape is then not copiable, and nothing of the value is kept.
    const value = req.body[member.key];
    if (copiable.has(member.key) && value !== undefined && isParam(value)) {
      params[member.key] = value;
      if (dialect === "chat" && Number.isSafeInteger(value) && writtenAsFloat(req, member))
        floats.push(member.key);
    }
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
    ...(floats.length > 0 && { floats }),
  };
}

/**
 * Distinct payers who must have sent a thing before an audit copies it. A provider that is also
 * a client could otherwise plant a marker: send requests carrying a value no one else sends
 * (`temperature` 0.123456, `max_tokens` 4093, a member order of its own) and answer honestly
 * whatever carries it but was not its own. Payers, not API keys: one payer makes keys at will,
 * while each payer is an address with a funded permit of the model (or an x402 payment). 3: a
 * value three payers chose is a habit, not one client's token, and a model with some traffic has
 * that many payers in its last {@link shapeSampleSize} requests. It is not a wall: a provider
 * that funds three addresses and pays for their requests can still plant a value no list holds
 * as common; the rule takes planting from free (one key, refused requests) to that.
 */
export const shapeMinPayers = 3;

/** Output limits clients write: powers of two from 16, and round numbers (10, 300, 2000...). */
const roundLimits: readonly number[] = [
  ...new Set([
    ...Array.from({ length: 14 }, (_, i) => 2 ** (i + 4)),
    ...Array.from({ length: 45 }, (_, i) => ((i % 9) + 1) * 10 ** (Math.floor(i / 9) + 1)),
  ]),
].sort((x, y) => x - y);

/**
 * Values so common that copying one says nothing of who sent it: the SDKs' and guides'
 * defaults and the values people round to. A value outside its member's list is copied only
 * once {@link shapeMinPayers} payers sent it; else a number becomes its list's nearest value
 * (`max_tokens` 4093 becomes 4096, `temperature` 0.03 becomes 0), and any other value (a
 * string, a boolean, an object) leaves the shape uncopied. Temperatures 0 and 1, the tests'
 * own, are in the list: an audit asks for them whoever else does.
 */
const commonValues: Readonly<Record<string, readonly JsonValue[]>> = {
  temperature: [0, 0.1, 0.2, 0.3, 0.5, 0.6, 0.7, 0.8, 1],
  top_p: [0.1, 0.5, 0.8, 0.9, 0.95, 1],
  top_k: [1, 10, 20, 40, 50, 100],
  min_p: [0, 0.01, 0.05, 0.1],
  presence_penalty: [0, 0.5, 1],
  frequency_penalty: [0, 0.5, 1],
  repetition_penalty: [1, 1.05, 1.1, 1.2],
  max_tokens: roundLimits,
  max_completion_tokens: roundLimits,
  n: [1],
  stream: [false, true],
  stream_options: [{ include_usage: true }],
  logprobs: [false],
  top_logprobs: [0, 1, 5, 10, 20],
  reasoning_effort: ["low", "medium", "high"],
};

/**
 * What an audit sends of a parameter's value: the value, but of a seed only its number of
 * digits (the audit sends a fresh seed as long; traffic.ts).
 */
function sentOf(member: string, value: JsonValue, shape?: RequestShape): string {
  if (member === "seed" && typeof value === "number" && Number.isSafeInteger(value) && value >= 10)
    return `${String(value).length} digits`;
  return shape?.floats?.includes(member) === true
    ? `${JSON.stringify(value)}.0`
    : JSON.stringify(value);
}

function isCommon(member: string, value: JsonValue): boolean {
  const sent = JSON.stringify(value);
  return commonValues[member]?.some((c) => JSON.stringify(c) === sent) ?? false;
}

/** The number in `member`'s common list nearest to `value` (the lower of two as near). */
function nearestCommon(member: string, value: JsonValue): number | undefined {
  if (typeof value !== "number") return undefined;
  let best: number | undefined;
  for (const c of commonValues[member] ?? [])
    if (
      typeof c === "number" &&
      (best === undefined || Math.abs(c - value) < Math.abs(best - value))
    )
      best = c;
  return best;
}

/** Distinct payers per key. */
class Payers extends Map<string, Set<string>> {
  add(key: string, payer: string): void {
    const set = this.get(key);
    if (set === undefined) this.set(key, new Set([payer]));
    else set.add(payer);
  }
  enough(key: string): boolean {
    return (this.get(key)?.size ?? 0) >= shapeMinPayers;
  }
}

/** A shape a client sent, and the payer who paid for it. */
export interface ObservedShape {
  readonly shape: RequestShape;
  readonly payer: string;
}

/**
 * `shape` with each value an audit may not copy as it is (neither common nor sent by enough
 * payers: `values`) made its nearest common value; undefined when one has none.
 */
function commonized(shape: RequestShape, values: Payers): RequestShape | undefined {
  let params: Record<string, JsonValue> | undefined;
  let floats = shape.floats;
  for (const [member, value] of Object.entries(shape.params)) {
    // A float's `.0` is as common as its number: both SDKs' habits.
    if (isCommon(member, value) || values.enough(`${member}=${sentOf(member, value, shape)}`))
      continue;
    const nearest = nearestCommon(member, value);
    if (nearest === undefined) return undefined;
    (params ??= { ...shape.params })[member] = nearest;
    floats = floats?.filter((f) => f !== member);
  }
  if (params === undefined) return shape;
  return { ...shape, params, ...(floats !== undefined && { floats }) };
}

/** Everything of a shape an audit body carries (traffic.ts `auditBody`), as one key. */
function framingOf(shape: RequestShape): string {
  const { dialect, members, layout, system, parts, params } = shape;
  const values = members.map((m) => (m in params ? sentOf(m, params[m]!, shape) : null));
  return JSON.stringify([dialect, members, layout, system, parts, values]);
}

/**
 * The shapes an audit may copy, from what clients sent (issue 39: no marker a provider planted
 * reaches an audit). Per value: a value is copied when it is common or
 * {@link shapeMinPayers} payers sent it (to this model, in the sample), else replaced by its
 * nearest common value, else the shape is left out. Then the whole shape, values replaced, with
 * its dialect, its members in their order, its layout and message framing: it is copied only
 * when that many payers sent it (or what became it). Values each common can still mark in
 * combination (`temperature` 0.3, `top_p` 0.5, `max_tokens` 700 together), and so can an order
 * of members or an indent of one client's: only the whole, seen from several payers, says
 * nothing of any one. One entry per request, so a frequent framing is copied as often as it is
 * sent.
 */
export function copiableShapes(observed: readonly ObservedShape[]): RequestShape[] {
  const values = new Payers();
  for (const { shape, payer } of observed)
    for (const [member, value] of Object.entries(shape.params))
      values.add(`${member}=${sentOf(member, value, shape)}`, payer);
  const made: { shape: RequestShape; key: string }[] = [];
  const framings = new Payers();
  for (const { shape, payer } of observed) {
    const common = copiableShape(shape) ? commonized(shape, values) : undefined;
    if (common === undefined) continue;
    const key = framingOf(common);
    framings.add(key, payer);
    made.push({ shape: common, key });
  }
  return made.filter((m) => framings.enough(m.key)).map((m) => m.shape);
}

/**
 * The last {@link shapeSampleSize} shapes of each model's client requests, in memory (one process
 * sees enough traffic to know what its clients send; nothing of it is stored).
 */
export const shapeSampleSize = 64;

export interface ShapeSample {
  /**
   * A client's request, admitted: the pipeline calls it once the request is reserved on its
   * permit (a refused request plants nothing), with the payer paying for it.
   */
  observe(
    modelId: Hex,
    req: ChatRequest,
    dialect: ShapeDialect | undefined,
    apiKeyId: string,
    payer: Hex,
  ): void;
  /** The shapes an audit of the model may copy ({@link copiableShapes}), oldest first. */
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
  const byModel = new Map<Hex, ObservedShape[]>();
  return {
    observe(modelId, req, dialect, apiKeyId, payer) {
      if (apiKeyId === options.ignoredKey?.()) return;
      let ring = byModel.get(modelId);
      if (ring === undefined) byModel.set(modelId, (ring = []));
      ring.push({ shape: shapeOf(req, dialect ?? "chat"), payer: payer.toLowerCase() });
      if (ring.length > size) ring.shift();
    },
    shapes: (modelId) => copiableShapes(byModel.get(modelId) ?? []),
  };
}

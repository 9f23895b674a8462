import { randomInt } from "node:crypto";
import type { Hex } from "viem";
import type { JsonValue } from "../catalog.js";
import { hashSeed, seededRandom } from "./random.js";
import { firstToken } from "./statistics.js";
import type { AuditSample, AuditTestName } from "./types.js";
import { copiableShape, type JsonLayout, type RequestShape, type ShapeDialect } from "./shapes.js";

/**
 * The audit traffic's choices (issue 39, item 1; DESIGN.md section 12), pure: when the next audit
 * goes, to which offer, which test, which prompt, and the exact body it sends. The runner
 * (runner.ts) sends it through the gateway's own inference path, paid by the operator's audit
 * permit, like any client's request.
 *
 * Blindness is the rule every choice here keeps: a provider sees nothing but the body and the
 * arrival time, so the body is framed as a recent client's request of the model was (shapes.ts),
 * only its prompt comes from the corpus, and arrivals form a Poisson process (independent
 * exponential gaps): merged with clients' traffic, an audit's arrival says nothing of it. An
 * audit never comes in a burst (an MMD batch's samples are separate audits, each at its own
 * random time).
 */

/** A source of uniform numbers in [0, 1): crypto-strong in production, seeded in tests. */
export type Random = () => number;

/** Uniform [0, 1) from the system's cryptographic source (a provider cannot predict the choices). */
export const cryptoRandom: Random = () => randomInt(0, 2 ** 48) / 2 ** 48;

// ---------------------------------------------------------------- the corpus

/** One turn of a corpus conversation (user and assistant alternate, the user first and last). */
export interface CorpusTurn {
  readonly role: "user" | "assistant";
  readonly content: string;
}

export interface CorpusPrompt {
  readonly id: string;
  /** BCP 47 language tag (`en`, `es`, `fr`, `de`, `zh`, `ja`...). */
  readonly lang: string;
  /** question, summarise, code, rewrite, chat, extract, translate, probe... */
  readonly task: string;
  readonly system?: string | undefined;
  readonly turns: readonly CorpusTurn[];
}

/** The shipped prompts (src/adapters/audits/data/, pinned by SHA-256). */
export interface AuditCorpus {
  readonly prompts: readonly CorpusPrompt[];
  /** Short-answer prompts: border-input candidates where no model's own were found yet. */
  readonly probes: readonly CorpusPrompt[];
  /** Ordinary system messages by language, for shapes whose clients send one. */
  readonly systems: Readonly<Record<string, readonly string[]>>;
  /** Border inputs found black-box on a model's anchor (top-1 near ties), by ModelID. */
  readonly borders: ReadonlyMap<Hex, readonly CorpusPrompt[]>;
  /** Reference mean log-probabilities per fixed sequence, by ModelID (types.ts). */
  readonly referenceLogprobs: ReadonlyMap<Hex, ReadonlyMap<string, number>>;
}

/** Prompts an MMD batch of a model uses in one period: the same for every offer and the anchor. */
export const mmdPromptsPerPeriod = 25;
/** The MMD batch's period (a week, as Model Equality Testing's audits run). */
export const mmdPeriodMs = 7 * 86_400_000;

/**
 * The MMD prompts of a model in the period holding `nowMs`: a fixed draw from the corpus (the
 * same for every offer of the model and every process), so each prompt collects samples from
 * every offer and from the reference.
 */
export function mmdPrompts(corpus: AuditCorpus, modelId: Hex, nowMs: number): CorpusPrompt[] {
  return periodDraw(corpus, modelId, nowMs, mmdPromptsPerPeriod);
}

/** `count` corpus prompts drawn for the period holding `nowMs`, seeded by `key` and the period. */
function periodDraw(
  corpus: AuditCorpus,
  key: string,
  nowMs: number,
  count: number,
): CorpusPrompt[] {
  const period = Math.floor(nowMs / mmdPeriodMs);
  const rng = seededRandom(hashSeed(`${key}:${period}`));
  const pool = [...corpus.prompts];
  const picked: CorpusPrompt[] = [];
  while (picked.length < count && pool.length > 0) {
    picked.push(pool.splice(Math.floor(rng() * pool.length), 1)[0]!);
  }
  return picked;
}

/** The border inputs of a model: its own, found on its anchor, else the corpus's candidates. */
export function borderPrompts(corpus: AuditCorpus, modelId: Hex): readonly CorpusPrompt[] {
  const own = corpus.borders.get(modelId);
  return own !== undefined && own.length > 0 ? own : corpus.probes;
}

/** Answers at temperature 0 a candidate needs on the reference before it can be judged a near-tie. */
export const borderMinAnswers = 3;
/** Share of border probes asked from the near-ties found (the rest go on searching). */
export const borderFoundShare = 0.75;

/**
 * Border inputs found black-box on the reference (B3IT): the candidates whose temperature-0
 * answers, asked at least {@link borderMinAnswers} times, began with two or more different
 * tokens. Only a near-tie of the top tokens flips at temperature 0 (kernel noise, batching), and
 * a near-tie is where another model's top token most often differs. `samples`: the reference's
 * (the anchor's, or every offer's of a model without one).
 */
export function foundBorders(samples: readonly AuditSample[]): Set<string> {
  const answers = new Map<string, { count: number; first: Set<string> }>();
  for (const s of samples) {
    if (s.test !== "border_probe") continue;
    const entry = answers.get(s.promptId) ?? { count: 0, first: new Set<string>() };
    entry.count += 1;
    entry.first.add(firstToken(s.text ?? ""));
    answers.set(s.promptId, entry);
  }
  const found = new Set<string>();
  for (const [promptId, { count, first }] of answers)
    if (count >= borderMinAnswers && first.size >= 2) found.add(promptId);
  return found;
}

/**
 * The prompt a border probe asks: mostly one of the near-ties found on the reference, else any
 * candidate (the search goes on, and probes stay as varied as before).
 */
export function pickBorderPrompt(
  rng: Random,
  candidates: readonly CorpusPrompt[],
  found: ReadonlySet<string> | undefined,
): CorpusPrompt | undefined {
  const ties = found === undefined ? [] : candidates.filter((p) => found.has(p.id));
  return ties.length > 0 && rng() < borderFoundShare ? pick(rng, ties) : pick(rng, candidates);
}

// ---------------------------------------------------------------- scheduling

/** An offer audited: an active offer of a model the operator's audit permit pays for. */
export interface AuditTarget {
  readonly modelId: Hex;
  /** The model's public id, as clients name it in `model`. */
  readonly modelName: string;
  readonly offerId: Hex;
  readonly permitId: Hex;
  /** Its verification proved the `logprobs` feature: logprob challenges may go to it. */
  readonly logprobs?: boolean | undefined;
}

/**
 * The gap before the next audit (ms): exponential with mean `86_400_000 / (perOfferPerDay ×
 * targets)`, so each target is audited `perOfferPerDay` times a day on average, at times no one
 * can predict. Infinity when there is nothing to audit.
 */
export function nextGapMs(rng: Random, perOfferPerDay: number, targets: number): number {
  if (targets <= 0 || perOfferPerDay <= 0) return Number.POSITIVE_INFINITY;
  const meanMs = 86_400_000 / (perOfferPerDay * targets);
  // 1 - u is in (0, 1]: the logarithm is finite.
  return -Math.log(1 - rng()) * meanMs;
}

export function pick<T>(rng: Random, items: readonly T[]): T | undefined {
  return items.length === 0 ? undefined : items[Math.floor(rng() * items.length)];
}

/**
 * The tests the traffic runs, and their temperature. `logprob` scores a temperature-0 answer's
 * log-probabilities (logprobs.ts), so it goes only to offers whose verification proved the
 * `logprobs` feature, framed as a client's request that asked for them.
 */
export const trafficTests = {
  border_probe: { temperature: 0 },
  mmd: { temperature: 1 },
  logprob: { temperature: 0 },
} as const satisfies Record<AuditTestName, { temperature: number }>;

export type TrafficTest = keyof typeof trafficTests;

/** Share of an offer's audits that score log-probabilities, when it exposes them. */
export const logprobShare = 0.25;

/**
 * Border probes are half the audits (about 50–100 a day per offer at the default rate), MMD
 * completions the other half; of an offer that exposes log-probabilities, a quarter are
 * logprob challenges first (`withLogprobs`).
 */
export function pickTest(rng: Random, withLogprobs = false): TrafficTest {
  if (withLogprobs && rng() < logprobShare) return "logprob";
  return rng() < 0.5 ? "border_probe" : "mmd";
}

/** Sequences the logprob test scores per period when the model has no shipped reference. */
export const logprobPromptsPerPeriod = 20;

/**
 * The prompts a model's logprob challenges ask in the period holding `nowMs`: the sequences of
 * its shipped reference (corpus.ts `reference/`; ids `<prompt id>#<tokens>`) when it has one,
 * else a fixed draw of the corpus (the same for every offer and the anchor, whose answers are
 * then the reference).
 */
export function logprobPrompts(corpus: AuditCorpus, modelId: Hex, nowMs: number): CorpusPrompt[] {
  const shipped = corpus.referenceLogprobs.get(modelId);
  if (shipped !== undefined && shipped.size > 0) {
    const ids = new Set([...shipped.keys()].map(sequencePrompt));
    return corpus.prompts.filter((p) => ids.has(p.id));
  }
  return periodDraw(corpus, `${modelId}:logprob`, nowMs, logprobPromptsPerPeriod);
}

/** A logprob sequence's id: the prompt and how many tokens of the answer were scored. */
export function sequenceId(promptId: string, tokens: number): string {
  return `${promptId}#${tokens}`;
}

/** The prompt a sequence id names. */
export function sequencePrompt(sequence: string): string {
  const at = sequence.lastIndexOf("#");
  return at < 0 ? sequence : sequence.slice(0, at);
}

/**
 * The framing an audit of `test` copies: a recent client's shape of the model that carries no
 * content and asks for the test's temperature. Undefined when no client of the model sent one:
 * the audit then waits (a framing no client uses would tell the provider what it is).
 */
export function pickShape(
  rng: Random,
  shapes: readonly RequestShape[],
  test: TrafficTest,
): RequestShape | undefined {
  return pick(
    rng,
    shapes.filter((s) => fitsTest(s, test)),
  );
}

/** Whether an audit of `test` may copy `shape`: no content, and the test's temperature. */
function fitsTest(shape: RequestShape, test: TrafficTest): boolean {
  return (
    copiableShape(shape) &&
    shape.params["temperature"] === trafficTests[test].temperature &&
    // A logprob challenge copies a chat client that asked for log-probabilities.
    (test !== "logprob" || (shape.dialect === "chat" && shape.params["logprobs"] === true))
  );
}

/**
 * The test of an audit of `target`: a logprob challenge only when the offer exposes
 * log-probabilities and a client's framing asked for them (else that quarter of its audits
 * would find nothing to copy and go unsent), else a border probe or an MMD completion.
 */
export function pickAuditTest(
  rng: Random,
  target: AuditTarget,
  shapes: readonly RequestShape[],
): TrafficTest {
  return pickTest(rng, target.logprobs === true && shapes.some((s) => fitsTest(s, "logprob")));
}

// ---------------------------------------------------------------- the body

export interface AuditBody {
  readonly dialect: ShapeDialect;
  readonly bytes: Uint8Array;
}

const encoder = new TextEncoder();

/**
 * JSON laid out as a client of `layout` writes it, the whole numbers of the top-level members
 * `floats` written as floats (`1.0`). Those are written as placeholder strings first (a NUL
 * and the number: no corpus text holds a NUL), then as the float.
 */
export function serialize(
  value: JsonValue,
  layout: JsonLayout,
  floats: readonly string[] = [],
): string {
  const top = value as Record<string, JsonValue>;
  const marked = floats.filter((m) => Number.isSafeInteger(top[m]));
  const body =
    marked.length === 0
      ? value
      : { ...top, ...Object.fromEntries(marked.map((m) => [m, `\u0000${String(top[m])}`])) };
  const text = laidOut(body, layout);
  return marked.length === 0 ? text : text.replace(/"\\u0000(-?\d+)"/g, "$1.0");
}

function laidOut(value: JsonValue, layout: JsonLayout): string {
  if (layout.kind === "compact") return JSON.stringify(value);
  if (layout.kind === "pretty") return JSON.stringify(value, null, layout.indent);
  const walk = (v: JsonValue): string => {
    if (v === null || typeof v !== "object") return JSON.stringify(v);
    if (Array.isArray(v)) return `[${v.map(walk).join(", ")}]`;
    return `{${Object.entries(v)
      .map(([k, x]) => `${JSON.stringify(k)}: ${walk(x)}`)
      .join(", ")}}`;
  };
  return walk(value);
}

/** A seed like a client's: a fresh random integer of the same number of digits. */
function freshSeed(rng: Random, like: JsonValue): JsonValue {
  if (typeof like !== "number" || !Number.isSafeInteger(like) || like < 10) return like;
  const digits = String(Math.abs(like)).length;
  const low = 10 ** (digits - 1);
  return low + Math.floor(rng() * (9 * low));
}

function systemOf(
  corpus: AuditCorpus,
  rng: Random,
  prompt: CorpusPrompt,
  shape: RequestShape,
): string | undefined {
  if (!shape.system) return undefined;
  return prompt.system ?? pick(rng, corpus.systems[prompt.lang] ?? corpus.systems["en"] ?? []);
}

/**
 * The body of one audit: `prompt` framed as `shape` is, in the shape's dialect, for the model
 * clients name `modelName`. The offer is not named in it (a quote pins the audit, and the
 * gateway's own members never reach a provider anyway).
 */
export function auditBody(
  corpus: AuditCorpus,
  rng: Random,
  input: { shape: RequestShape; prompt: CorpusPrompt; modelName: string },
): AuditBody {
  const { shape, prompt, modelName } = input;
  const system = systemOf(corpus, rng, prompt, shape);
  const params: Record<string, JsonValue> = { ...shape.params };
  if ("seed" in params) params["seed"] = freshSeed(rng, params["seed"]!);
  let body: Record<string, JsonValue>;
  if (shape.dialect === "messages") body = messagesBody(modelName, prompt, system, shape, params);
  else if (shape.dialect === "responses")
    body = responsesBody(modelName, prompt, system, shape, params);
  else body = chatBody(modelName, prompt, system, shape, params);
  if (shape.dialect !== "chat")
    return { dialect: shape.dialect, bytes: encoder.encode(serialize(body, { kind: "compact" })) };
  return {
    dialect: shape.dialect,
    bytes: encoder.encode(serialize(body, shape.layout, shape.floats)),
  };
}

function chatBody(
  modelName: string,
  prompt: CorpusPrompt,
  system: string | undefined,
  shape: RequestShape,
  params: Record<string, JsonValue>,
): Record<string, JsonValue> {
  const messages: JsonValue[] = [];
  if (system !== undefined) messages.push({ role: "system", content: system });
  for (const turn of prompt.turns) {
    const parts = shape.parts && turn.role === "user";
    messages.push({
      role: turn.role,
      content: parts ? [{ type: "text", text: turn.content }] : turn.content,
    });
  }
  const body: Record<string, JsonValue> = {};
  for (const member of shape.members) {
    if (member === "model") body[member] = modelName;
    else if (member === "messages") body[member] = messages;
    else if (member in params) body[member] = params[member]!;
  }
  return body;
}

/** The Messages dialect's body that translates to the shape's canonical members. */
function messagesBody(
  modelName: string,
  prompt: CorpusPrompt,
  system: string | undefined,
  shape: RequestShape,
  params: Record<string, JsonValue>,
): Record<string, JsonValue> {
  const body: Record<string, JsonValue> = { model: modelName };
  body["max_tokens"] = params["max_tokens"] ?? 1024;
  if (system !== undefined) body["system"] = system;
  body["messages"] = prompt.turns.map((turn) => ({
    role: turn.role,
    content: shape.parts ? [{ type: "text", text: turn.content }] : turn.content,
  }));
  for (const key of ["temperature", "top_p"]) if (key in params) body[key] = params[key]!;
  if (params["stream"] === true) body["stream"] = true;
  return body;
}

/** The Responses dialect's body that translates to the shape's canonical members. */
function responsesBody(
  modelName: string,
  prompt: CorpusPrompt,
  system: string | undefined,
  shape: RequestShape,
  params: Record<string, JsonValue>,
): Record<string, JsonValue> {
  const body: Record<string, JsonValue> = { model: modelName };
  if (system !== undefined) body["instructions"] = system;
  body["input"] = prompt.turns.map((turn) => ({
    role: turn.role,
    content: shape.parts
      ? [{ type: turn.role === "user" ? "input_text" : "output_text", text: turn.content }]
      : turn.content,
  }));
  if ("max_completion_tokens" in params)
    body["max_output_tokens"] = params["max_completion_tokens"]!;
  for (const key of ["temperature", "top_p"]) if (key in params) body[key] = params[key]!;
  if (typeof params["reasoning_effort"] === "string")
    body["reasoning"] = { effort: params["reasoning_effort"] };
  body["stream"] = params["stream"] === true;
  return body;
}

// ---------------------------------------------------------------- the answer

/** The characters of an answer the statistics read (Model Equality Testing: the first 100). */
export const sampleChars = 100;

/**
 * The visible text of one event of an answer, as its dialect carries it: a chat completion
 * (JSON or chunk), a Messages event, a Responses event. Undefined when it carries none.
 */
export function answerText(dialect: ShapeDialect, data: unknown, event?: string): string {
  if (typeof data !== "object" || data === null) return "";
  const d = data as Record<string, unknown>;
  if (dialect === "chat") {
    const choice = (d["choices"] as Record<string, unknown>[] | undefined)?.[0];
    const delta = (choice?.["delta"] ?? choice?.["message"]) as Record<string, unknown> | undefined;
    return typeof delta?.["content"] === "string" ? delta["content"] : "";
  }
  if (dialect === "messages") {
    if (event === "content_block_delta" || d["type"] === "content_block_delta") {
      const delta = d["delta"] as Record<string, unknown> | undefined;
      return typeof delta?.["text"] === "string" ? delta["text"] : "";
    }
    const content = d["type"] === "message" ? (d["content"] as unknown[] | undefined) : undefined;
    return textBlocks(content);
  }
  if (event === "response.output_text.delta" || d["type"] === "response.output_text.delta")
    return typeof d["delta"] === "string" ? d["delta"] : "";
  if (d["object"] === "response" && event === undefined) {
    const output = (d["output"] as Record<string, unknown>[] | undefined) ?? [];
    return output.map((item) => textBlocks(item["content"] as unknown[] | undefined)).join("");
  }
  return "";
}

function textBlocks(blocks: unknown[] | undefined): string {
  return (blocks ?? [])
    .map((b) => (b as Record<string, unknown>)["text"])
    .filter((t): t is string => typeof t === "string")
    .join("");
}

import type { TokenCounter } from "../tokens.js";
import { boundBytesPerToken } from "../tokens.js";

/**
 * The gateway's own count of an answer's output (DESIGN.md section 10), and the priced limit
 * held to: every choice's visible output (reasoning, content, refusals, tool-call names and
 * arguments) is kept as it passes, counted with the model's tokenizer at the close, and cut
 * where it passes the limit that was priced (the choice then ends with `finish_reason:
 * "length"`).
 *
 * Per event the tally only appends strings and adds their UTF-8 lengths; it tokenizes during a
 * stream only once a choice's bytes could hold more tokens than its limit (no token is shorter
 * than a byte), and then only the text since the last count, so an answer well inside its limit
 * is tokenized once, at the close.
 */

/** The fields of a delta (or message) that carry visible output, in the order they are kept. */
const textFields = ["reasoning_content", "reasoning", "content", "refusal"] as const;
const reasoningFields = new Set<string>(["reasoning_content", "reasoning"]);

type Json = Record<string, unknown>;

/**
 * The largest text tokenized as one segment (1 MiB, some 250,000 tokens, far above any model's
 * output limit): a longer one is counted by its bytes, the sound bound, so that a huge answer
 * cannot hold the event loop for seconds in the tokenizer (docs/decisions/metering-and-tokens.md).
 */
export const exactSegmentMaxBytes = 1 << 20;

/**
 * A stream's text is counted as it passes in segments of about this many bytes (64 KiB, some
 * 16,000 tokens: tens of milliseconds in the tokenizer), so that a long stream costs the event
 * loop short, spread steps rather than one long count at its limit or its close.
 */
export const streamSegmentBytes = 64 * 1024;

interface ChoiceOutput {
  /**
   * The visible output not yet committed to `committedTokens`, in arrival order, and its
   * reasoning part alone: at most about {@link streamSegmentBytes} of a stream (a long answer is
   * not held whole; DESIGN.md 8, bounded memory).
   */
  readonly parts: string[];
  readonly reasoning: string[];
  /** UTF-8 bytes of everything taken, committed or not. */
  bytes: number;
  /** Tokens and bytes of the segments counted and let go, and their reasoning tokens. */
  committedTokens: bigint;
  committedBytes: number;
  committedReasoning: bigint;
  /** The count of `parts` as they were when last counted (its length and bytes then). */
  pending: { readonly parts: number; readonly bytes: number; readonly tokens: bigint } | undefined;
  /** The field of the last piece: a piece of another field is counted after a line break. */
  field: string;
  /** Distinct tool calls (by their stream index, or position in a message). */
  readonly toolCalls: Set<number>;
  /** The choice reached its limit: later output of it is dropped. */
  cut: boolean;
}

/** What the gateway counted of an answer's output. */
export interface OutputCount {
  readonly outputTokens: bigint;
  readonly reasoningTokens: bigint;
  readonly choices: bigint;
  readonly toolCalls: bigint;
}

export class OutputTally {
  private readonly choices = new Map<number, ChoiceOutput>();
  private cutChoices = 0;

  /**
   * @param counter the model's token counter.
   * @param limit the priced output limit of one choice.
   * @param expectedChoices how many choices the request asked for (`n`).
   */
  constructor(
    private readonly counter: TokenCounter,
    private readonly limit: bigint,
    private readonly expectedChoices: bigint,
  ) {}

  /** Every choice the request asked for reached its limit: nothing more is to be read. */
  get done(): boolean {
    return BigInt(this.cutChoices) >= this.expectedChoices;
  }

  /** Whether any choice was cut at its limit. */
  get anyCut(): boolean {
    return this.cutChoices > 0;
  }

  /**
   * Takes a stream chunk (parsed). Returns the chunk to relay: the same object when nothing of
   * it passes a limit; a copy with its output cut and `finish_reason: "length"` where a choice
   * reached its limit; `undefined` when everything it carried belongs to choices already cut.
   */
  addChunk(chunk: unknown): unknown {
    const choices = (chunk as { choices?: unknown } | null)?.choices;
    if (!Array.isArray(choices) || choices.length === 0) return chunk;
    let changed: unknown[] | undefined;
    for (let i = 0; i < choices.length; i += 1) {
      const choice = choices[i] as Json | null;
      const delta = choice?.["delta"];
      if (typeof delta !== "object" || delta === null) continue;
      const state = this.choice(indexOf(choice!, i));
      const replacement = state.cut ? null : this.take(state, delta as Json);
      if (replacement === undefined) continue;
      changed ??= choices.slice();
      changed[i] =
        replacement === null
          ? null
          : { ...choice, delta: replacement, finish_reason: "length" as const };
    }
    if (changed === undefined) return chunk;
    const kept = changed.filter((c) => c !== null);
    if (kept.length === 0) return undefined;
    return { ...(chunk as Json), choices: kept };
  }

  /**
   * Takes a JSON answer (parsed). Returns whether it was cut: then its choices that passed the
   * limit were changed in place (output cut, `finish_reason: "length"`).
   */
  addAnswer(body: unknown): boolean {
    const choices = (body as { choices?: unknown } | null)?.choices;
    if (!Array.isArray(choices)) return false;
    let cut = false;
    for (let i = 0; i < choices.length; i += 1) {
      const choice = choices[i] as Json | null;
      const message = choice?.["message"];
      if (typeof message !== "object" || message === null) continue;
      const state = this.choice(indexOf(choice!, i));
      const replacement = state.cut ? undefined : this.take(state, message as Json);
      if (replacement !== undefined && replacement !== null) {
        choice!["message"] = replacement;
        choice!["finish_reason"] = "length";
        cut = true;
      }
    }
    return cut;
  }

  /** The gateway's count of the output so far (at the close: of the whole answer). */
  count(): OutputCount {
    let outputTokens = 0n;
    let reasoningTokens = 0n;
    let choices = 0n;
    let toolCalls = 0n;
    for (const state of this.choices.values()) {
      if (state.bytes === 0 && state.toolCalls.size === 0) continue;
      choices += 1n;
      toolCalls += BigInt(state.toolCalls.size);
      outputTokens += this.tokensOf(state);
      reasoningTokens += state.committedReasoning;
      if (state.reasoning.length > 0)
        reasoningTokens += countText(this.counter, state.reasoning.join(""));
    }
    return { outputTokens, reasoningTokens, choices, toolCalls };
  }

  private choice(index: number): ChoiceOutput {
    let state = this.choices.get(index);
    if (state === undefined) {
      state = {
        parts: [],
        reasoning: [],
        bytes: 0,
        committedTokens: 0n,
        committedBytes: 0,
        committedReasoning: 0n,
        pending: undefined,
        field: "",
        toolCalls: new Set(),
        cut: false,
      };
      this.choices.set(index, state);
    }
    return state;
  }

  /**
   * The choice's tokens: the segments committed, plus the text since, counted as one segment
   * (remembered until more text comes). A text over {@link exactSegmentMaxBytes} is counted by
   * its bytes. A word split between two segments may count a token more: within tolerance.
   */
  private tokensOf(state: ChoiceOutput): bigint {
    if (state.pending?.parts !== state.parts.length) {
      const bytes = state.bytes - state.committedBytes;
      const tokens =
        bytes > exactSegmentMaxBytes
          ? BigInt(bytes)
          : state.parts.length === 0
            ? 0n
            : countText(this.counter, state.parts.join(""));
      state.pending = { parts: state.parts.length, bytes: state.bytes, tokens };
    }
    return state.committedTokens + state.pending.tokens;
  }

  /** Counts the text held and lets it go: a long stream is held a segment at a time. */
  private commit(state: ChoiceOutput): void {
    state.committedTokens = this.tokensOf(state);
    state.committedBytes = state.bytes;
    if (state.reasoning.length > 0)
      state.committedReasoning += countText(this.counter, state.reasoning.join(""));
    state.parts.length = 0;
    state.reasoning.length = 0;
    state.pending = undefined;
  }

  /**
   * Appends a delta's (or message's) output to its choice. Returns `undefined` while the choice
   * is within its limit, else the delta cut to it (the choice is then cut).
   */
  private take(state: ChoiceOutput, delta: Json): Json | undefined {
    const pieces = piecesOf(delta, state.toolCalls);
    if (pieces.length === 0) return undefined;
    const before = state.parts.length;
    const reasoningBefore = state.reasoning.length;
    const fieldBefore = state.field;
    let added = 0;
    for (const piece of pieces) {
      // Fields are counted apart (a tool's name does not merge with its arguments), as the
      // model's own markup keeps them apart.
      const text = separated(state, piece.field) + piece.text;
      state.parts.push(text);
      if (reasoningFields.has(piece.field)) state.reasoning.push(piece.text);
      added += Buffer.byteLength(text, "utf8");
    }
    state.bytes += added;
    if (!this.passes(state)) {
      if (this.counter.exact && state.bytes - state.committedBytes >= streamSegmentBytes)
        this.commit(state);
      return undefined;
    }
    // Past the limit: the text held (since the last commit) is cut to the tokens left; this
    // delta keeps what the earlier, already relayed parts of it left. The byte bound holds its
    // whole text (it never commits) and cuts it by bytes.
    const left = this.limit - state.committedTokens;
    const sentBefore = state.parts.slice(0, before).join("");
    const segment = state.parts.join("");
    const kept =
      this.counter.exact && state.bytes - state.committedBytes > exactSegmentMaxBytes
        ? utf8Prefix(segment, left > 0n ? left : 0n)
        : this.counter.truncate(segment, left > 0n ? left : 0n);
    let room = Math.max(0, kept.length - sentBefore.length);
    state.parts.length = before;
    state.reasoning.length = reasoningBefore;
    state.field = fieldBefore;
    state.pending = undefined;
    const cutDelta = cutPieces(delta, (text, field) => {
      const separator = field === state.field || state.parts.length === 0 ? "" : "\n";
      if (room <= separator.length) {
        room = 0;
        return "";
      }
      room -= separator.length;
      const keep = text.slice(0, room);
      room -= keep.length;
      state.parts.push(separator + keep);
      state.field = field;
      return keep;
    });
    // The reasoning this delta kept, for its own count; the bytes of what was kept.
    state.reasoning.push(...reasoningOf(cutDelta));
    state.bytes = state.committedBytes + Buffer.byteLength(state.parts.join(""), "utf8");
    state.cut = true;
    this.cutChoices += 1;
    return cutDelta;
  }

  /** Whether the choice's output now passes its limit (counted only when it might). */
  private passes(state: ChoiceOutput): boolean {
    const { counter, limit } = this;
    if (!counter.exact) return BigInt(state.bytes) > limit * boundBytesPerToken;
    // No token is shorter than a byte: until the bytes since the last count exceed the tokens
    // left, the limit cannot have been passed.
    const counted = state.pending ?? { bytes: state.committedBytes, tokens: 0n };
    const left = limit - state.committedTokens - counted.tokens;
    if (BigInt(state.bytes - counted.bytes) <= left) return false;
    return this.tokensOf(state) > limit;
  }
}

/** A run of this many characters without a space is counted by its bytes (see countText). */
export const longRunChars = 256;
const longRuns = new RegExp(`\\S{${longRunChars},}`, "g");

/**
 * The tokens of `text` by `counter`, except that each run of {@link longRunChars} or more
 * characters without a space counts its UTF-8 bytes, an upper bound: byte-pair merging is slow
 * on such runs (a 64 KiB run of one letter takes some 200 ms), which a provider could send to
 * spend the gateway's CPU; a higher count never charges an honest claim less.
 */
export function countText(counter: TokenCounter, text: string): bigint {
  if (text.length < longRunChars) return counter.countOutput(text);
  let tokens = 0n;
  let rest = "";
  let from = 0;
  for (const run of text.matchAll(longRuns)) {
    rest += text.slice(from, run.index);
    tokens += BigInt(Buffer.byteLength(run[0], "utf8"));
    from = run.index + run[0].length;
  }
  if (from === 0) return counter.countOutput(text);
  return tokens + counter.countOutput(rest + text.slice(from));
}

/** The longest prefix of `text` of at most `bytes` UTF-8 bytes, never splitting a character. */
function utf8Prefix(text: string, bytes: bigint): string {
  const encoded = Buffer.from(text, "utf8");
  if (BigInt(encoded.length) <= bytes) return text;
  let end = Number(bytes);
  while (end > 0 && (encoded[end]! & 0xc0) === 0x80) end -= 1;
  return encoded.subarray(0, end).toString("utf8");
}

/** The line break that parts a piece of another field from the output before it. */
function separated(state: ChoiceOutput, field: string): string {
  const separator = field === state.field || state.parts.length === 0 ? "" : "\n";
  state.field = field;
  return separator;
}

function indexOf(choice: Json, position: number): number {
  const index = choice["index"];
  return typeof index === "number" && Number.isSafeInteger(index) ? index : position;
}

interface Piece {
  readonly field: string;
  readonly text: string;
}

/** The output pieces of a delta or message, in the order {@link cutPieces} walks them. */
function piecesOf(delta: Json, toolCalls: Set<number>): Piece[] {
  const pieces: Piece[] = [];
  for (const field of textFields) {
    const text = delta[field];
    if (typeof text === "string" && text !== "") pieces.push({ field, text });
  }
  const calls = delta["tool_calls"];
  if (Array.isArray(calls)) {
    for (let i = 0; i < calls.length; i += 1) {
      const call = calls[i] as Json | null;
      if (typeof call !== "object" || call === null) continue;
      const index = call["index"];
      toolCalls.add(typeof index === "number" && Number.isSafeInteger(index) ? index : i);
      pushFunction(pieces, call["function"]);
    }
  }
  const legacy = delta["function_call"];
  if (typeof legacy === "object" && legacy !== null) {
    toolCalls.add(-1);
    pushFunction(pieces, legacy);
  }
  return pieces;
}

function pushFunction(pieces: Piece[], fn: unknown): void {
  if (typeof fn !== "object" || fn === null) return;
  const { name, arguments: args } = fn as Json;
  if (typeof name === "string" && name !== "") pieces.push({ field: "name", text: name });
  if (typeof args === "string" && args !== "") pieces.push({ field: "arguments", text: args });
}

/** A copy of a delta with each output piece replaced by `keep(piece)`, in piecesOf's order. */
function cutPieces(delta: Json, keep: (text: string, field: string) => string): Json {
  const copy: Json = { ...delta };
  for (const field of textFields) {
    const text = copy[field];
    if (typeof text === "string" && text !== "") copy[field] = keep(text, field);
  }
  const calls = copy["tool_calls"];
  if (Array.isArray(calls)) {
    copy["tool_calls"] = calls.map((call: unknown) => {
      if (typeof call !== "object" || call === null) return call;
      const fn = (call as Json)["function"];
      return typeof fn === "object" && fn !== null
        ? { ...(call as Json), function: cutFunction(fn as Json, keep) }
        : call;
    });
  }
  const legacy = copy["function_call"];
  if (typeof legacy === "object" && legacy !== null)
    copy["function_call"] = cutFunction(legacy as Json, keep);
  return copy;
}

function cutFunction(fn: Json, keep: (text: string, field: string) => string): Json {
  const copy: Json = { ...fn };
  if (typeof copy["name"] === "string" && copy["name"] !== "")
    copy["name"] = keep(copy["name"], "name");
  if (typeof copy["arguments"] === "string" && copy["arguments"] !== "")
    copy["arguments"] = keep(copy["arguments"], "arguments");
  return copy;
}

function reasoningOf(delta: Json): string[] {
  const out: string[] = [];
  for (const field of reasoningFields) {
    const text = delta[field];
    if (typeof text === "string" && text !== "") out.push(text);
  }
  return out;
}

import { cutLogprobs, cutPieces, piecesOf, type TextField } from "./output-pieces.js";
import { GatewayError } from "../errors.js";
import { utf8Length, type OutputCount, type TokenCounter } from "../tokens.js";

/**
 * The gateway's own count of an answer's output (DESIGN.md section 10), and the priced limit
 * held to: every choice's visible output (reasoning, content, refusals, tool-call names and
 * arguments) is counted as it passes, by the model's counter ({@link OutputCount}: incremental
 * and exact, no text counted twice), and cut exactly where it would pass the limit that was
 * priced (the choice then ends with `finish_reason: "length"`).
 *
 * Only what the client is handed is counted (issue 35): choices the request did not ask for are
 * dropped, never counted or held; a tool call earns its tolerance only once its name and
 * arguments were delivered; a dialect's translator says what of the answer it reads
 * ({@link OutputReader}), and what it would not read is neither relayed nor counted.
 *
 * Per event the tally appends each piece to its choice's count and adds its UTF-8 length. No
 * byte-level token is shorter than a byte, so while the bytes appended since the choice was
 * last counted are under the tokens it has left, no piece can pass the limit and none is
 * checked: an answer well inside its limit is never checked at all.
 *
 * No step holds the event loop (issue 35): a check whose text holds a long pre-token piece (a
 * provider's megabyte of one letter, sent at once or a little at a time) is counted off it
 * ({@link OutputCount.heavy}, {@link OutputCount.settle}). The tally's walk then stops before that
 * piece and returns a promise, which takes the rest of the chunk (or answer) once counted; the
 * caller takes nothing else meanwhile. {@link OutputTally.settle} does the same for the close.
 */

const reasoningFields = new Set<string>(["reasoning_content", "reasoning"]);

type Json = Record<string, unknown>;

export type { TextField };

/**
 * Stream chunks carrying choices the request did not ask for (an index that is not a safe
 * integer in `[0, n)`, `n` the request's choices) that are dropped before the stream fails as
 * the provider's: a few are a provider's slip; more is a provider spending the gateway's time
 * on output no one asked for, which the priced limit would never end (it is not counted). A
 * JSON answer's are dropped and the rest served: its body is bounded, read once.
 */
export const strayChunkLimit = 8;

/** Tool-call delivery flags: a call earns its tolerance once both came. */
const named = 1;
const argued = 2;

interface ChoiceOutput {
  /**
   * Its visible output (fields parted by a line break) and, apart, its visible reasoning (made
   * when the first reasoning comes).
   */
  readonly output: OutputCount;
  reasoning: OutputCount | undefined;
  /** The output's tokens when last counted, and the UTF-8 bytes appended since. */
  counted: number;
  pendingBytes: number;
  /** The field of the last piece ("" before any): a piece of another field follows a line break. */
  field: string;
  /** Tool calls (by their stream index, or position) with what of them was delivered. */
  readonly calls: Map<number, number>;
  /** Tool calls whose name and arguments were both delivered. */
  toolCalls: number;
  /** The choice reached its limit (or its reader's cut): later output of it is dropped. */
  cut: boolean;
  /**
   * The provider ended the choice with `finish_reason: "stop"`: it may have generated a stop
   * string the client never sees (its tolerance, usage.ts).
   */
  stopped: boolean;
}

/** What the gateway counted of an answer's output. */
export interface CountedOutput {
  readonly outputTokens: bigint;
  readonly reasoningTokens: bigint;
  /** Choices that carried output. */
  readonly choices: bigint;
  /** Tool calls delivered with a name and arguments. */
  readonly toolCalls: bigint;
  /** Choices that carried output and ended with `finish_reason: "stop"`. */
  readonly stopped: bigint;
}

/**
 * What a dialect's translator reads of the canonical answer (src/domain/dialects), asked piece
 * by piece before the piece is counted, so that the translator's cut is the billing point:
 * what it would drop is neither relayed nor counted. Stateful: one per answer.
 */
export interface OutputReader {
  /**
   * Whether the translator reads this field at all (a field it never reads is not charged);
   * `call` -1: a field of the legacy `function_call`.
   */
  reads(field: TextField | "name" | "arguments", call: number | undefined): boolean;
  /**
   * A tool-call entry of a delta (`position` in its list), before its name and arguments:
   * whether the translator takes it; false is its cut.
   */
  entry(call: Json, position: number): boolean;
  /**
   * How many code units of `text` the translator takes, at most `room` (what the priced limit
   * leaves of it), given everything taken before: fewer than `room` is the translator's cut,
   * after which nothing of the answer is read. Called only for what the tally then counts and
   * relays, so the reader's state is the translator's.
   */
  take(field: string, text: string, room: number): number;
}

export class OutputTally {
  private readonly choices = new Map<number, ChoiceOutput>();
  private cutChoices = 0;
  private strayChunks = 0;
  private readonly limit: number;
  /** The reader cut the answer: nothing more of it is read. */
  private readerCut = false;
  /** The piece a walk stopped at for a count off the event loop ({@link take}). */
  private resumeAt = 0;

  /**
   * @param counter the model's token counter.
   * @param limit the priced output limit of one choice.
   * @param expectedChoices how many choices the request asked for (`n`).
   * @param reader what the client's dialect reads (none: the chat completion, all of it).
   */
  constructor(
    private readonly counter: TokenCounter,
    limit: bigint,
    private readonly expectedChoices: bigint,
    private readonly reader?: OutputReader,
  ) {
    this.limit = Number(limit);
  }

  /** Every choice the request asked for reached its limit: nothing more is to be read. */
  get done(): boolean {
    return this.readerCut || BigInt(this.cutChoices) >= this.expectedChoices;
  }

  /** Whether any choice was cut at its limit. */
  get anyCut(): boolean {
    return this.cutChoices > 0;
  }

  /**
   * Takes a stream chunk (parsed). Returns the chunk to relay: the same object when nothing of
   * it passes a limit and all its choices were asked for; a copy without the choices the
   * request did not ask for (or a second choice of one index), with output cut and
   * `finish_reason: "length"` where a choice reached its limit; `undefined` when nothing of it
   * is left to relay. Throws `upstream_error` once the provider persists in sending choices
   * nobody asked for ({@link strayChunkLimit}). When a piece of it must be counted off the
   * event loop, returns a promise of all that instead (no chunk is a promise): take no other
   * chunk, nor close, before it settles.
   */
  addChunk(chunk: unknown): unknown {
    const choices = (chunk as { choices?: unknown } | null)?.choices;
    if (!Array.isArray(choices) || choices.length === 0) return chunk;
    // A second choice of one index in a chunk is not read by a dialect's translator either.
    const seen = choices.length > 1 ? new Set<number>() : undefined;
    return this.walkChunk(chunk, choices, 0, -1, undefined, false, seen);
  }

  /**
   * {@link addChunk}'s walk from choice `from` (`piece` >= 0: resumed at that piece of that
   * choice, counted off the event loop).
   */
  private walkChunk(
    chunk: unknown,
    choices: unknown[],
    from: number,
    piece: number,
    changed: (unknown | null)[] | undefined,
    stray: boolean,
    seen: Set<number> | undefined,
  ): unknown {
    for (let i = from; i < choices.length; i += 1) {
      const choice = choices[i] as Json | null;
      let index = this.indexOf(choice, i);
      if (piece < 0 && seen !== undefined && index !== undefined) {
        if (seen.has(index)) index = undefined;
        else seen.add(index);
      }
      if (index === undefined) {
        stray = true;
        changed ??= choices.slice();
        changed[i] = null;
        continue;
      }
      const delta = choice!["delta"];
      if (choice!["finish_reason"] === "stop") this.choice(index).stopped = true;
      if (typeof delta !== "object" || delta === null) continue;
      const state = this.choice(index);
      const replacement =
        state.cut || this.readerCut ? null : this.take(state, delta as Json, Math.max(0, piece));
      piece = -1;
      if (replacement instanceof Promise) {
        const at = i;
        return replacement.then(() =>
          this.walkChunk(chunk, choices, at, this.resumeAt, changed, stray, seen),
        );
      }
      if (replacement === undefined) continue;
      changed ??= choices.slice();
      changed[i] =
        replacement === null
          ? null
          : {
              ...choice,
              delta: replacement,
              ...("logprobs" in choice! && {
                logprobs: cutLogprobs(choice["logprobs"], replacement),
              }),
              finish_reason: "length" as const,
            };
    }
    if (stray && ++this.strayChunks > strayChunkLimit) {
      throw new GatewayError(
        "upstream_error",
        "the provider kept sending choices the request did not ask for",
      );
    }
    if (changed === undefined) return chunk;
    // Nothing left (its usage, if any, was read by the relay before: a claim, not output).
    const kept = changed.filter((c) => c !== null);
    if (kept.length === 0) return undefined;
    return { ...(chunk as Json), choices: kept };
  }

  /**
   * Takes a JSON answer (parsed). Returns whether it was changed in place: choices the request
   * did not ask for (or a second choice of one index) removed, and the choices that passed the
   * limit cut (output cut, `finish_reason: "length"`).
   */
  addAnswer(body: unknown): boolean | Promise<boolean> {
    const choices = (body as { choices?: unknown } | null)?.choices;
    if (!Array.isArray(choices)) return false;
    return this.walkAnswer(body, choices, 0, -1, false, []);
  }

  /** {@link addAnswer}'s walk, resumable as {@link walkChunk}'s. */
  private walkAnswer(
    body: unknown,
    choices: unknown[],
    from: number,
    piece: number,
    changed: boolean,
    kept: unknown[],
  ): boolean | Promise<boolean> {
    for (let i = from; i < choices.length; i += 1) {
      const choice = choices[i] as Json | null;
      const index = this.indexOf(choice, i);
      if (piece < 0) {
        if (index === undefined || this.choices.has(index)) {
          changed = true;
          continue;
        }
        kept.push(choice);
      }
      const state = this.choice(index!);
      if (choice!["finish_reason"] === "stop") state.stopped = true;
      const message = choice!["message"];
      if (typeof message !== "object" || message === null) continue;
      const replacement = this.readerCut ? cutPieces(message as Json, 0, "") : undefined;
      const cut = replacement ?? this.take(state, message as Json, Math.max(0, piece));
      piece = -1;
      if (cut instanceof Promise) {
        const at = i;
        return cut.then(() => this.walkAnswer(body, choices, at, this.resumeAt, changed, kept));
      }
      if (cut !== undefined) {
        choice!["message"] = cut;
        if ("logprobs" in choice!) choice["logprobs"] = cutLogprobs(choice["logprobs"], cut);
        choice!["finish_reason"] = "length";
        changed = true;
      }
    }
    if (kept.length !== choices.length) (body as Json)["choices"] = kept;
    return changed;
  }

  /**
   * Counts off the event loop what {@link count} would count on it (a long piece): undefined
   * when nothing needs it. A failed count is left to {@link count}.
   */
  settle(): Promise<void> | undefined {
    let counts: Promise<void>[] | undefined;
    for (const { output, reasoning } of this.choices.values()) {
      for (const count of [output, reasoning]) {
        if (count?.heavy() === true) (counts ??= []).push(count.settle());
      }
    }
    return counts === undefined ? undefined : Promise.all(counts).then(ignore, ignore);
  }

  /** The gateway's count of the output so far (at the close: of the whole answer). */
  count(): CountedOutput {
    let outputTokens = 0n;
    let reasoningTokens = 0n;
    let choices = 0n;
    let toolCalls = 0n;
    let stopped = 0n;
    for (const state of this.choices.values()) {
      if (state.field === "") continue;
      choices += 1n;
      if (state.stopped) stopped += 1n;
      toolCalls += BigInt(state.toolCalls);
      outputTokens += state.output.count();
      if (state.reasoning !== undefined) reasoningTokens += state.reasoning.count();
    }
    return { outputTokens, reasoningTokens, choices, toolCalls, stopped };
  }

  /** A choice's index if the request asked for it (a safe integer in [0, n)), else undefined. */
  private indexOf(choice: Json | null, position: number): number | undefined {
    if (typeof choice !== "object" || choice === null) return undefined;
    const given = choice["index"];
    const index = given === undefined ? position : given;
    return typeof index === "number" &&
      Number.isSafeInteger(index) &&
      index >= 0 &&
      BigInt(index) < this.expectedChoices
      ? index
      : undefined;
  }

  private choice(index: number): ChoiceOutput {
    let state = this.choices.get(index);
    if (state === undefined) {
      state = {
        output: this.counter.output(),
        reasoning: undefined,
        counted: 0,
        pendingBytes: 0,
        field: "",
        calls: new Map(),
        toolCalls: 0,
        cut: false,
        stopped: false,
      };
      this.choices.set(index, state);
    }
    return state;
  }

  /**
   * Appends a delta's (or message's) output to its choice's count, from its piece `from`.
   * Returns `undefined` when all of it was kept, else a copy cut where the choice reached its
   * limit (or the reader its cut); the choice is then cut. Or, for a piece whose check is
   * counted off the event loop first, a promise: the walk resumes at {@link resumeAt}.
   */
  private take(state: ChoiceOutput, delta: Json, from: number): Json | undefined | Promise<void> {
    const pieces = piecesOf(delta);
    const { reader, limit } = this;
    for (let i = from; i < pieces.length; i += 1) {
      const { field, text, call, entry, position } = pieces[i]!;
      if (entry !== undefined) {
        if (reader === undefined || reader.entry(entry, position!)) continue;
        // The translator takes no more tool calls: its cut, here.
        state.cut = true;
        this.cutChoices += 1;
        this.readerCut = true;
        return cutPieces(delta, i, "");
      }
      if (reader !== undefined && !reader.reads(field as TextField, call)) continue;
      // Fields are counted apart (a tool's name does not merge with its arguments), as the
      // model's own markup keeps them apart.
      const separator = state.field === "" || state.field === field ? "" : "\n";
      const whole = separator === "" ? text : separator + text;
      const bytes = utf8Length(whole);
      // No token is shorter than a byte: within the tokens left, the piece is not checked.
      const unchecked = state.pendingBytes + bytes <= limit - state.counted;
      // A long piece to check: counted off the event loop, then this piece again (nothing of
      // it was taken yet; once settled, the check answers at once).
      if (!unchecked && state.output.heavy(whole)) {
        this.resumeAt = i;
        return state.output.settle(whole, BigInt(limit));
      }
      let keep = unchecked ? whole.length : state.output.fit(whole, BigInt(limit));
      let readerCut = false;
      if (reader !== undefined) {
        const room = Math.max(0, keep - separator.length);
        const taken = reader.take(field, text, room);
        if (taken < room) {
          keep = separator.length + taken;
          readerCut = true;
        }
      }
      if (keep === whole.length) {
        this.append(state, field, whole, text, call);
        if (unchecked) state.pendingBytes += bytes;
        else {
          state.counted = Number(state.output.count());
          state.pendingBytes = 0;
        }
        continue;
      }
      // Cut here: this piece keeps what fits, the later pieces of the delta nothing.
      const kept = keep > separator.length ? text.slice(0, keep - separator.length) : "";
      if (kept !== "") this.append(state, field, separator + kept, kept, call);
      state.cut = true;
      this.cutChoices += 1;
      if (readerCut) this.readerCut = true;
      return cutPieces(delta, i, kept);
    }
    return undefined;
  }

  private append(
    state: ChoiceOutput,
    field: string,
    text: string,
    own: string,
    call: number | undefined,
  ): void {
    state.output.append(text);
    state.field = field;
    if (reasoningFields.has(field)) (state.reasoning ??= this.counter.output()).append(own);
    if (call !== undefined) {
      const had = state.calls.get(call) ?? 0;
      const has = had | (field === "name" ? named : argued);
      if (has !== had) {
        state.calls.set(call, has);
        if (has === (named | argued)) state.toolCalls += 1;
      }
    }
  }
}

function ignore(): undefined {
  return undefined;
}

import { inputTokenUpperBound, type ChatRequest } from "./chat/request/index.js";

/**
 * The gateway's own token counts (DESIGN.md section 10): the measurement a provider's usage
 * claim is checked against. A model's counter is its own tokenizer and chat template where the
 * gateway knows them (the tokenizer registry, src/adapters/tokenizers), else the byte bound
 * below. The domain sees only this port.
 *
 * The meter is on the hot path (issue 35): no method here may hold the event loop for more
 * than a few milliseconds for any text up to the body limit. Long inputs are counted off the
 * event loop (hence {@link TokenCounter.countInput} is asynchronous); output is counted
 * incrementally as it passes ({@link OutputCount}), so a stream's cut at its priced limit is
 * exact without counting its text again, and a step of it that would count a long piece (a
 * provider's megabyte of one letter) is counted off the event loop first
 * ({@link OutputCount.heavy}, {@link OutputCount.settle}).
 */
export interface TokenCounter {
  /**
   * True for the model's own tokenizer (counts are exact up to the template's and the
   * provider's small differences); false for {@link boundCounter}, whose counts are upper bounds.
   */
  readonly exact: boolean;
  /** What counted (a registry entry's name, or "bound"): recorded, shown in metrics. */
  readonly name: string;
  /**
   * The model hides its reasoning (its registry entry says so): reasoning the provider claims
   * beyond what the client saw may be charged, up to the offer's priced ratio (usage.ts).
   * Absent or false for every other model, and for the byte bound.
   */
  readonly hidesReasoning?: boolean | undefined;
  /**
   * Tokens of the request's prompt as the model's chat template renders it: every message,
   * the tools and their schemas, the generation prompt. Long prompts are counted off the event
   * loop. Rejects with a `GatewayError` (`invalid_request`) for content the model cannot take
   * and the gateway cannot price (an image for a model with no documented image cost), and
   * when the template refuses the conversation (as the provider's would).
   */
  countInput(req: ChatRequest): Promise<bigint>;
  /**
   * Tokens of one short generated text (content, reasoning, a tool call's name or arguments),
   * synchronously: for texts the gateway itself bounds (a probe's answer). Output of a client's
   * request is counted through {@link TokenCounter.output}.
   */
  countOutput(text: string): bigint;
  /** A new incremental count of one text as it arrives (one per choice and field group). */
  output(): OutputCount;
}

/**
 * An incremental, exact count of a text that arrives in pieces. Appending costs time linear in
 * the text appended (no text is counted twice: finished pre-token pieces are committed, only
 * the tail is scanned again); {@link OutputCount.count} and {@link OutputCount.fit} count what
 * is still pending. Those two are synchronous, and cheap unless {@link OutputCount.heavy} says
 * otherwise: the caller then awaits {@link OutputCount.settle} and calls them after it, with
 * nothing appended in between. A count that is never heavy (the byte bound; counters whose
 * engine is fast for every text) answers false and settles at once.
 */
export interface OutputCount {
  /** Appends text to the count. */
  append(text: string): void;
  /** Tokens of everything appended so far, exactly as the tokenizer counts the whole text. */
  count(): bigint;
  /**
   * The length (UTF-16 code units, never splitting a surrogate pair) of the longest prefix of
   * `text` such that the text appended so far followed by that prefix counts at most `limit`
   * tokens. Appends nothing. Its cost is bounded by the tokens up to the limit, not by the
   * length of `text`. The text appended so far must itself fit `limit` (counts are not monotone:
   * a text past the limit may come back under it by a merge; asked then, the answer is 0).
   */
  fit(text: string, limit: bigint): number;
  /**
   * Whether {@link OutputCount.fit} of `text` (absent: {@link OutputCount.count}) may hold the
   * event loop: a long pre-token piece to count (a provider's megabyte of one letter, or of
   * spaces), or a long text to scan. Cheap to ask. When true, {@link OutputCount.settle} first.
   */
  heavy(text?: string): boolean;
  /**
   * Counts off the event loop what `fit(text, limit)` needs (`text` absent: `count()`), so
   * that, once this resolves and until anything else is appended, that call answers at once, and
   * so do appending its answer's prefix of `text` and `count()` after it. Appends nothing.
   */
  settle(text?: string, limit?: bigint): Promise<void>;
}

/** Where a model's counter comes from. */
export interface TokenCounters {
  /**
   * The counter of a model, by its repository and revision (as the chain names them): its
   * loaded tokenizer, or the byte bound for a model the registry does not know. Never loads on
   * a request's path: undefined while the model's tokenizer is still loading (the model is then
   * not routable; {@link TokenCounters.preload}).
   */
  forModel(model: ModelRef): TokenCounter | undefined;
  /** How the model is metered: `exact` with the tokenizer's name, or `bound`. */
  meteringOf(model: ModelRef): Metering;
  /**
   * Loads the tokenizers of these models (start-up, and when the indexer adds a model); resolves
   * once all are loaded. A load that fails rejects; the models stay unroutable.
   */
  preload(models: readonly ModelRef[]): Promise<void>;
}

/** A model as the chain names it. */
export interface ModelRef {
  readonly repository: string;
  readonly revision: string;
}

/** How a model is metered (shown in the catalog and quotes, DESIGN.md section 10). */
export type Metering =
  { readonly kind: "exact"; readonly tokenizer: string } | { readonly kind: "bound" };

/**
 * Bytes per token the relay assumes when it must cut an answer of a model whose tokenizer it
 * does not know: its output is cut once it passes `limit * boundBytesPerToken` UTF-8 bytes.
 * About twice what BPE vocabularies average on English and code (4 to 4.5 bytes), so an honest
 * answer is not cut early; an operator who serves such a model registers its tokenizer.
 */
export const boundBytesPerToken = 8n;

/** The UTF-8 length of a string, without encoding it. */
export function utf8Length(text: string): number {
  return Buffer.byteLength(text, "utf8");
}

/**
 * The byte bound's count of output: its UTF-8 bytes (no tokenizer used by chat models makes a
 * token of less than one byte); `fit` keeps `limit * boundBytesPerToken` bytes in all.
 */
function boundOutput(): OutputCount {
  let bytes = 0n;
  return {
    append(text) {
      bytes += BigInt(utf8Length(text));
    },
    count: () => bytes,
    fit(text, limit) {
      const room = limit * boundBytesPerToken - bytes;
      if (room <= 0n) return 0;
      let used = 0n;
      let end = 0;
      for (const char of text) {
        const size = BigInt(utf8Length(char));
        if (used + size > room) break;
        used += size;
        end += char.length;
      }
      return end;
    },
    heavy: () => false,
    settle: () => Promise.resolve(),
  };
}

/**
 * The counter for a model whose tokenizer is unknown: sound upper bounds. Output: its UTF-8
 * bytes. Input: {@link inputTokenUpperBound} (the bytes sent plus per-message and template
 * allowances).
 */
export const boundCounter: TokenCounter = {
  exact: false,
  name: "bound",
  countInput: (req) => Promise.resolve(inputTokenUpperBound(req)),
  countOutput: (text) => BigInt(utf8Length(text)),
  output: boundOutput,
};

/** Every model gets the byte bound (tests, and gateways configured without tokenizers). */
export const boundCounters: TokenCounters = {
  forModel: () => boundCounter,
  meteringOf: () => ({ kind: "bound" }),
  preload: () => Promise.resolve(),
};

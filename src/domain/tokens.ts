import { inputTokenUpperBound, type ChatRequest } from "./chat-request.js";

/**
 * The gateway's own token counts (DESIGN.md section 10): the measurement a provider's usage
 * claim is checked against. A model's counter is its own tokenizer and chat template where the
 * gateway knows them (the tokenizer registry, src/adapters/tokenizers), else the byte bound
 * below. The domain sees only this port.
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
   * Tokens of the request's prompt as the model's chat template renders it: every message,
   * the tools and their schemas, the generation prompt. Throws a `GatewayError`
   * (`invalid_request`) for content the model cannot take and the gateway cannot price
   * (an image for a model with no documented image cost).
   */
  countInput(req: ChatRequest): bigint;
  /** Tokens of generated text (content, reasoning, a tool call's name or arguments). */
  countOutput(text: string): bigint;
  /**
   * The longest prefix of `text` that {@link countOutput} counts at most `limit` tokens, never
   * splitting a character (the relay cuts an answer at its priced limit with it).
   */
  truncate(text: string, limit: bigint): string;
}

/** Where a model's counter comes from. */
export interface TokenCounters {
  /**
   * The counter of a model, by its repository and revision (as the chain names them). Loads the
   * model's tokenizer the first time it is asked for (from local files, never the network);
   * the byte bound for a model the registry does not know.
   */
  forModel(model: { readonly repository: string; readonly revision: string }): Promise<TokenCounter>;
}

/**
 * Bytes per token the relay assumes when it must cut an answer of a model whose tokenizer it
 * does not know: its output is cut once it passes `limit * boundBytesPerToken` UTF-8 bytes.
 * About twice what BPE vocabularies average on English and code (4 to 4.5 bytes), so an honest
 * answer is not cut early; an operator who serves such a model registers its tokenizer.
 */
export const boundBytesPerToken = 8n;

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/**
 * The counter for a model whose tokenizer is unknown: sound upper bounds. Output: its UTF-8
 * bytes (no tokenizer used by chat models makes a token of less than one byte). Input:
 * {@link inputTokenUpperBound} (the bytes sent plus per-message and template allowances).
 * `truncate` keeps `limit * boundBytesPerToken` bytes (see {@link boundBytesPerToken}).
 */
export const boundCounter: TokenCounter = {
  exact: false,
  name: "bound",
  countInput: (req) => inputTokenUpperBound(req),
  countOutput: (text) => BigInt(Buffer.byteLength(text, "utf8")),
  truncate(text, limit) {
    const bytes = encoder.encode(text);
    const keep = limit * boundBytesPerToken;
    if (BigInt(bytes.length) <= keep) return text;
    let end = Number(keep);
    // Back to the start of a character (continuation bytes are 0b10xxxxxx).
    while (end > 0 && (bytes[end]! & 0xc0) === 0x80) end -= 1;
    return decoder.decode(bytes.subarray(0, end));
  },
};

/** Every model gets the byte bound (tests, and gateways configured without tokenizers). */
export const boundCounters: TokenCounters = { forModel: () => Promise.resolve(boundCounter) };

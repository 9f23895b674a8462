/**
 * The interface every exact tokenizer engine of the gateway implements (issue 35): the
 * byte-level BPE engine (byte-level-bpe.ts) for Llama 3, Qwen 3, DeepSeek V3 and gpt-oss, and
 * an engine of its own for Gemma 3. The counter (counter.ts) counts prompts and output through
 * it, and counts a stream incrementally by its pieces (output-count.ts).
 */

/** An exact tokenizer engine over one tokenizer.json. */
export interface TokenizerEngine {
  /** Token ids of `text` (added tokens matched as the tokenizer does; no BOS/EOS added). For tests against the native reference. */
  encode(text: string): number[];
  /** Tokens of `text`, exactly encode(text).length, cached where it pays. */
  count(text: string): number;
  /** Splits text into consecutive pieces (joined, they are `text`) whose counts add up: count(text) === sum of count(piece). Appending text to `text` may change only the last piece (callers keep the last one or two pieces as a tail). */
  split(text: string): string[];
  /** Added-token texts (a suffix of committed text that is a prefix of one of these stays in the tail). */
  readonly addedTokens: readonly string[];
}

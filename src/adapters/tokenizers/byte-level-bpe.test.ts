import { readFileSync } from "node:fs";
import fc from "fast-check";
import { Tokenizer as Reference } from "tokenizers";
import { beforeAll, describe, expect, it } from "vitest";
import { ByteLevelBpe, type TokenizerJson } from "./byte-level-bpe.js";
import { createOutputCount } from "./output-count.js";
import { byteLevelTokenizerFiles } from "../../../test/helpers/byte-level-files.js";

/**
 * The byte-level BPE engine against the reference, Hugging Face's native `tokenizers` binding:
 * ids equal on the corpus and under a property over random texts (code points of every plane,
 * CJK, emoji with ZWJ, digits, contractions, whitespace and CRLF runs, compact JSON, base64,
 * the tokenizer's own added tokens and their prefixes, decomposed accents), for every embedded
 * byte-level tokenizer; counts additive over `split`; the incremental output count equal to the
 * one-shot count for random chunkings, and `fit` equal to a brute-force longest prefix; long
 * single pieces counted exactly (their time: byte-level-bpe.load.test.ts, in the e2e project).
 */

const corpus = JSON.parse(
  readFileSync(new URL("../../../test/fixtures/tokenizer-corpus.json", import.meta.url), "utf8"),
) as { texts: { id: string; text: string }[] };

/** One entry per tokenizer file (Llama 3 and 3.1 share theirs). */
const byteLevel = byteLevelTokenizerFiles();

it("covers the byte-level families of the embedded registry", () => {
  // One name per file: DeepSeek V3.1's entry comes first and shares V3's tokenizer.json.
  expect(byteLevel.map((t) => t.name).sort()).toEqual([
    "deepseek-v3.1",
    "gpt-oss",
    "llama3",
    "qwen3",
  ]);
});

const fragments = (added: readonly string[]) =>
  fc.oneof(
    fc.string({ unit: "binary", maxLength: 12 }),
    fc.string({ unit: "grapheme", maxLength: 8 }),
    fc
      .array(fc.integer({ min: 0x4e00, max: 0x9fa5 }), { minLength: 1, maxLength: 30 })
      .map((codes) => String.fromCodePoint(...codes)),
    fc.constantFrom("👩‍👩‍👧‍👦", "🏳️‍🌈", "👍🏽", "🧑‍💻", "❤️", "\u200d", "🇫🇷"),
    fc.stringMatching(/^[0-9]{1,14}$/),
    fc.constantFrom("'s", "'T", "'ll", "'RE", "'ve", "'m", "'D", "'ſ", "don't", "I'M", "K"),
    fc
      .array(fc.constantFrom(" ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\f"), {
        maxLength: 12,
      })
      .map((parts) => parts.join("")),
    fc.json({ maxDepth: 2 }),
    fc.base64String({ maxLength: 40 }),
    fc.constantFrom(...added),
    fc
      .constantFrom(...added)
      .chain((token) => fc.integer({ min: 1, max: token.length }).map((n) => token.slice(0, n))),
    fc.constantFrom("e\u0301", "A\u030a", "\u1100\u1161\u11a8", "\u0301", "ﬁ", "Å", "ẛ̣"),
    fc.stringMatching(/^[a-zA-Z]{1,20}$/),
    fc.constantFrom("=====", "----", "....", "!!!", "```", "/**", "</div>", "\\n"),
  );

const texts = (added: readonly string[]) =>
  fc.array(fragments(added), { maxLength: 12 }).map((parts) => parts.join(""));

describe.each(byteLevel)("$name", ({ file, name }) => {
  let engine: ByteLevelBpe;
  let reference: Reference;
  const ids = async (text: string) =>
    (await reference.encode(text, null, { addSpecialTokens: false })).getIds();

  beforeAll(() => {
    engine = new ByteLevelBpe(JSON.parse(readFileSync(file, "utf8")) as TokenizerJson);
    reference = Reference.fromFile(file);
  }, 120_000);

  it("encodes every text of the corpus to the reference's ids", async () => {
    for (const { id, text } of corpus.texts) {
      expect([id, engine.encode(text)]).toEqual([id, await ids(text)]);
      expect([id, engine.count(text)]).toEqual([id, engine.encode(text).length]);
    }
  });

  /**
   * Whether the engine splits text around `char` as the reference does. The engine's pattern
   * classes (`\p{L}`, `\p{N}`, ...) are the runtime's Unicode (17 on Node 20.20 and 24), the
   * reference's are its Oniguruma tables, which are older: a code point assigned since (CJK
   * Extension J, U+323B0..U+3347F, is a letter to the runtime and nothing to the reference) is
   * split otherwise. A known limit (see the test after this one), kept out of the property.
   */
  const classifiedAlike = new Map<number, boolean>();
  const splitsAlike = (text: string): boolean =>
    [...text].every((char) => {
      const code = char.codePointAt(0)!;
      let alike = classifiedAlike.get(code);
      if (alike === undefined) {
        const probe = `a${char}'s1`;
        const ours = engine.split(probe).map((piece) => [...piece].length);
        const theirs = reference
          .getPreTokenizer()!
          .preTokenizeString(probe)
          .map(([, [start, end]]) => end - start);
        alike = JSON.stringify(ours) === JSON.stringify(theirs);
        classifiedAlike.set(code, alike);
      }
      return alike;
    });

  it("encodes random texts to the reference's ids; counts add up over its split", async () => {
    const added = engine.addedTokens.slice(0, 40);
    await fc.assert(
      fc.asyncProperty(texts(added), async (text) => {
        fc.pre(splitsAlike(text));
        const expected = await ids(text);
        expect(engine.encode(text)).toEqual(expected);
        expect(engine.count(text)).toBe(expected.length);
        const pieces = engine.split(text);
        expect(pieces.join("")).toBe(text);
        expect(pieces.reduce((sum, piece) => sum + engine.count(piece), 0)).toBe(expected.length);
      }),
      { numRuns: 300 },
    );
  });

  it("known limit: a code point assigned after the reference's Unicode tables is split by the runtime's", async () => {
    // U+323B0, the first of CJK Extension J (Unicode 17): a letter to the runtime, not to the
    // reference. Found by the property above on CI (seed -507779669, qwen3). The code points
    // around it are split alike, so the difference is this one's class alone; the counts below
    // are what each side makes of "\u{323B0}'s" today (deepseek-v3.1's pattern ends alike).
    const text = "\u{323B0}'s";
    expect(splitsAlike("'s\u{323AF}")).toBe(true); // U+323AF, the last of Extension H: alike
    expect(splitsAlike("\u{323B0}")).toBe(false);
    const bytes = name === "deepseek-v3.1" ? [175, 113, 239, 111] : [172, 110, 236, 108];
    const known: Record<string, { ours: number[]; reference: number[] }> = {
      llama3: { ours: [...bytes, 596], reference: [...bytes, 6, 82] },
      qwen3: { ours: [...bytes, 594], reference: [...bytes, 6, 82] },
      "gpt-oss": { ours: [...bytes, 885], reference: [...bytes, 6, 82] },
      "deepseek-v3.1": { ours: [...bytes, 734], reference: [...bytes, 734] },
    };
    expect({ ours: engine.encode(text), reference: await ids(text) }).toEqual(known[name]);
  });

  it("counts long single pieces exactly (their time: byte-level-bpe.load.test.ts)", async () => {
    const random = Buffer.from(
      Array.from({ length: 65_536 }, (_, i) => (i * 2654435761) >>> 24),
    ).toString("latin1");
    const samples = {
      cjk: "中文字符的长序列".repeat(8192),
      letter: "a".repeat(65_536),
      spaces: " ".repeat(50 * 1024),
      random,
      digitsAndLetters: "x9".repeat(32_768),
    };
    for (const [what, text] of Object.entries(samples)) {
      expect([what, engine.count(text)]).toEqual([what, (await ids(text)).length]);
    }
  }, 120_000);

  it("counts a text appended in random chunks exactly as at once", () => {
    const added = engine.addedTokens.slice(0, 40);
    fc.assert(
      fc.property(
        texts(added),
        fc.array(fc.integer({ min: 1, max: 40 }), { minLength: 1, maxLength: 20 }),
        (text, cuts) => {
          const count = createOutputCount(engine);
          let at = 0;
          for (let i = 0; at < text.length; i += 1) {
            const size = cuts[i % cuts.length]!;
            count.append(text.slice(at, at + size));
            at += size;
            // A count read mid-stream is the count of what was appended so far.
            if (i % 3 === 0) expect(count.count()).toBe(BigInt(engine.count(text.slice(0, at))));
          }
          expect(count.count()).toBe(BigInt(engine.count(text)));
        },
      ),
      { numRuns: 300 },
    );
  });

  it("fits the longest prefix a brute force finds", () => {
    const added = engine.addedTokens.slice(0, 40);
    fc.assert(
      fc.property(
        texts(added),
        texts(added),
        fc.integer({ min: 0, max: 40 }),
        (before, text, room) => {
          // fit's contract: the text appended so far fits the limit (the meter appends only
          // what fitted, and stops at a cut). Counts are not monotone ("\u00a0\r\n \r" counts
          // more than "\u00a0\r\n \r\n" for Qwen 3), so a text already past a limit may come
          // back under it; no caller asks then.
          const limit = engine.count(before) + room;
          const count = createOutputCount(engine);
          count.append(before);
          const ends = [0];
          for (const char of text) ends.push(ends[ends.length - 1]! + char.length);
          let expected = 0;
          for (const end of ends) {
            if (engine.count(before + text.slice(0, end)) <= limit) expected = end;
          }
          expect(count.fit(text, BigInt(limit))).toBe(expected);
        },
      ),
      // Found by this property: a prefix ending where a window piece ends splits apart (Qwen 3).
      { numRuns: 300, examples: [["", "=====.... \u3000 \t<", 5]] },
    );
  });
});

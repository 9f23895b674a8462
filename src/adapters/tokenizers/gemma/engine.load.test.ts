import { describe, expect, it } from "vitest";
import { gemmaReference, gemmaReferenceIds } from "../../../../test/helpers/gemma-reference.js";
import { loadGemmaEngine } from "./load.js";

/**
 * The Gemma 3 engine on a megabyte of one piece: exact against the native reference, and in
 * well under a second of CPU (a quadratic merge would take minutes). A test of time, so in the
 * e2e project (`npm run test:e2e`, one file at a time), not in `npm test`.
 */

const engine = loadGemmaEngine();
const referenceIds = gemmaReferenceIds;

describe.skipIf(gemmaReference === undefined)("a megabyte of one piece", () => {
  it("on 1 MiB of one character, of random letters, of CJK, of spaces, of newlines (each in well under a second)", async () => {
    const MiB = 1 << 20;
    const cjk = Array.from({ length: MiB / 2 }, (_, i) =>
      String.fromCharCode(0x4e00 + ((i * 7919) % 20992)),
    ).join("");
    let seed = 7;
    const letters = Array.from({ length: MiB }, () => {
      seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
      return String.fromCharCode(0x61 + ((seed >>> 8) % 26));
    }).join("");
    for (const [name, t] of [
      ["a", "a".repeat(MiB)],
      ["random lowercase letters (words of up to 2,000 characters)", letters],
      ["cjk", cjk],
      ["spaces", " ".repeat(MiB)],
      ["k (chunks of 2)", "k".repeat(MiB)],
      ["newlines", "\n".repeat(MiB)],
    ] as const) {
      // The better of two runs: the first also compiles the long-word path.
      let ms = Infinity;
      let count = 0;
      for (let run = 0; run < 2; run++) {
        const before = process.cpuUsage();
        count = engine.count(t);
        const cpu = process.cpuUsage(before);
        ms = Math.min(ms, (cpu.user + cpu.system) / 1000);
      }
      console.log(`gemma engine: 1 MiB of ${name}: ${count} tokens, ${ms.toFixed(0)} ms of CPU`);
      expect(ms).toBeLessThan(1000);
      const expected = await referenceIds(t);
      expect(count).toBe(expected.length);
      expect(String(engine.encode(t)) === String(expected)).toBe(true);
    }
  }, 180_000);
});

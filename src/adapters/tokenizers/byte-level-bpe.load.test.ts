import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { ByteLevelBpe, type TokenizerJson } from "./byte-level-bpe.js";
import { byteLevelTokenizerFiles } from "../../../test/helpers/byte-level-files.js";

/**
 * The byte-level BPE engine on long single pieces, in bounded time: a megabyte of one piece
 * against a quarter of it takes about 4 times the CPU (n log n), not 16 (quadratic). Exactness on
 * long pieces is in byte-level-bpe.test.ts; this is a test of time, so in the e2e project
 * (`npm run test:e2e`, one file at a time), not in `npm test`.
 */

describe.each(byteLevelTokenizerFiles())("$name", ({ file }) => {
  it("counts a megabyte of one piece in about 4 times a quarter's CPU, not 16", () => {
    const engine = new ByteLevelBpe(JSON.parse(readFileSync(file, "utf8")) as TokenizerJson);
    // 10 allows for a shared machine's noise. CPU time, the least of two runs (the machine is
    // shared), each text new (no cache hit).
    const timed = (text: string) => {
      let least = Infinity;
      for (let run = 0; run < 2; run += 1) {
        const fresh = `${run}${text}`;
        const started = process.cpuUsage();
        engine.count(fresh);
        const used = process.cpuUsage(started);
        least = Math.min(least, used.user + used.system);
      }
      return least;
    };
    for (const unit of ["中", "a", "é"]) {
      const quarter = timed(unit.repeat(256 * 1024));
      const whole = timed(unit.repeat(1024 * 1024));
      expect({ unit, slowdown: whole / quarter < 10 }).toEqual({ unit, slowdown: true });
    }
  }, 120_000);
});

import type { GemmaTable } from "./table.js";

const space = 0x20;
const spaceMark = 0x2581;

/**
 * The chunks a run of one greedily merging character (the table's `runs`, " " among them) is
 * cut into. A run of c that starts a word tokenizes as chunks of c^K from its start: a chunk
 * starts at the leftmost pair (c, c) and absorbs the next c at ranks lower than (c, c) until it
 * is c^K; chunks form one after another from the left and never merge with each other (no merge
 * takes c^K with a side starting with c); and what follows the run reaches at most the longest
 * token's length into it. So a chunk ending that far before the run's end is a piece of the word
 * as exact as a word is of the text, and counts 1.
 */
export function createRunChunks(table: GemmaTable) {
  const chunkLength = new Uint8Array(0x10000);
  const chunkId = new Int32Array(0x10000);
  for (const run of table.runs) {
    // Raw " " is normalized to "\u2581": a run of either is one run of "\u2581".
    for (const c of run.char === spaceMark ? [space, spaceMark] : [run.char]) {
      chunkLength[c] = run.length;
      chunkId[c] = run.id;
    }
  }
  const margin = table.maxTokenLength;
  return {
    /** The chunk length of a run of this UTF-16 code unit (0: its runs are not cut). */
    length: (code: number) => chunkLength[code]!,
    /** The id of a chunk of a run of this code unit. */
    id: (code: number) => chunkId[code]!,
    /** How many whole chunks the word text[start..end) begins with. */
    leading(text: string, start: number, end: number): number {
      const first = text.charCodeAt(start);
      const length = chunkLength[first]!;
      if (length === 0 || end - start < length + margin) return 0;
      const same = chunkId[first]!;
      let i = start + 1;
      while (
        i < end &&
        chunkLength[text.charCodeAt(i)] !== 0 &&
        chunkId[text.charCodeAt(i)] === same
      ) {
        i++;
      }
      return Math.max(0, Math.floor((i - start - margin) / length));
    },
  };
}

import type { OutputReader } from "../chat/output-tally.js";
import { maxToolCalls } from "./messages-stream.js";

/**
 * What the Messages translator reads of a canonical answer (DESIGN.md 10: the translator's cut
 * is the billing point): the tally asks it before it counts and relays a piece, so output the
 * translator would drop is neither relayed nor charged.
 *
 * Read: text content and tool calls. Not refusals nor the legacy `function_call`, which it never
 * reads. The visible reasoning is counted though the translator has no thinking block for it
 * yet: an honest reasoning model's claim must not diverge because its client chose this
 * dialect.
 *
 * A stream's reader keeps the translator's own account (messages-stream.ts): its tool calls, at
 * most {@link maxToolCalls}; the call past them is the cut, as it is the translator's.
 */
export function createReader(stream: boolean): OutputReader {
  return stream ? new StreamReader() : answerReader;
}

function readable(field: string, call: number | undefined): boolean {
  return call !== -1 && field !== "refusal";
}

const answerReader: OutputReader = {
  reads: readable,
  entry: () => true,
  take: (_field, _text, room) => room,
};

class StreamReader implements OutputReader {
  /** Tool calls by the translator's key (its index, else its position in the delta). */
  private readonly tools = new Set<number>();
  private cut = false;

  reads(field: string, call: number | undefined): boolean {
    return readable(field, call);
  }

  entry(call: Record<string, unknown>, position: number): boolean {
    if (this.cut) return false;
    const key = typeof call["index"] === "number" ? call["index"] : position;
    if (this.tools.has(key)) return true;
    if (this.tools.size >= maxToolCalls) {
      this.cut = true;
      return false;
    }
    this.tools.add(key);
    return true;
  }

  take(_field: string, _text: string, room: number): number {
    return this.cut ? 0 : room;
  }
}

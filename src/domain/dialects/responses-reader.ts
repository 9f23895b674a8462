import type { OutputReader } from "../chat/output-tally.js";
import { isObject } from "./json.js";
import { maxHeldChars, maxHeldParts } from "./responses-stream.js";

/**
 * What the Responses translator reads of a canonical answer (DESIGN.md 10: the translator's cut
 * is the billing point): the tally asks it before it counts and relays a piece, so output the
 * translator would drop is neither relayed nor charged.
 *
 * Read: content and refusals, tool calls (not the legacy `function_call`, which it never reads),
 * and the visible reasoning, which is counted though the translator has no item for it yet: an
 * honest reasoning model's claim must not diverge because its client chose this dialect.
 *
 * A stream's reader keeps the translator's own account (responses-stream.ts): the code units it
 * holds, its items and parts, and cuts where the translator would, or before it.
 */
export function createReader(stream: boolean): OutputReader {
  return stream ? new StreamReader() : answerReader;
}

function readable(_field: string, call: number | undefined): boolean {
  return call !== -1;
}

/** A JSON answer: every read field whole (the body is bounded; the translator holds it all). */
const answerReader: OutputReader = {
  reads: readable,
  entry: () => true,
  take: (_field, _text, room) => room,
};

class StreamReader implements OutputReader {
  private chars = 0;
  private parts = 0;
  private messageOpen = false;
  private partType: string | undefined = undefined;
  /** Tool calls by the translator's key, and whether their name came. */
  private readonly calls = new Map<number, boolean>();
  private cut = false;

  reads(field: string, call: number | undefined): boolean {
    return readable(field, call);
  }

  entry(call: Record<string, unknown>): boolean {
    if (this.cut) return false;
    const index = typeof call["index"] === "number" ? call["index"] : 0;
    const fn = isObject(call["function"]) ? call["function"] : {};
    const name = typeof fn["name"] === "string" ? fn["name"] : "";
    const named = this.calls.get(index);
    if (named === undefined) {
      const id = typeof call["id"] === "string" ? call["id"] : "";
      if (this.parts + 1 > maxHeldParts || this.chars + name.length + id.length > maxHeldChars)
        return this.cutHere();
      this.chars += name.length + id.length;
      this.parts += 1;
      // A call begins: the message before it is complete.
      this.messageOpen = false;
      this.partType = undefined;
      this.calls.set(index, name !== "");
    } else if (!named && name !== "") {
      if (this.chars + name.length > maxHeldChars) return this.cutHere();
      this.chars += name.length;
      this.calls.set(index, true);
    }
    return true;
  }

  take(field: string, text: string, room: number): number {
    if (this.cut) return 0;
    // Names are held with their entry; reasoning is not held.
    if (field === "name" || field === "reasoning_content" || field === "reasoning") return room;
    const type =
      field === "arguments" ? undefined : field === "content" ? "output_text" : "refusal";
    const opens =
      type === undefined ? 0 : (this.messageOpen ? 0 : 1) + (this.partType === type ? 0 : 1);
    if (this.parts + opens > maxHeldParts) {
      this.cutHere();
      return 0;
    }
    const keep = fitting(text, room, maxHeldChars - this.chars);
    if (keep < room) this.cut = true;
    if (keep === 0) return 0;
    this.chars += keep;
    if (type !== undefined) {
      this.parts += opens;
      this.messageOpen = true;
      this.partType = type;
    }
    return keep;
  }

  private cutHere(): false {
    this.cut = true;
    return false;
  }
}

/** Of `text`'s first `room` code units, how many fit in `space`, not ending inside a pair. */
function fitting(text: string, room: number, space: number): number {
  if (room <= space) return room;
  let end = Math.max(space, 0);
  const last = text.charCodeAt(end - 1);
  if (end > 0 && last >= 0xd800 && last <= 0xdbff) end -= 1;
  return end;
}

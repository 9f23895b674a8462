/**
 * The output pieces of a chat delta or message (src/domain/chat/output-tally.ts): the fields
 * that carry visible output, in the order the tally counts them, and a delta cut at one of them.
 */

/** The fields of a delta (or message) that carry visible output, in the order they are kept. */
const textFields = ["reasoning_content", "reasoning", "content", "refusal"] as const;
export type TextField = (typeof textFields)[number];

type Json = Record<string, unknown>;

/**
 * One piece of output: its field, its text, and its tool call's key (name, arguments; -1: the
 * legacy `function_call`). A tool-call entry's start is a piece too (`entry`, no text): a
 * translator may take or refuse an entry whatever it carries.
 */
export interface Piece {
  readonly field: string;
  readonly text: string;
  readonly call: number | undefined;
  /** An `entry`: the tool-call entry as it came, and its position in the delta's list. */
  readonly entry?: Json;
  readonly position?: number;
}

/** The output pieces of a delta or message, in the order {@link cutPieces} walks them. */
export function piecesOf(delta: Json): Piece[] {
  const pieces: Piece[] = [];
  for (const field of textFields) {
    const text = delta[field];
    if (typeof text === "string" && text !== "") pieces.push({ field, text, call: undefined });
  }
  const calls = delta["tool_calls"];
  if (Array.isArray(calls)) {
    for (let i = 0; i < calls.length; i += 1) {
      const call = calls[i] as Json | null;
      if (typeof call !== "object" || call === null) continue;
      const index = call["index"];
      const key = typeof index === "number" && Number.isSafeInteger(index) ? index : i;
      pieces.push({ field: "entry", text: "", call: key, entry: call, position: i });
      pushFunction(pieces, call["function"], key);
    }
  }
  const legacy = delta["function_call"];
  if (typeof legacy === "object" && legacy !== null) pushFunction(pieces, legacy, -1);
  return pieces;
}

function pushFunction(pieces: Piece[], fn: unknown, call: number): void {
  if (typeof fn !== "object" || fn === null) return;
  const { name, arguments: args } = fn as Json;
  if (typeof name === "string" && name !== "") pieces.push({ field: "name", text: name, call });
  if (typeof args === "string" && args !== "")
    pieces.push({ field: "arguments", text: args, call });
}

/**
 * A copy of a delta cut at its piece `at` (in {@link piecesOf}'s order): the pieces before it
 * as they were, that one as `kept`, every later one empty; the tool-call entries that begin
 * after the cut (or at it) are left out.
 */
export function cutPieces(delta: Json, at: number, kept: string): Json {
  let i = 0;
  const keep = (text: string): string => {
    const position = i++;
    return position < at ? text : position === at ? kept : "";
  };
  const copy: Json = { ...delta };
  for (const field of textFields) {
    const text = copy[field];
    if (typeof text === "string" && text !== "") copy[field] = keep(text);
  }
  const calls = copy["tool_calls"];
  if (Array.isArray(calls)) {
    const kept: unknown[] = [];
    for (const call of calls) {
      if (typeof call !== "object" || call === null) continue;
      // The entry's own piece: an entry from the cut on carries nothing, and is left out.
      if (i++ >= at) break;
      const fn = (call as Json)["function"];
      kept.push(
        typeof fn === "object" && fn !== null
          ? { ...(call as Json), function: cutFunction(fn as Json, keep) }
          : call,
      );
    }
    copy["tool_calls"] = kept;
  }
  const legacy = copy["function_call"];
  if (typeof legacy === "object" && legacy !== null)
    copy["function_call"] = cutFunction(legacy as Json, keep);
  return copy;
}

function cutFunction(fn: Json, keep: (text: string) => string): Json {
  const copy: Json = { ...fn };
  if (typeof copy["name"] === "string" && copy["name"] !== "") copy["name"] = keep(copy["name"]);
  if (typeof copy["arguments"] === "string" && copy["arguments"] !== "")
    copy["arguments"] = keep(copy["arguments"]);
  return copy;
}

const encoder = new TextEncoder();

/** The bytes an entry of a choice's `logprobs` list spells (its `bytes`, else its token's). */
function entryBytes(entry: unknown): number {
  if (typeof entry !== "object" || entry === null) return 0;
  const { bytes, token } = entry as Json;
  if (Array.isArray(bytes)) return bytes.length;
  return typeof token === "string" ? encoder.encode(token).length : 0;
}

/**
 * A choice's `logprobs` cut as its delta or message was by {@link cutPieces}: each list
 * (`content`, `refusal`) keeps the entries that begin inside the text its field kept, so a
 * client is not sent the tokens of output cut away. The last entry kept may end past the cut, as
 * the kept text may end inside a provider's token (the gateway cuts where its own count reaches
 * the limit).
 */
export function cutLogprobs(logprobs: unknown, cut: Json): unknown {
  if (typeof logprobs !== "object" || logprobs === null || Array.isArray(logprobs)) return logprobs;
  const copy: Json = { ...(logprobs as Json) };
  for (const field of ["content", "refusal"] as const) {
    const entries = copy[field];
    if (!Array.isArray(entries)) continue;
    const text = cut[field];
    const room = typeof text === "string" ? encoder.encode(text).length : 0;
    let spelled = 0;
    let keep = 0;
    while (keep < entries.length && spelled < room) spelled += entryBytes(entries[keep++]);
    if (keep < entries.length) copy[field] = entries.slice(0, keep);
  }
  return copy;
}

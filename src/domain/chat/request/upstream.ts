import type { ChatRequest } from "./request.js";
import { forwardedMembers } from "../../../schema/chat.js";
import { concatBytes, OPEN_OBJECT, objectMembers, skipSpace, type Member } from "./json.js";

/**
 * The bytes a chat request sends upstream (request.ts): the client's body,
 * edited by splicing.
 */

const utf8Encoder = new TextEncoder();

const includeUsageMember = utf8Encoder.encode('"include_usage":true');
const includeUsageMemberComma = utf8Encoder.encode('"include_usage":true,');
const streamOptionsMember = utf8Encoder.encode('"stream_options":{"include_usage":true}');
const streamOptionsValue = utf8Encoder.encode('{"include_usage":true}');
const trueLiteral = utf8Encoder.encode("true");
const comma = utf8Encoder.encode(",");
const nothing = new Uint8Array();

/**
 * The members of the chat body that reach the provider ({@link forwardedMembers}, declared with
 * the schema in src/schema/chat.ts): an allowlist. Every other top-level member is cut: the
 * gateway's own (`offer`, `provider`: they choose the offer, and would show the provider a
 * client's pins and the competitors it ranks, restricts or excludes), the servers' length
 * controls and counting controls, which parsing let through only at values that change nothing,
 * and any member the gateway does not know, which it cannot tell will not make an honest provider
 * generate or count what the client never sees (and so be judged diverged).
 */
const forwarded: ReadonlySet<string> = new Set(forwardedMembers);
const isCut = (key: string): boolean => !forwarded.has(key);

/** The members that carry the output limit (per choice) to an OpenAI-compatible server. */
const limitMembers: ReadonlySet<string> = new Set(["max_tokens", "max_completion_tokens"]);

/** `raw[start, end)` becomes `text`. */
interface Edit {
  readonly start: number;
  readonly end: number;
  readonly text: Uint8Array;
}

/**
 * The bytes to send to the provider: the client's bytes, edited by splicing (never
 * re-serialised), so the forwarded members' values, key order, whitespace and numbers beyond
 * 2^53 reach the provider exactly as sent. Three edits, each made only when needed:
 *
 * - Every top-level member outside the allowlist ({@link forwarded}: the gateway's own `offer`
 *   and `provider`, the servers' length and counting controls, unknown members) is cut out with
 *   its separating comma (and the white space between it and the next member); a body without
 *   such members keeps every byte. Escaped spellings (`"offe\u0072"`) are the same key to the
 *   provider's parser, and are cut too. Members below the top level (inside messages, tools,
 *   `stream_options`) are the client's and stay as sent.
 * - The provider generates at most `limit` tokens per choice, the output limit the quote priced
 *   ({@link outputLimit} for the offer that serves the request):
 *   - a `max_tokens` or `max_completion_tokens` the body has keeps its bytes when it is at most
 *     `limit`; one that is `null` or above `limit` becomes `limit`;
 *   - a body with neither gains `"max_tokens":<limit>` right after the opening `{`: the field
 *     every OpenAI-compatible server reads (vLLM, llama.cpp, SGLang, TGI, Ollama); the newer
 *     `max_completion_tokens` is not read by all of them, and a second field could only make
 *     servers disagree on which one wins.
 * - The gateway meters every stream from the provider's usage, so a streaming request always asks
 *   for it: when `stream_options.include_usage` is not already true, the body gains it.
 *   - no `stream_options`: `"stream_options":{"include_usage":true}` goes right after the
 *     opening `{`;
 *   - `stream_options: null`: the `null` becomes `{"include_usage":true}`;
 *   - a `stream_options` object: its `include_usage` value becomes `true`, or
 *     `"include_usage":true` is added as its first member; its other members stay.
 *
 * A body that has nothing to cut, carries a limit at most `limit`, and does not stream or already
 * asks for usage goes upstream byte for byte (the very array).
 */
export function upstreamBody(req: ChatRequest, limit: bigint): Uint8Array {
  const raw = req.raw;
  const top = req.members;
  const edits: Edit[] = [];
  // Members added right after the opening `{`, in this order.
  const added: Uint8Array[] = [];
  let lastKept = -1;
  for (let i = 0; i < top.length; i += 1) if (!isCut(top[i]!.key)) lastKept = i;
  let limited = false;
  for (let i = 0; i < top.length; i += 1) {
    const member = top[i]!;
    if (isCut(member.key)) edits.push(cut(top, i, lastKept));
    else if (limitMembers.has(member.key)) {
      limited = true;
      const value = member.key === "max_tokens" ? req.maxTokens : req.maxCompletionTokens;
      if (value === undefined || value > limit) {
        edits.push({
          start: member.valueStart,
          end: member.valueEnd,
          text: utf8Encoder.encode(limit.toString()),
        });
      }
    }
  }
  if (!limited) added.push(utf8Encoder.encode(`"max_tokens":${limit}`));
  if (req.stream && !req.includeUsage) edits.push(...usageEdits(raw, top, added));
  if (added.length > 0) {
    const at = skipSpace(raw, 0) + 1;
    const parts = added.flatMap((member, i) => (i === 0 ? [member] : [comma, member]));
    if (lastKept >= 0) parts.push(comma);
    edits.push({ start: at, end: at, text: concatBytes(parts) });
  }
  if (edits.length === 0) return raw;
  // Sorted by position (an insertion before a cut that starts at the same byte); none overlap.
  edits.sort((a, b) => a.start - b.start || a.end - b.end);
  const parts: Uint8Array[] = [];
  let from = 0;
  for (const edit of edits) {
    parts.push(raw.subarray(from, edit.start), edit.text);
    from = edit.end;
  }
  parts.push(raw.subarray(from));
  return concatBytes(parts);
}

/**
 * The cut that removes the top-level member `top[i]` and one comma next to it. Before the last
 * kept member (`top[lastKept]`), the cut runs from its key to the next member's key (taking the
 * comma after it); after it, from the end of the previous member's value (taking the comma
 * before it) to the end of its own. Cuts of neighbouring members are adjacent, never overlapping.
 */
function cut(top: readonly Member[], i: number, lastKept: number): Edit {
  const member = top[i]!;
  if (i < lastKept) return { start: member.keyStart, end: top[i + 1]!.keyStart, text: nothing };
  const start = i === 0 ? member.keyStart : top[i - 1]!.valueEnd;
  return { start, end: member.valueEnd, text: nothing };
}

/**
 * The edits that make the body ask for usage on its stream (see {@link upstreamBody}); a
 * `stream_options` member to add goes to `added`.
 */
function usageEdits(raw: Uint8Array, top: readonly Member[], added: Uint8Array[]): Edit[] {
  const existing = top.find((m) => m.key === "stream_options");
  if (existing === undefined) {
    added.push(streamOptionsMember);
    return [];
  }
  const { valueStart, valueEnd } = existing;
  if (raw[valueStart] !== OPEN_OBJECT) {
    // null (anything else failed validation)
    return [{ start: valueStart, end: valueEnd, text: streamOptionsValue }];
  }
  const inner = objectMembers(raw, valueStart).members;
  const usage = inner.filter((m) => m.key === "include_usage");
  if (usage.length === 0) {
    const at = valueStart + 1;
    const text = inner.length > 0 ? includeUsageMemberComma : includeUsageMember;
    return [{ start: at, end: at, text }];
  }
  // Every occurrence, so a provider that keeps the first of duplicate keys also sees true.
  return usage.map((m) => ({ start: m.valueStart, end: m.valueEnd, text: trueLiteral }));
}

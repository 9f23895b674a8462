import type { ChatRequest } from "../../src/domain/chat/request/index.js";
import { GatewayError } from "../../src/domain/errors.js";
import type { OutputCount, TokenCounter, TokenCounters } from "../../src/domain/tokens.js";

/**
 * Small exact counters implementing the domain's port (src/domain/tokens.ts), for tests whose
 * counts are worked out by hand: a counter is its `tokenize` function, applied to the whole text
 * (so `OutputCount` is exact by construction, and `fit` the longest prefix that fits).
 */

export interface ExactCounterOptions {
  /** The prompt's tokens (default: every message's text tokenized, no template). */
  readonly input?: (req: ChatRequest) => bigint;
  /** Called with every request whose input is counted (to see when, and whether, it was). */
  readonly onInput?: (req: ChatRequest) => void;
  /** A template that refuses the conversation: `countInput` rejects `invalid_request`. */
  readonly refuses?: (req: ChatRequest) => string | undefined;
}

export function exactCounter(
  name: string,
  tokenize: (text: string) => readonly string[],
  options: ExactCounterOptions = {},
): TokenCounter {
  const count = (text: string) => BigInt(tokenize(text).length);
  return {
    exact: true,
    name,
    countInput(req) {
      options.onInput?.(req);
      const refusal = options.refuses?.(req);
      if (refusal !== undefined)
        return Promise.reject(new GatewayError("invalid_request", refusal));
      if (options.input !== undefined) return Promise.resolve(options.input(req));
      let tokens = 0n;
      for (const message of req.messages) {
        const content = (message as { content?: unknown }).content;
        if (typeof content === "string") tokens += count(content);
      }
      return Promise.resolve(tokens);
    },
    countOutput: count,
    output(): OutputCount {
      let text = "";
      return {
        append(more) {
          text += more;
        },
        count: () => count(text),
        fit(more, limit) {
          let end = 0;
          for (const char of more) {
            if (count(text + more.slice(0, end + char.length)) > limit) break;
            end += char.length;
          }
          return end;
        },
        heavy: () => false,
        settle: () => Promise.resolve(),
      };
    },
  };
}

/** One token per code point (a CJK text's count, worked out by eye). */
export const perCharacter = (options?: ExactCounterOptions) =>
  exactCounter("per-character", (text) => Array.from(text), options);

/**
 * One token per non-space run with the spaces before it (" w1" is one token, like a BPE word
 * piece), and trailing spaces as one.
 */
export const words = (options?: ExactCounterOptions) =>
  exactCounter("words", (text) => text.match(/\s*\S+|\s+$/g) ?? [], options);

/** Counters that give every model `counter` (undefined: every model still loading). */
export function countersOf(counter: TokenCounter | undefined): TokenCounters {
  return {
    forModel: () => counter,
    meteringOf: () =>
      counter?.exact === true ? { kind: "exact", tokenizer: counter.name } : { kind: "bound" },
    preload: () => Promise.resolve(),
  };
}

/**
 * A counter whose long texts are "heavy" (issue 35: counted off the event loop), and whose
 * heavy path is observable: its tokens are runs of one character, up to 4 a token (as a BPE
 * merges a run of spaces), so one long run is one long piece. Any text longer than `threshold`
 * it counts only in `settle` (asynchronously); `longestSync` is the longest text a synchronous
 * `fit` or `count` counted, `settles` how many counts went the asynchronous way.
 */
export function runsCounter(threshold: number) {
  const tokenize = (text: string) => text.match(/(.)\1{0,3}/gsu) ?? [];
  const tokens = (text: string) => BigInt(tokenize(text).length);
  const fitOf = (text: string, more: string, limit: bigint) => {
    let end = 0;
    for (const char of more) {
      if (tokens(text + more.slice(0, end + char.length)) > limit) break;
      end += char.length;
    }
    return end;
  };
  const seen = { longestSync: 0, settles: 0 };
  const counter: TokenCounter = {
    ...words(),
    name: "runs",
    countOutput: tokens,
    output(): OutputCount {
      let text = "";
      let known: bigint | undefined = 0n;
      let settled: { more: string; limit: bigint; keep: number; after: bigint } | undefined;
      const sync = (counted: string) => {
        seen.longestSync = Math.max(seen.longestSync, counted.length);
      };
      return {
        append(more) {
          const was = settled;
          settled = undefined;
          if (was !== undefined && more === was.more.slice(0, was.keep)) known = was.after;
          else known = undefined;
          text += more;
        },
        count() {
          if (known === undefined) {
            sync(text);
            known = tokens(text);
          }
          return known;
        },
        fit(more, limit) {
          if (settled?.more === more && settled.limit === limit) return settled.keep;
          sync(text + more);
          return fitOf(text, more, limit);
        },
        heavy(more) {
          if (more === undefined) return known === undefined && text.length > threshold;
          if (settled?.more === more) return false;
          return text.length + more.length > threshold;
        },
        async settle(more, limit) {
          seen.settles += 1;
          const at = text;
          await new Promise((resolve) => setTimeout(resolve, 0));
          if (at !== text) return;
          if (more === undefined) known = tokens(text);
          else {
            const keep = limit === undefined ? more.length : fitOf(text, more, limit);
            settled = { more, limit: limit!, keep, after: tokens(text + more.slice(0, keep)) };
          }
        },
      };
    },
  };
  return { counter, seen, tokens, fitOf };
}

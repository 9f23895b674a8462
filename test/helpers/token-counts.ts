import { parseChatRequest } from "../../src/domain/chat/request/index.js";
import { canonicalBody, dialects, type DialectName } from "../../src/domain/dialects/index.js";
import { createTokenCounters } from "../../src/adapters/tokenizers/token-counters.js";
import type { TokenCounter } from "../../src/domain/tokens.js";

/**
 * The token counter the gateway under test uses for the demo market's `demo-chat`, so a test
 * works out what the gateway must count from the same tokenizer files (DESIGN.md 10: anyone
 * with the files can reproduce the count). Prompts are counted inline (no worker thread): the
 * counts are the same.
 */
export async function demoChatCounter(): Promise<TokenCounter> {
  const counters = await createTokenCounters({ threads: 0 });
  const model = { repository: "demo/chat-small", revision: "v1" };
  await counters.preload([model]);
  return counters.forModel(model)!;
}

const bounds = { maxBytes: 4 * 1024 * 1024 };

/**
 * The prompt tokens of a request body by `counter`: a chat completion's, or a dialect's as the
 * gateway translates it to one.
 */
export function promptTokens(
  counter: TokenCounter,
  body: unknown,
  dialect?: DialectName,
): Promise<bigint> {
  let raw: Uint8Array = new TextEncoder().encode(JSON.stringify(body));
  if (dialect !== undefined)
    raw = canonicalBody(dialects[dialect], raw as Uint8Array<ArrayBuffer>, bounds).body;
  return counter.countInput(parseChatRequest(raw, bounds));
}

/** The longest prefix of `text` that `counter` counts at most `limit` tokens (the relay's cut). */
export function truncated(counter: TokenCounter, text: string, limit: bigint): string {
  return text.slice(0, counter.output().fit(text, limit));
}

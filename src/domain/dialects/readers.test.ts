import { describe, expect, it } from "vitest";
import { words } from "../../../test/helpers/exact-counter.js";
import { OutputTally } from "../chat/output-tally.js";
import { maxToolCalls } from "./messages-stream.js";
import { messagesDialect } from "./messages.js";
import { maxHeldParts } from "./responses-stream.js";
import { responsesDialect } from "./responses.js";
import type { Dialect, DialectEvent, GatewayCharge } from "./types.js";

/**
 * Issue 35: what a dialect's translator drops after its own cut is not read and not charged.
 * The tally (with the dialect's reader) relays a canonical stream to the real translator: what
 * the tally counted and relayed is exactly what the translator shows, so nothing it dropped is
 * charged.
 */

const requestId = `0x${"ab".repeat(32)}`;
const charge: GatewayCharge = {
  request_id: requestId,
  quote_id: `0x${"cd".repeat(32)}`,
  offer_id: `0x${"ef".repeat(32)}`,
  tariff_version: "1",
  input_tokens: "1",
  output_tokens: "1",
  credits_charged: "1",
  billing: "billed",
};

const chunk = (delta: Record<string, unknown>, extra: object = {}) => ({
  id: "c",
  object: "chat.completion.chunk",
  created: 1,
  model: "m",
  choices: [{ index: 0, delta, finish_reason: null }],
  ...extra,
});

/** The chunks through the tally and the dialect's translator: what each saw. */
function relay(dialect: Dialect, chunks: readonly unknown[]) {
  const counter = words();
  const tally = new OutputTally(counter, 1_000_000n, 1n, dialect.reader(true));
  const stream = dialect.createStream({ requestId, model: "m" });
  const relayed: Record<string, unknown>[] = [];
  const events: DialectEvent[] = [];
  for (const c of chunks) {
    const out = tally.addChunk(c);
    if (out !== undefined) {
      relayed.push(out as Record<string, unknown>);
      events.push(...stream.chunk(out));
    }
    if (tally.done) break;
  }
  events.push(...stream.finish(charge));
  const deltas = relayed.map(
    (c) => (c["choices"] as { delta: Record<string, unknown> }[])[0]?.delta ?? {},
  );
  const content = deltas
    .map((d) => (typeof d["content"] === "string" ? d["content"] : ""))
    .join("");
  const calls = deltas.flatMap((d) => (Array.isArray(d["tool_calls"]) ? d["tool_calls"] : []));
  return { tally, counter, events, content, calls };
}

const data = (events: DialectEvent[], type: string) =>
  events
    .filter((e) => (e.data as { type: string }).type === type)
    .map((e) => e.data as Record<string, unknown>);

describe("the Responses translator's cut is the billing point", () => {
  it('"Hi", more tool calls than it holds, then text: the calls past its bound and the text after are not relayed or counted', () => {
    const chunks = [
      chunk({ content: "Hi" }),
      ...Array.from({ length: 2 * maxHeldParts }, (_, i) =>
        chunk({
          tool_calls: [{ index: i, id: `c${i}`, function: { name: "f", arguments: "{}" } }],
        }),
      ),
      chunk({ content: " padding".repeat(1_000) }),
    ];
    const { tally, events, content, calls } = relay(responsesDialect, chunks);
    const items = data(events, "response.output_item.added");
    // The message and every call the tally relayed are the translator's items: nothing more.
    expect(items).toHaveLength(1 + calls.length);
    expect(calls.length).toBe(maxHeldParts - 2);
    expect(content).toBe("Hi");
    const shown = data(events, "response.output_text.delta")
      .map((d) => d["delta"])
      .join("");
    expect(shown).toBe("Hi");
    // "Hi" (1), each call's name and arguments (1 + 1), and the line breaks between fields.
    expect(tally.count().outputTokens).toBe(1n + 2n * BigInt(calls.length));
    expect(tally.count().toolCalls).toBe(BigInt(calls.length));
  });

  it("padding where it never reads: extra choices, empty tool calls, the legacy function_call", () => {
    const { tally, content } = relay(responsesDialect, [
      {
        ...chunk({ content: "Hi", function_call: { name: "pad", arguments: " x".repeat(500) } }),
        choices: [
          { index: 0, delta: { content: "Hi", function_call: { name: "pad", arguments: " x" } } },
          ...Array.from({ length: 600 }, (_, i) => ({ index: i + 1, delta: { content: "x" } })),
        ],
      },
      ...Array.from({ length: 300 }, (_, i) => chunk({ tool_calls: [{ index: i, function: {} }] })),
    ]);
    expect(content).toBe("Hi");
    expect(tally.count()).toEqual({
      outputTokens: 1n,
      reasoningTokens: 0n,
      choices: 1n,
      toolCalls: 0n,
      stopped: 0n,
    });
  });
});

describe("the Messages translator's cut is the billing point", () => {
  it('"Hi", more tool calls than it holds (empty ones too), then text: nothing past its cut is relayed or counted', () => {
    const chunks = [
      chunk({ content: "Hi" }),
      ...Array.from({ length: maxToolCalls + 10 }, (_, i) => chunk({ tool_calls: [{ index: i }] })),
      chunk({ content: " padding".repeat(1_000) }),
    ];
    const { tally, events, content, calls } = relay(messagesDialect, chunks);
    expect(content).toBe("Hi");
    expect(calls).toHaveLength(maxToolCalls);
    const text = data(events, "content_block_delta")
      .map((d) => (d["delta"] as { text?: string }).text ?? "")
      .join("");
    expect(text).toBe("Hi");
    expect(tally.count().outputTokens).toBe(1n);
    expect(data(events, "message_delta")[0]).toMatchObject({
      delta: { stop_reason: "max_tokens" },
    });
  });

  it("refusals and the legacy function_call it never reads are not counted", () => {
    const { tally } = relay(messagesDialect, [
      chunk({
        content: "Hi",
        refusal: " no".repeat(300),
        function_call: { name: "f", arguments: "{}" },
      }),
    ]);
    expect(tally.count().outputTokens).toBe(1n);
  });
});

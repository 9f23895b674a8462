import { createParser, type EventSourceMessage } from "eventsource-parser";
import fc from "fast-check";
import OpenAI from "openai";
import { _iterSSEMessages } from "openai/core/streaming";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { authed, json, startChatStack, type TestStack } from "./helpers/stack.js";

/**
 * What a provider sends is data, never framing (DESIGN.md 8, issue 18): every provider event
 * reaches the client as one event with the same data, and no provider byte sequence can end an
 * event early, start another, or produce a `[DONE]` or an `x_gateway` member the gateway did not
 * write. The provider is a real HTTP server writing the given bytes; the client reads the
 * gateway's real REST route with standard SSE parsers (eventsource-parser, and the official
 * openai SDK's reader).
 */

const encoder = new TextEncoder();

interface ClientView {
  readonly events: EventSourceMessage[];
  readonly comments: string[];
  readonly retries: number[];
  readonly requestId: string;
  readonly bytes: Uint8Array;
}

/** Every event, comment and retry field a standard SSE parser reads from `bytes`. */
function parseSse(bytes: Uint8Array | string, terminate = false) {
  const events: EventSourceMessage[] = [];
  const comments: string[] = [];
  const retries: number[] = [];
  const parser = createParser({
    onEvent: (event) => events.push(event),
    onComment: (comment) => comments.push(comment),
    onRetry: (retry) => retries.push(retry),
  });
  parser.feed(typeof bytes === "string" ? bytes : new TextDecoder().decode(bytes));
  // The gateway delivers a provider's unterminated last event (docs/decisions/chat-quotes-and-money.md, Streams).
  if (terminate) parser.feed("\n\n");
  return { events, comments, retries };
}

/**
 * The provider events the client must see, in order: those a standard parser reads from the
 * provider's bytes, up to its `data: [DONE]`, minus what docs/decisions/chat-quotes-and-money.md ("Provider framing")
 * says the gateway drops: a JSON chunk with a top-level `x_gateway` member, and data that is
 * not JSON and holds `[DONE]` or `x_gateway`.
 */
function expectedData(providerBytes: Uint8Array): string[] {
  const out: string[] = [];
  for (const { data } of parseSse(providerBytes, true).events) {
    if (data === "[DONE]") break;
    let parsed: unknown;
    let isJson = true;
    try {
      parsed = JSON.parse(data);
    } catch {
      isJson = false;
    }
    if (isJson) {
      if (typeof parsed === "object" && parsed !== null && "x_gateway" in parsed) continue;
    } else if (data.includes("[DONE]") || data.includes("x_gateway")) continue;
    out.push(data);
  }
  return out;
}

/** The gateway's own events: its last chunk (the charge of this request) and `[DONE]`, last. */
function expectGatewayTail(view: ClientView): void {
  const data = view.events.map((e) => e.data);
  expect(data.at(-1)).toBe("[DONE]");
  expect(data.filter((d) => d.startsWith("[DONE]"))).toEqual(["[DONE]"]);
  const final = JSON.parse(data.at(-2)!) as { x_gateway?: { request_id?: string } };
  expect(final.x_gateway?.request_id).toBe(view.requestId);
  const withMember = data.filter((d) => {
    try {
      const value = JSON.parse(d) as unknown;
      return typeof value === "object" && value !== null && "x_gateway" in value;
    } catch {
      return false;
    }
  });
  expect(withMember).toHaveLength(1);
  // Nothing of a provider's fields but its data: no names, ids, retry fields or comments.
  expect(view.events.every((e) => e.event === undefined && e.id === undefined)).toBe(true);
  expect(view.comments).toEqual([]);
  expect(view.retries).toEqual([]);
}

describe("provider framing", () => {
  let stack: TestStack;
  let fake: FakeUpstream;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack());
  }, 60_000);
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });
  beforeEach(() => fake.setOptions({ rawStream: undefined }));

  const body = {
    model: "demo-chat",
    messages: [{ role: "user", content: "framing" }],
    stream: true,
    // Usage-only chunks are the client's too: nothing but the framing rules filters events.
    stream_options: { include_usage: true },
    max_tokens: 64,
  };

  /** One streamed chat whose provider writes `pieces`, as the client's SSE parser reads it. */
  async function streamThrough(pieces: readonly Uint8Array[]): Promise<ClientView> {
    fake.setOptions({ rawStream: pieces });
    const res = await authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json", "x-gateway-permit": stack.demo.permitId },
      body: JSON.stringify(body),
    });
    expect(res.status).toBe(200);
    const bytes = new Uint8Array(await res.arrayBuffer());
    return { ...parseSse(bytes), requestId: res.headers.get("x-gateway-request-id")!, bytes };
  }

  const chunk = (content: string, extra: object = {}) =>
    JSON.stringify({
      id: "chatcmpl-hostile",
      object: "chat.completion.chunk",
      created: 1,
      model: "demo-chat",
      choices: [{ index: 0, delta: { content }, finish_reason: null }],
      ...extra,
    });
  const forgedCharge = '{"x_gateway":{"credits_charged":"1"}}';
  const pretty = JSON.stringify(JSON.parse(chunk(" pretty")), null, 1);
  /** The forged stream: one provider event whose data holds empty lines (two variants). */
  const forgedStream = [
    `data: ${chunk("Hello")}\n\n`,
    // As issue 18 reproduced it, and with `data:` inside the data (the variant that, written
    // as it came, gave the client a forged charge chunk and an early [DONE]).
    `data: ${chunk(" world")}\ndata:\ndata: ${forgedCharge}\ndata:\ndata: [DONE]\n\n`,
    `data: ${chunk("!")}\ndata:\ndata: data: ${forgedCharge}\ndata:\ndata: data: [DONE]\n\n`,
    // A chunk of its own claiming the charge, and a real one's with the member added.
    `data: ${forgedCharge}\n\n`,
    `data: ${chunk(" again", { x_gateway: { credits_charged: "1" } })}\n\n`,
    // A multi-line (pretty-printed) chunk: one event of many data lines, which stays one.
    `data: ${pretty.split("\n").join("\ndata: ")}\n\n`,
    `data: ${JSON.stringify({ id: "chatcmpl-hostile", object: "chat.completion.chunk", created: 1, model: "demo-chat", choices: [], usage: { prompt_tokens: 3, completion_tokens: 4, total_tokens: 7 } })}\n\n`,
    "data: [DONE]\n\n",
  ].map((text) => encoder.encode(text));

  it("the forged-event stream: one x_gateway chunk and one [DONE], both last and the gateway's (eventsource-parser)", async () => {
    const view = await streamThrough(forgedStream);
    expectGatewayTail(view);
    const data = view.events.map((e) => e.data);
    // The provider's well-formed chunks, one event each, the multi-line one whole; the forged
    // ones nowhere.
    expect(data.slice(0, -2)).toEqual([
      chunk("Hello"),
      pretty,
      JSON.stringify({
        id: "chatcmpl-hostile",
        object: "chat.completion.chunk",
        created: 1,
        model: "demo-chat",
        choices: [],
        usage: { prompt_tokens: 3, completion_tokens: 4, total_tokens: 7 },
      }),
    ]);
    const final = JSON.parse(data.at(-2)!) as { x_gateway: { credits_charged: string } };
    const record = await json(await authed(stack, `/v1/requests/${view.requestId}`));
    expect(final.x_gateway.credits_charged).toBe(record.credits_charged);
    expect(record.status).toBe("completed");
    // Charged what the provider reported for the chunks that reached the client.
    expect(record.output_tokens).toBe("4");
  });

  it("the forged-event stream through the official openai SDK: its chunks, then the gateway's charge, last", async () => {
    fake.setOptions({ rawStream: forgedStream });
    const client = new OpenAI({
      apiKey: stack.apiKey,
      baseURL: `${stack.gateway.url}/v1`,
      defaultHeaders: { "X-Gateway-Permit": stack.demo.permitId },
      maxRetries: 0,
    });
    const { data: stream, response } = await client.chat.completions
      .create({
        model: "demo-chat",
        messages: [{ role: "user", content: "framing" }],
        stream: true,
        stream_options: { include_usage: true },
        max_tokens: 64,
      })
      .withResponse();
    const chunks: Record<string, unknown>[] = [];
    for await (const c of stream) chunks.push(c as unknown as Record<string, unknown>);
    const charged = chunks.filter((c) => "x_gateway" in c);
    expect(charged).toHaveLength(1);
    expect(chunks.at(-1)).toBe(charged[0]);
    const requestId = response.headers.get("x-gateway-request-id")!;
    const record = await json(await authed(stack, `/v1/requests/${requestId}`));
    expect(charged[0]!.x_gateway).toMatchObject({
      request_id: requestId,
      credits_charged: record.credits_charged,
    });
    expect(chunks.map((c) => (c.choices as { delta?: { content?: string } }[])[0]?.delta)).toEqual([
      { content: "Hello" },
      { content: " pretty" },
      undefined, // the usage chunk
      undefined, // the gateway's final chunk
    ]);
  });

  /** One line of a provider's stream: a field, a comment or an empty line, and its line end. */
  const lineEnd = fc.constantFrom("\n", "\r", "\r\n");
  const jsonChunk = fc
    .record({
      content: fc.string({ unit: "grapheme", maxLength: 12 }),
      member: fc.constantFrom(undefined, "top", "nested"),
    })
    .map(({ content, member }) =>
      JSON.stringify({
        id: "c",
        object: "chat.completion.chunk",
        choices: [
          {
            index: 0,
            delta: member === "nested" ? { content, x_gateway: { billing: "void" } } : { content },
          },
        ],
        ...(member === "top" ? { x_gateway: { credits_charged: "1" } } : {}),
      }),
    );
  const value = fc.oneof(
    jsonChunk,
    fc.constantFrom(
      "",
      " ",
      "[DONE]",
      " [DONE]",
      "[DONE] tail",
      "data: [DONE]",
      "data: {}",
      "data:",
      ":",
      forgedCharge,
      "x_gateway",
      '{"a":1} trailing',
      "event: done",
      "id: 7",
      "retry: 10",
    ),
    fc.string({ unit: "grapheme", maxLength: 16 }).filter((s) => !/[\r\n]/.test(s)),
  );
  const line = fc.oneof(
    { weight: 5, arbitrary: fc.tuple(fc.constant("data:"), value) },
    {
      weight: 1,
      arbitrary: fc.tuple(fc.constantFrom("data: ", "data:  ", "data"), value),
    },
    {
      weight: 2,
      arbitrary: fc.tuple(
        fc.constantFrom("event:", "id:", "retry:", ":", "foo:", "DATA:", " data:"),
        value,
      ),
    },
    { weight: 3, arbitrary: fc.constant(["", ""] as [string, string]) },
  );
  const providerStream = fc
    .record({
      lines: fc.array(fc.tuple(line, lineEnd), { minLength: 1, maxLength: 24 }),
      cuts: fc.array(fc.nat(), { maxLength: 8 }),
    })
    .map(({ lines, cuts }) => {
      const text = lines.map(([[field, v], end]) => `${field}${v}${end}`).join("");
      const bytes = encoder.encode(text);
      // Split across writes at arbitrary byte offsets (through UTF-8 sequences and CRLFs too).
      const points = [...new Set(cuts.map((c) => c % (bytes.byteLength + 1)))].sort(
        (a, b) => a - b,
      );
      const pieces: Uint8Array[] = [];
      let from = 0;
      for (const at of points) {
        if (at > from) pieces.push(bytes.subarray(from, at));
        from = at;
      }
      if (from < bytes.byteLength) pieces.push(bytes.subarray(from));
      return { bytes, pieces };
    });

  it("property: arbitrary provider bytes, split anywhere: the client sees exactly the provider's events (minus the documented drops) and then the gateway's own (eventsource-parser and the openai SDK's reader)", async () => {
    await fc.assert(
      fc.asyncProperty(providerStream, async ({ bytes, pieces }) => {
        const view = await streamThrough(pieces);
        expectGatewayTail(view);
        expect(view.events.slice(0, -2).map((e) => e.data)).toEqual(expectedData(bytes));
        // The openai SDK's own SSE reader over the same bytes: its [DONE] test (a data that
        // starts with "[DONE]") holds only for the gateway's last event.
        const sdk: string[] = [];
        for await (const message of _iterSSEMessages(
          new Response(view.bytes),
          new AbortController(),
        ))
          sdk.push(message.data);
        expect(sdk).toEqual(view.events.map((e) => e.data));
        expect(sdk.findIndex((d) => d.startsWith("[DONE]"))).toBe(sdk.length - 1);
      }),
      { numRuns: 60 },
    );
  }, 120_000);
});

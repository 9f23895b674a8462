import type { Hex } from "viem";
import { describe, expect, it } from "vitest";
import { outputBound, outputLimit, parseChatRequest } from "./request/index.js";
import { callProvider } from "./call-provider.js";
import type { UpstreamChatOptions, UpstreamReply } from "./ports.js";
import { flowFromEvents } from "../../../test/helpers/upstream-flow.js";

/**
 * callProvider: the body and options one provider call carries (issue 27, items 6 and 7), from
 * the candidate's output limit and bound as routing priced them.
 */

const offerId = `0x${"0a".repeat(32)}` as Hex;
const decoder = new TextDecoder();

async function call(body: object, capabilities: Record<string, unknown>) {
  const sent: { body: string; options: UpstreamChatOptions }[] = [];
  const reply: UpstreamReply = {
    status: 200,
    text: () => Promise.resolve("{}"),
    stream: (into: (data: string) => boolean) => flowFromEvents((async function* () {})(), into),
    discard: () => Promise.resolve(),
  };
  const req = parseChatRequest(new TextEncoder().encode(JSON.stringify(body)), {
    maxBytes: 1 << 20,
  });
  const result = await callProvider(
    {
      endpoints: () => Promise.resolve({ url: "https://provider.example" }),
      upstream: (_endpoint, bytes, options) => {
        sent.push({ body: decoder.decode(bytes), options });
        return Promise.resolve(reply);
      },
    },
    {
      offer: { offerId },
      outputLimit: outputLimit(req, capabilities),
      maxOutputTokens: outputBound(req, capabilities),
    },
    req,
    new AbortController().signal,
  );
  expect(result).toEqual({ reply });
  expect(sent).toHaveLength(1);
  return { body: JSON.parse(sent[0]!.body) as Record<string, unknown>, ...sent[0]!.options };
}

describe("callProvider", () => {
  const messages = [{ role: "user", content: "hi" }];

  it("sends the limit priced for the offer that serves the call", async () => {
    expect((await call({ model: "m", messages }, { max_output_tokens: 300 })).body).toEqual({
      max_tokens: 300,
      model: "m",
      messages,
    });
    // An offer without the capability: the default limit.
    expect((await call({ model: "m", messages }, {})).body["max_tokens"]).toBe(4096);
    // The client's own limit wins over the offer's.
    expect(
      (await call({ model: "m", messages, max_tokens: 12 }, { max_output_tokens: 300 })).body,
    ).toEqual({ model: "m", messages, max_tokens: 12 });
  });

  it("gives a JSON call its priced output (limit × n), a stream nothing", async () => {
    const json = await call({ model: "m", messages, n: 3 }, { max_output_tokens: 300 });
    expect(json.answerOutputTokens).toBe(900n);
    expect(json.signal).toBeInstanceOf(AbortSignal);
    // Read exactly from the literal the client wrote (JSON.stringify writes 2^60 so).
    const exact = await call({ model: "m", messages, max_tokens: 2 ** 60 }, {});
    expect(exact.answerOutputTokens).toBe(1152921504606847000n);
    const stream = await call({ model: "m", messages, stream: true }, { max_output_tokens: 300 });
    expect(stream.answerOutputTokens).toBeUndefined();
    expect(Object.keys(stream)).not.toContain("answerOutputTokens");
    expect(stream.body["max_tokens"]).toBe(300);
  });
});

describe("callProvider: a provider that asks for rest", () => {
  const req = parseChatRequest(
    new TextEncoder().encode(
      JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }] }),
    ),
    { maxBytes: 1 << 20 },
  );
  const attempt = (status: number, retryAfter?: string) =>
    callProvider(
      {
        endpoints: () => Promise.resolve({ url: "https://provider.example" }),
        upstream: () =>
          Promise.resolve({
            status,
            retryAfter,
            text: () => Promise.resolve(""),
            stream: (into: (data: string) => boolean) =>
              flowFromEvents((async function* () {})(), into),
            discard: () => Promise.resolve(),
          }),
        cooldownBounds: { maxSeconds: 300, defaultSeconds: 10 },
      },
      { offer: { offerId }, outputLimit: 16n, maxOutputTokens: 16n },
      req,
      new AbortController().signal,
    );

  it("fails over on a 429 (or a 503 with Retry-After) with the cooldown it asked, not its fault", async () => {
    for (const [status, retryAfter, seconds] of [
      [429, "30", 30],
      [429, undefined, 10],
      [429, "100000", 300],
      [503, "7", 7],
    ] as const) {
      expect(await attempt(status, retryAfter)).toMatchObject({
        failure: { code: "upstream_error" },
        retryable: true,
        providerFault: false,
        cooldownSeconds: seconds,
      });
    }
    // A 503 without Retry-After is the provider failing; another 4xx the client's input.
    expect(await attempt(503)).toMatchObject({ retryable: true, providerFault: true });
    expect(await attempt(503)).not.toHaveProperty("cooldownSeconds");
    expect(await attempt(400, "30")).toMatchObject({ retryable: false, providerFault: false });
  });
});

import http from "node:http";
import type { Hex } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { demoMetadata } from "../../src/dev/demo-market.js";
import type { FakeUpstream } from "../helpers/fake-upstream.js";
import { openPermit, setOfferMetadata } from "../helpers/market.js";
import { eventually, startChatStack, type TestStack } from "../helpers/stack.js";

/**
 * Issue 19, item 12: every request in flight listens on the shutdown signal, so thousands of
 * them at once printed `MaxListenersExceededWarning: 11 abort listeners added to [AbortSignal]`,
 * which reads as a leak to an operator. 2,000 concurrent streams, held open by the provider
 * until all are in flight, then released: no such warning, every stream answered whole.
 */

const streams = 2000;

describe("thousands of requests in flight", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let chatOffer: Hex;
  let permitId: Hex;
  const warnings: Error[] = [];
  const onWarning = (warning: Error) => warnings.push(warning);

  beforeAll(async () => {
    ({ stack, fake, chatOffer } = await startChatStack(
      // The header deadline is not this test's subject: on a loaded machine the gateway may take
      // longer than the default 10 s to read 2,000 new connections' first bytes.
      { MAX_STREAMS_PER_KEY: String(streams), HEADERS_TIMEOUT_MS: "120000" },
      { chunks: 2 },
    ));
    await setOfferMetadata(stack, chatOffer, {
      ...demoMetadata("eu-west", "a100"),
      maxConcurrency: streams,
    });
    permitId = await openPermit(stack, { deposit: 10n ** 24n });
    process.on("warning", onWarning);
  }, 90_000);
  afterAll(async () => {
    process.off("warning", onWarning);
    await fake?.stop();
    await stack?.close();
  });

  it(`${streams} concurrent streams raise no MaxListenersExceededWarning`, async () => {
    const agent = new http.Agent({ keepAlive: false, maxSockets: Infinity });
    const url = new URL("/v1/chat/completions", stack.gateway.url);
    const body = JSON.stringify({
      model: "demo-chat",
      messages: [{ role: "user", content: "hold" }],
      stream: true,
      max_tokens: 16,
    });
    // The provider holds every stream until all of them are in flight.
    fake.setOptions({ stallBeforeHeadersMs: 600_000 });
    const before = fake.calls("/v1/chat/completions"); // the onboarding verification's
    let held = true;
    let settledEarly = 0;
    const answers = Array.from(
      { length: streams },
      () =>
        new Promise<{ status: number; text: string }>((resolve) => {
          // A failed request is an answer to report, never an unhandled rejection.
          const failed = (error: NodeJS.ErrnoException) => {
            settledEarly += 1;
            resolve({ status: 0, text: error.code ?? error.message });
          };
          const req = http.request(
            url,
            {
              method: "POST",
              agent,
              headers: {
                authorization: `Bearer ${stack.apiKey}`,
                "x-gateway-permit": permitId,
                "content-type": "application/json",
                "content-length": Buffer.byteLength(body),
              },
            },
            (res) => {
              let text = "";
              res.setEncoding("utf8");
              res.on("data", (chunk: string) => (text += chunk));
              res.on("end", () => {
                if (held) settledEarly += 1;
                resolve({ status: res.statusCode ?? 0, text });
              });
              res.on("error", failed);
            },
          );
          req.on("error", failed);
          req.end(body);
        }),
    );
    // Every stream in flight at the provider, or one answered before the holds were released
    // (refused, or its connection lost: reported below with the others).
    await eventually(
      async () => fake.calls("/v1/chat/completions") === before + streams || settledEarly > 0,
      120_000,
      100,
    );
    held = false;
    fake.releaseHolds();
    const results = await Promise.all(answers);
    agent.destroy();
    expect(results.filter((r) => r.status !== 200)).toEqual([]);
    expect(results.filter((r) => !r.text.trimEnd().endsWith("data: [DONE]"))).toEqual([]);
    expect(warnings.filter((w) => w.name === "MaxListenersExceededWarning")).toEqual([]);
  }, 240_000);
});

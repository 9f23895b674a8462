import { createServer as createHttpServer } from "node:http";
import { createServer } from "node:net";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startOtlpReceiver } from "../../test/helpers/otlp-receiver.js";
import { GatewayError } from "../domain/errors.js";
import { createTracing, shutdownExportMs } from "./tracing.js";

const input = (headers?: Record<string, string>) => ({
  apiKeyId: "k",
  authority: { permits: new Map(), expiresAt: 0 } as never,
  body: new Uint8Array(),
  permitId: undefined,
  quoteId: undefined,
  idempotencyKey: undefined,
  signal: new AbortController().signal,
  ...(headers === undefined ? {} : { headers: new Headers(headers) }),
});

/** A port nothing listens on (taken, then given back). */
async function deadPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

const silent = pino({ enabled: false });

describe("createTracing", () => {
  let receiver: Awaited<ReturnType<typeof startOtlpReceiver>>;
  beforeAll(async () => {
    receiver = await startOtlpReceiver();
  });
  afterAll(() => receiver.stop());

  it("ends a span once, keeps an invalid traceparent out, and sends the error code only", async () => {
    const tracing = createTracing(
      {
        otlpTracesEndpoint: `${receiver.url}/v1/traces`,
        otelServiceName: "unit",
      },
      silent,
    )!;
    const trace = tracing.chat.start(input({ traceparent: "00-not-a-trace-01" }));
    trace.request("m".repeat(300), false);
    const error = new GatewayError("insufficient_credits", "permit 0xabc cannot cover 99 credits");
    trace.end(error);
    trace.end(); // the finally after the catch: no second span, no change
    await tracing.flush();
    expect(receiver.spans).toHaveLength(1);
    const [span] = receiver.spans;
    expect(span).toMatchObject({
      serviceName: "unit",
      name: `chat ${"m".repeat(200)}`,
      parentSpanId: undefined,
      status: { code: 2, message: "insufficient_credits" },
      attributes: {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "m".repeat(200),
        "error.type": "insufficient_credits",
        "gateway.stream": false,
      },
    });
    expect(JSON.stringify(span)).not.toContain("0xabc");
    await tracing.shutdown();
  });

  it("traces the usage charged as gen_ai.usage.*, and beside it the provider's claim and the gateway's count", async () => {
    const tracing = createTracing(
      { otlpTracesEndpoint: `${receiver.url}/v1/traces`, otelServiceName: "unit" },
      silent,
    )!;
    const closing = {
      status: "completed",
      billing: "billed",
      usageSource: "gateway",
      usage: { inputTokens: 12n, outputTokens: 5n, cachedInputTokens: 0n, reasoningTokens: 0n },
      claimed: {
        inputTokens: 3_550n,
        outputTokens: 2_000n,
        cachedInputTokens: 3n,
        reasoningTokens: 4n,
      },
      counted: { inputTokens: 12n, outputTokens: 5n, cachedInputTokens: 0n, reasoningTokens: 0n },
      error: undefined,
      charge: 42n,
      aboveQuote: false,
      offerId: `0x${"bb".repeat(32)}`,
    } as const;
    const before = receiver.spans.length;
    const trace = tracing.chat.start(input());
    trace.closed(closing);
    trace.end();
    // No claim (the provider reported no usage): no claimed attributes at all.
    const silentProvider = tracing.chat.start(input());
    silentProvider.closed({ ...closing, claimed: undefined });
    silentProvider.end();
    await tracing.flush();
    const [lied, unclaimed] = receiver.spans.slice(before);
    expect(lied?.attributes).toMatchObject({
      "gen_ai.usage.input_tokens": 12,
      "gen_ai.usage.output_tokens": 5,
      "gateway.usage.source": "gateway",
      "gateway.usage.claimed.input_tokens": 3550,
      "gateway.usage.claimed.output_tokens": 2000,
      "gateway.usage.claimed.cache_read.input_tokens": 3,
      "gateway.usage.claimed.reasoning.output_tokens": 4,
      "gateway.usage.counted.input_tokens": 12,
      "gateway.usage.counted.output_tokens": 5,
      "gateway.usage.counted.cache_read.input_tokens": 0,
      "gateway.usage.counted.reasoning.output_tokens": 0,
    });
    expect(unclaimed?.attributes).toMatchObject({ "gateway.usage.counted.output_tokens": 5 });
    expect(Object.keys(unclaimed?.attributes ?? {}).filter((k) => k.includes(".claimed."))).toEqual(
      [],
    );
    await tracing.shutdown();
  });

  it("a collector that is away loses spans, never fails the shutdown", async () => {
    const tracing = createTracing(
      {
        otlpTracesEndpoint: `http://127.0.0.1:${await deadPort()}/v1/traces`,
        otelServiceName: "unit",
      },
      silent,
    )!;
    tracing.chat.start(input()).end();
    const began = performance.now();
    await expect(tracing.shutdown()).resolves.toBeUndefined();
    // Bounded: the exporter's retries would hold a shutdown for about 7 s.
    expect(performance.now() - began).toBeLessThan(shutdownExportMs + 500);
  });

  it("logs once when exports start failing and once when they recover, the reason only", async () => {
    let status = 400;
    const collector = createHttpServer((req, res) => {
      req.resume();
      req.on("end", () => res.writeHead(status).end(status === 200 ? "{}" : "secret-body"));
    });
    await new Promise<void>((resolve) => collector.listen(0, "127.0.0.1", resolve));
    const { port } = collector.address() as { port: number };
    const lines: string[] = [];
    const logger = pino({ level: "info" }, { write: (line: string) => lines.push(line) });
    const tracing = createTracing(
      { otlpTracesEndpoint: `http://127.0.0.1:${port}/v1/traces`, otelServiceName: "unit" },
      logger,
    )!;
    try {
      for (let i = 0; i < 2; i++) {
        tracing.chat.start(input()).end();
        await tracing.flush().catch(() => undefined);
      }
      status = 200;
      tracing.chat.start(input()).end();
      await tracing.flush();
      const logged = lines.map((l) => JSON.parse(l) as Record<string, unknown>);
      expect(logged.map((l) => [l["level"], l["msg"]])).toEqual([
        [40, "span export failed: spans are dropped until the collector answers"],
        [30, "span export recovered"],
      ]);
      expect(logged[0]).toMatchObject({ spans: 1 });
      expect(lines.join("\n")).not.toContain("secret-body");
      expect(lines.join("\n")).not.toContain(String(port));
    } finally {
      await tracing.shutdown();
      await new Promise<void>((resolve) => collector.close(() => resolve()));
    }
  });
});

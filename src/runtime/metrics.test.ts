import { createServer, type Server } from "node:http";
import type { Hex } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { claimRatioOf, createMetrics } from "./metrics.js";

const model: Hex = `0x${"aa".repeat(32)}`;
const liar: Hex = `0x${"bb".repeat(32)}`;
const honest: Hex = `0x${"cc".repeat(32)}`;

/** The samples of `name` (label values here never hold a quote), with their labels. */
function samples(text: string, name: string): { labels: Record<string, string>; value: number }[] {
  const out = [];
  for (const line of text.split("\n")) {
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (m === null || m[1] !== name) continue;
    const labels = Object.fromEntries(
      [...(m[2] ?? "").matchAll(/(\w+)="([^"]*)"/g)].map((l) => [l[1]!, l[2]!]),
    );
    out.push({ labels, value: Number(m[3]) });
  }
  return out;
}

describe("gateway_usage_claim_ratio: the provider's claim over the gateway's count, per offer", () => {
  const metrics = createMetrics({ modelName: () => "demo-model" });
  let server: Server;
  let url: string;
  beforeAll(async () => {
    server = createServer((req, res) => metrics.handle(req, res));
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    url = `http://127.0.0.1:${(server.address() as { port: number }).port}/metrics`;
  });
  afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

  const figures = (input: bigint, output: bigint) => ({
    inputTokens: input,
    outputTokens: output,
    cachedInputTokens: 0n,
    reasoningTokens: 0n,
  });

  it("observes input and output separately, labelled by offer and kind, read from /metrics", async () => {
    // The liar: five words claimed as 2,000, an input of 71 characters claimed as 3,550.
    metrics.chat.usageCompared!(model, liar, figures(3_550n, 2_000n), figures(71n, 5n));
    // The honest provider, twice: its count equal to the claim, then one token under it.
    metrics.chat.usageCompared!(model, honest, figures(12n, 5n), figures(12n, 5n));
    metrics.chat.usageCompared!(model, honest, figures(100n, 100n), figures(100n, 99n));

    const response = await fetch(url);
    expect(response.status).toBe(200);
    const text = await response.text();
    const of = (suffix: string, offer: Hex, kind: string) =>
      samples(text, `gateway_usage_claim_ratio_${suffix}`).filter(
        (s) =>
          s.labels.offer === offer && s.labels.kind === kind && s.labels.model === "demo-model",
      );
    const bucket = (offer: Hex, kind: string, le: string) =>
      of("bucket", offer, kind).find((s) => s.labels.le === le)?.value;

    expect(of("count", liar, "input").map((s) => s.value)).toEqual([1]);
    expect(of("sum", liar, "input").map((s) => s.value)).toEqual([50]);
    expect(of("sum", liar, "output").map((s) => s.value)).toEqual([400]);
    expect(bucket(liar, "output", "100")).toBe(0);
    expect(bucket(liar, "output", "+Inf")).toBe(1);
    expect(bucket(liar, "input", "10")).toBe(0);
    expect(bucket(liar, "input", "100")).toBe(1);

    expect(of("count", honest, "output").map((s) => s.value)).toEqual([2]);
    expect(bucket(honest, "input", "1")).toBe(2);
    expect(bucket(honest, "output", "1")).toBe(1);
    expect(bucket(honest, "output", "1.01")).toBe(1);
    expect(bucket(honest, "output", "1.05")).toBe(2);
  });

  it("reads a count of 0 as 1 (never a division by zero)", () => {
    expect(claimRatioOf(7n, 0n)).toBe(7);
    expect(claimRatioOf(0n, 0n)).toBe(0);
    expect(claimRatioOf(2_000n, 5n)).toBe(400);
  });
});

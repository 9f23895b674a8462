import type { Hex } from "viem";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { permitLedger } from "../../src/adapters/pg/ledger/index.js";
import { priceCredits } from "../../src/domain/pricing.js";
import { demoTariff } from "../../src/dev/demo-market.js";
import type { FakeUpstream } from "../helpers/fake-upstream.js";
import { authed, eventually, json, startChatStack, type TestStack } from "../helpers/stack.js";
import { sseData } from "../helpers/sse.js";
import { demoChatCounter } from "../helpers/token-counts.js";

/**
 * Provider faults (issue 13, docs/operations.md "Provider (upstream)"): each one ends in its
 * documented state, and the money is right afterwards: the request's record is closed with the
 * documented charge, the permit's reservation is back to 0, and the charge reached the permit's
 * ledger exactly once.
 */

const messages = [{ role: "user" as const, content: "hello faulty provider" }];

interface RecordRow {
  id: string;
  status: string;
  billing: string | null;
  usage_source: string | null;
  credits_charged: string | null;
  maximum_credits: string;
  input_tokens: string;
  output_tokens: string;
  offer_id: string;
  claimed_input_tokens: string | null;
  claimed_output_tokens: string | null;
  counted_input_tokens: string | null;
  counted_output_tokens: string | null;
}

describe("provider faults", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let chatOffer: Hex;
  let permitId: Hex;
  const seen = new Set<string>();

  beforeAll(async () => {
    ({ stack, fake, chatOffer } = await startChatStack({
      // Small, but far above a loopback answer on a loaded machine.
      UPSTREAM_TIMEOUT_MS: "1500",
      UPSTREAM_IDLE_TIMEOUT_MS: "1500",
    }));
    permitId = stack.demo.permitId;
    for (const row of await records()) seen.add(row.id);
  });
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });
  beforeEach(() => {
    fake.setOptions({
      chunks: 4,
      delayMs: 0,
      omitUsage: false,
      usage: undefined,
      resetBeforeHeaders: undefined,
      stallBeforeHeadersMs: undefined,
      stallAfterChunks: undefined,
      garbage: undefined,
    });
  });

  const chat = (body: object) =>
    authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json", "x-gateway-permit": permitId },
      body: JSON.stringify({ model: "demo-chat", messages, ...body }),
    });

  async function records(): Promise<RecordRow[]> {
    const { rows } = await stack.database.db.pool.query<RecordRow>(
      `SELECT id, status, billing, usage_source, credits_charged::text, maximum_credits::text,
              input_tokens::text, output_tokens::text, offer_id,
              claimed_input_tokens::text, claimed_output_tokens::text,
              counted_input_tokens::text, counted_output_tokens::text
         FROM inference_requests`,
    );
    return rows;
  }

  /**
   * Runs `act` (one chat request) and waits until its record is closed and the permit holds no
   * reservation; returns the record and how much the permit's ledger charged meanwhile.
   */
  async function settled<T>(act: () => Promise<T>): Promise<{
    result: T;
    record: RecordRow;
    ledgerCharged: bigint;
  }> {
    const before = await permitLedger(stack.database.db.pool, permitId);
    const result = await act();
    let fresh: RecordRow[] = [];
    await eventually(async () => {
      fresh = (await records()).filter((r) => !seen.has(r.id));
      const ledger = await permitLedger(stack.database.db.pool, permitId);
      return (
        fresh.length > 0 &&
        fresh.every((r) => r.status !== "pending" && r.status !== "streaming") &&
        ledger.reserved === 0n
      );
    }, 15_000);
    for (const r of fresh) seen.add(r.id);
    expect(fresh).toHaveLength(1);
    const after = await permitLedger(stack.database.db.pool, permitId);
    expect(after.reserved).toBe(0n);
    return { result, record: fresh[0]!, ledgerCharged: after.charged - before.charged };
  }

  async function expectServedFailure(res: Response): Promise<void> {
    expect([502, 503]).toContain(res.status);
    const body = await json(res);
    expect(Object.keys(body)).toEqual(["error"]);
    expect(["upstream_error", "upstream_unavailable"]).toContain(body.error.code);
    expect(body.error.type).toEqual(expect.any(String));
    expect(body.error.message).toEqual(expect.any(String));
    // No endpoint detail leaks into the client's error.
    expect(JSON.stringify(body)).not.toContain(String(fake.port));
  }

  it("a provider that resets the connection before the first byte: 502/503 error body, void, nothing charged", async () => {
    fake.setOptions({ resetBeforeHeaders: true });
    const calls = fake.calls("/v1/chat/completions");
    const { result: res, record, ledgerCharged } = await settled(() => chat({ max_tokens: 8 }));
    await expectServedFailure(res);
    expect(fake.calls("/v1/chat/completions")).toBe(calls + 1);
    expect(record).toMatchObject({ status: "failed", billing: "void", credits_charged: "0" });
    expect(ledgerCharged).toBe(0n);
  });

  it("a provider that stalls before the first byte: cut after UPSTREAM_TIMEOUT_MS, error body, void", async () => {
    fake.setOptions({ stallBeforeHeadersMs: 120_000 });
    const calls = fake.calls("/v1/chat/completions");
    const {
      result: res,
      record,
      ledgerCharged,
    } = await settled(() => chat({ max_tokens: 8, stream: true }));
    await expectServedFailure(res);
    expect(fake.calls("/v1/chat/completions")).toBe(calls + 1);
    // The gateway hung up on the stalled provider rather than leaving the call open.
    expect(await fake.requests.at(-1)!.finished).toBe("aborted");
    expect(record).toMatchObject({ status: "failed", billing: "void", credits_charged: "0" });
    expect(ledgerCharged).toBe(0n);
  });

  it("a stream that stalls between chunks: SSE error event last after UPSTREAM_IDLE_TIMEOUT_MS, failed, partial charge of what was delivered", async () => {
    fake.setOptions({ chunks: 10, stallAfterChunks: 2 });
    const {
      result: text,
      record,
      ledgerCharged,
    } = await settled(async () => {
      const res = await chat({ stream: true });
      expect(res.status).toBe(200);
      return res.text();
    });
    const events = sseData(text);
    expect(events).not.toContain("[DONE]");
    const last = JSON.parse(events.at(-1)!) as { error?: { code: string; type: string } };
    expect(last.error).toMatchObject({ code: expect.stringMatching(/^upstream_/) });
    const delivered = events.filter((e) => /"content":" ?word/.test(e)).length;
    expect(delivered).toBe(2);
    expect(await fake.requests.at(-1)!.finished).toBe("aborted");
    // The output delivered, by the gateway's count (the demo model's tokenizer).
    const output = (await demoChatCounter()).countOutput("word0 word1");
    const expected = priceCredits(demoTariff, { inputTokens: 0n, outputTokens: output }, false);
    expect(expected).toBeGreaterThan(0n);
    expect(record).toMatchObject({
      status: "failed",
      billing: "partial",
      output_tokens: output.toString(),
      credits_charged: expected.toString(),
    });
    expect(ledgerCharged).toBe(expected);
  });

  it("a JSON answer that is not JSON: 502 upstream_error, failed, void", async () => {
    fake.setOptions({ garbage: true });
    const { result: res, record, ledgerCharged } = await settled(() => chat({ max_tokens: 8 }));
    expect(res.status).toBe(502);
    const body = await json(res);
    expect(body.error).toMatchObject({ code: "upstream_error", type: "api_error" });
    expect(record).toMatchObject({ status: "failed", billing: "void", credits_charged: "0" });
    expect(ledgerCharged).toBe(0n);
  });

  it("SSE events whose data is not JSON: nothing metered, nothing charged", async () => {
    fake.setOptions({ garbage: true });
    const {
      result: text,
      record,
      ledgerCharged,
    } = await settled(async () => {
      const res = await chat({ stream: true });
      return { status: res.status, text: await res.text() };
    });
    expect(text.status).toBe(200);
    expect(record.billing).toBe("void");
    expect(record.credits_charged).toBe("0");
    expect(record.output_tokens).toBe("0");
    expect(ledgerCharged).toBe(0n);
  });

  it("an answer without usage is charged from the gateway's own count, > 0 and <= the maximum, once", async () => {
    fake.setOptions({ omitUsage: true, chunks: 3 });
    const jsonCase = await settled(() => chat({ max_tokens: 8 }));
    expect(jsonCase.result.status).toBe(200);
    const answer = await json(jsonCase.result);
    // The usage a client's SDK reads is what was charged (issue 35): the gateway's count.
    expect(answer.usage).toMatchObject({
      prompt_tokens: Number(jsonCase.record.input_tokens),
      completion_tokens: Number(jsonCase.record.output_tokens),
    });
    const streamCase = await settled(async () => {
      const res = await chat({ stream: true });
      expect(res.status).toBe(200);
      return res.text();
    });
    expect(sseData(streamCase.result).at(-1)).toBe("[DONE]");
    for (const { record, ledgerCharged } of [jsonCase, streamCase]) {
      expect(record).toMatchObject({
        status: "completed",
        billing: "billed",
        usage_source: "gateway",
      });
      expect(BigInt(record.output_tokens)).toBeGreaterThan(0n);
      const charged = BigInt(record.credits_charged!);
      expect(charged).toBeGreaterThan(0n);
      expect(charged).toBeLessThanOrEqual(BigInt(record.maximum_credits));
      expect(ledgerCharged).toBe(charged);
    }
  });

  it("usage far above the quote: charged the gateway's count, below the maximum; the claim is kept", async () => {
    fake.setOptions({ usage: { prompt_tokens: 5_000_000, completion_tokens: 5_000_000 } });
    const { result: res, record, ledgerCharged } = await settled(() => chat({ max_tokens: 8 }));
    expect(res.status).toBe(200);
    expect(record).toMatchObject({
      status: "completed",
      offer_id: chatOffer.toLowerCase(),
      usage_source: "gateway",
      claimed_input_tokens: "5000000",
      claimed_output_tokens: "5000000",
      input_tokens: record.counted_input_tokens,
      output_tokens: record.counted_output_tokens,
    });
    const charged = priceCredits(
      demoTariff,
      { inputTokens: BigInt(record.input_tokens), outputTokens: BigInt(record.output_tokens) },
      false,
    );
    expect(record.credits_charged).toBe(charged.toString());
    expect(charged < BigInt(record.maximum_credits)).toBe(true);
    expect(res.headers.get("x-gateway-credits-charged")).toBe(charged.toString());
    expect(ledgerCharged).toBe(charged);
  });
});

import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import type { Hex } from "viem";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { QuoteService } from "../gen/gateway/v1/quote_pb.js";
import { permitLedger } from "../src/adapters/pg/ledger/index.js";
import { priceCredits } from "../src/domain/pricing.js";
import { demoTariff } from "../src/dev/demo-market.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { reportedCharge, sseData } from "./helpers/sse.js";
import type { TokenCounter } from "../src/domain/tokens.js";
import { demoChatCounter, truncated } from "./helpers/token-counts.js";
import { authed, eventually, json, startChatStack, type TestStack } from "./helpers/stack.js";

/**
 * Output multipliers (issue 18, DESIGN.md section 8 "A request costs what it can produce"):
 * `n` asks the provider for n answers, each up to the output limit, so the quote, the
 * reservation and the cap price n output limits; a provider that honours `n` is paid what it
 * produced (every choice) and is not flagged for it.
 */

const messages = [{ role: "user" as const, content: "hello multiplied gateway" }];
// Pieces the fake answers per choice ("word0 word1 ... word99"), under the output limit of
// `limit`: eight choices of them cost several times what one output limit's maximum holds, so
// a gateway that priced one choice would cap (and flag) what an honest provider produced.
/**
 * The gateway's count of one choice's text, held to the output limit: the relay cuts the text
 * there, and no charge passes it (the byte bound cuts later, so its count is capped).
 */
function heldTo(counter: TokenCounter, text: string, limit: bigint): bigint {
  const counted = counter.countOutput(truncated(counter, text, limit));
  return counted < limit ? counted : limit;
}

const chunks = 100;
// Room for the fake's 100 words a choice (about 290 tokens for the demo model's tokenizer): an
// honest answer within its limit is never cut.
const limit = 400;
const choiceText = Array.from({ length: chunks }, (_, i) => (i === 0 ? "word0" : ` word${i}`)).join(
  "",
);

interface RecordRow {
  id: string;
  status: string;
  billing: string | null;
  usage_source: string | null;
  credits_charged: string | null;
  maximum_credits: string;
  input_tokens: string;
  output_tokens: string;
}

describe("output multipliers (n)", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let chatOffer: Hex;
  let permitId: Hex;
  const seen = new Set<string>();

  beforeAll(async () => {
    ({ stack, fake, chatOffer } = await startChatStack({}, { chunks }));
    permitId = stack.demo.permitId;
    for (const row of await records()) seen.add(row.id);
  });
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });
  beforeEach(() => {
    fake.setOptions({ honourN: true, omitUsage: false, usage: undefined, chunks });
  });

  const post = (path: string, body: object, headers: Record<string, string> = {}) =>
    authed(stack, path, {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: JSON.stringify(body),
    });
  const chat = (body: object, headers: Record<string, string> = {}) =>
    post(
      "/v1/chat/completions",
      { model: "demo-chat", messages, ...body },
      {
        "x-gateway-permit": permitId,
        ...headers,
      },
    );
  const quote = async (body: object) => {
    const res = await post("/v1/quotes", { model: "demo-chat", messages, ...body });
    expect(res.status).toBe(200);
    return json(res);
  };

  async function records(): Promise<RecordRow[]> {
    const { rows } = await stack.database.db.pool.query<RecordRow>(
      `SELECT id, status, billing, usage_source, credits_charged::text, maximum_credits::text,
              input_tokens::text, output_tokens::text
         FROM inference_requests`,
    );
    return rows;
  }

  async function flags(requestId: string): Promise<number> {
    const { rows } = await stack.database.db.pool.query(
      "SELECT 1 FROM offer_flags WHERE request_id = $1",
      [requestId],
    );
    return rows.length;
  }

  /** Runs one chat; waits for its record to close and the permit's reservation to end. */
  async function settled(act: () => Promise<Response>) {
    const before = await permitLedger(stack.database.db.pool, permitId);
    const res = await act();
    const body = await res.text();
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
    return { res, body, record: fresh[0]!, ledgerCharged: after.charged - before.charged };
  }

  it("quotes n output limits: input part + 8 x the output bound, REST and RPC alike", async () => {
    const one = await quote({ max_tokens: 32 });
    const eight = await quote({ max_tokens: 32, n: 8 });
    expect(eight.input_tokens).toBe(one.input_tokens);
    expect(one.max_output_tokens).toBe("32");
    expect(eight.max_output_tokens).toBe("256");
    const input = BigInt(eight.input_tokens);
    // ceil(in * p_in / 1e6) + ceil(256 * p_out / 1e6) with the demo tariff, exactly.
    const expected =
      (input * demoTariff.inputPricePerMTok + 999_999n) / 1_000_000n +
      (256n * demoTariff.outputPricePerMTok + 999_999n) / 1_000_000n;
    expect(eight.maximum_credits).toBe(expected.toString());
    expect(one.maximum_credits).toBe(
      priceCredits(demoTariff, { inputTokens: input, outputTokens: 32n }, false).toString(),
    );

    const client = createClient(
      QuoteService,
      createConnectTransport({ baseUrl: stack.gateway.url, httpVersion: "1.1" }),
    );
    const { quote: rpc } = await client.createQuote(
      {
        body: new TextEncoder().encode(
          JSON.stringify({ model: "demo-chat", messages, max_tokens: 32, n: 8 }),
        ),
      },
      { headers: { authorization: `Bearer ${stack.apiKey}` } },
    );
    expect(rpc?.maxOutputTokens).toBe("256");
    expect(rpc?.maximumCredits).toBe(expected.toString());
  });

  it("reserves what it quoted, and pays a provider honouring n for every choice, unflagged (JSON)", async () => {
    const q = await quote({ max_tokens: limit, n: 8 });
    const { res, body, record, ledgerCharged } = await settled(() =>
      chat({ max_tokens: limit, n: 8 }, { "x-gateway-quote": q.quote_id }),
    );
    expect(res.status).toBe(200);
    const answer = JSON.parse(body) as {
      choices: unknown[];
      usage: { prompt_tokens: number; completion_tokens: number };
    };
    expect(answer.choices).toHaveLength(8);
    expect(answer.usage.completion_tokens).toBe(8 * chunks);
    // The reservation is the quote's maximum: 8 output limits.
    expect(record.maximum_credits).toBe(q.maximum_credits);
    const produced = priceCredits(
      demoTariff,
      { inputTokens: BigInt(answer.usage.prompt_tokens), outputTokens: BigInt(8 * chunks) },
      false,
    );
    // More than a maximum of one output limit could pay: n must be in the maximum.
    const oneLimit = priceCredits(
      demoTariff,
      { inputTokens: BigInt(q.input_tokens), outputTokens: BigInt(limit) },
      false,
    );
    expect(produced).toBeGreaterThan(oneLimit);
    expect(record).toMatchObject({
      status: "completed",
      billing: "billed",
      usage_source: "provider",
      output_tokens: String(8 * chunks),
      credits_charged: produced.toString(),
    });
    expect(res.headers.get("x-gateway-credits-charged")).toBe(produced.toString());
    expect(ledgerCharged).toBe(produced);
    expect(await flags(record.id)).toBe(0);
  });

  it("pays a provider honouring n for every choice of a stream, unflagged (SSE)", async () => {
    const { res, body, record, ledgerCharged } = await settled(() =>
      chat({ max_tokens: limit, n: 8, stream: true }),
    );
    expect(res.status).toBe(200);
    const events = sseData(body);
    // n reached the provider as the client wrote it.
    expect((fake.requests.at(-1)!.body as { n?: unknown }).n).toBe(8);
    const produced = priceCredits(
      demoTariff,
      { inputTokens: BigInt(record.input_tokens), outputTokens: BigInt(8 * chunks) },
      false,
    );
    expect(record).toMatchObject({
      status: "completed",
      billing: "billed",
      usage_source: "provider",
      output_tokens: String(8 * chunks),
      credits_charged: produced.toString(),
    });
    // Admission without a quote reserved what a quote of the same request says.
    expect(record.maximum_credits).toBe((await quote({ max_tokens: limit, n: 8 })).maximum_credits);
    expect(reportedCharge(events)).toBe(produced);
    expect(ledgerCharged).toBe(produced);
    expect(await flags(record.id)).toBe(0);
  });

  it("counts every choice itself when the provider reports no usage (JSON: all contents; SSE: every choice's deltas)", async () => {
    fake.setOptions({ omitUsage: true });
    const json = await settled(() => chat({ max_tokens: limit, n: 8 }));
    expect(json.res.status).toBe(200);
    // One token per four UTF-8 bytes of all eight answers' text together: "word0" (5 bytes),
    // " word1" to " word9" (6 each) and " word10" to " word99" (7 each) is 689 bytes a choice.
    // The gateway's count of each choice's text (the model's tokenizer), each held to the limit.
    const counter = await demoChatCounter();
    const jsonTokens = 8n * heldTo(counter, choiceText, BigInt(limit));
    expect(json.record).toMatchObject({
      status: "completed",
      billing: "billed",
      usage_source: "gateway",
      output_tokens: jsonTokens.toString(),
      credits_charged: priceCredits(
        demoTariff,
        { inputTokens: BigInt(json.record.input_tokens), outputTokens: jsonTokens },
        false,
      ).toString(),
    });
    expect(await flags(json.record.id)).toBe(0);

    // The fake sends each piece of all eight choices in one chunk: the same text per choice.
    const sse = await settled(() => chat({ max_tokens: limit, n: 8, stream: true }));
    expect(sse.res.status).toBe(200);
    expect(sse.record).toMatchObject({
      status: "completed",
      billing: "billed",
      usage_source: "gateway",
      output_tokens: jsonTokens.toString(),
      credits_charged: priceCredits(
        demoTariff,
        { inputTokens: BigInt(sse.record.input_tokens), outputTokens: jsonTokens },
        false,
      ).toString(),
    });
    expect(reportedCharge(sseData(sse.body))).toBe(BigInt(sse.record.credits_charged!));
    expect(await flags(sse.record.id)).toBe(0);
  });

  it("charges a provider claiming more than n choices can hold what the gateway counted, at most n limits", async () => {
    // Ten times what eight choices of 32 tokens can be.
    fake.setOptions({ usage: { prompt_tokens: 5, completion_tokens: 8 * 32 * 10 } });
    const { res, record, ledgerCharged } = await settled(() => chat({ max_tokens: 32, n: 8 }));
    expect(res.status).toBe(200);
    const counter = await demoChatCounter();
    // The fake answers 32 words a choice; the gateway counts them and cuts each at 32 tokens.
    const sent = choiceText.split(/(?= )/).slice(0, 32).join("");
    const counted = 8n * heldTo(counter, sent, 32n);
    expect(counted <= 8n * 32n).toBe(true);
    expect(record).toMatchObject({ usage_source: "gateway", output_tokens: counted.toString() });
    const charged = priceCredits(
      demoTariff,
      { inputTokens: BigInt(record.input_tokens), outputTokens: counted },
      false,
    );
    expect(record.credits_charged).toBe(charged.toString());
    expect(ledgerCharged).toBe(charged);
  });

  it("refuses n of 0, above 128 or not an integer with 400 invalid_request, storing nothing, calling no one", async () => {
    const calls = fake.calls("/v1/chat/completions");
    const before = (await records()).length;
    for (const n of [0, 129, 1.5, -1, "8"]) {
      for (const path of ["/v1/quotes", "/v1/chat/completions"]) {
        const res =
          path === "/v1/quotes"
            ? await post(path, { model: "demo-chat", messages, n })
            : await chat({ n });
        expect(res.status, `${path} n=${String(n)}`).toBe(400);
        const body = await json(res);
        expect(body).toEqual({
          error: {
            code: "invalid_request",
            type: "invalid_request_error",
            message: "'n' must be an integer from 1 to 128",
          },
        });
      }
    }
    expect(fake.calls("/v1/chat/completions")).toBe(calls);
    expect((await records()).length).toBe(before);
  });

  it("binds n in the quote: a quote for one choice does not serve eight, nor the reverse", async () => {
    const calls = fake.calls("/v1/chat/completions");
    const single = await quote({ max_tokens: 32 });
    const widened = await chat({ max_tokens: 32, n: 8 }, { "x-gateway-quote": single.quote_id });
    expect(widened.status).toBe(409);
    expect((await json(widened)).error.code).toBe("quote_mismatch");
    const eight = await quote({ max_tokens: 32, n: 8 });
    const narrowed = await chat({ max_tokens: 32 }, { "x-gateway-quote": eight.quote_id });
    expect(narrowed.status).toBe(409);
    expect((await json(narrowed)).error.code).toBe("quote_mismatch");
    expect(fake.calls("/v1/chat/completions")).toBe(calls);
    // n: 1 spelled out is the one-choice request the quote was made for.
    const { res } = await settled(() =>
      chat({ max_tokens: 32, n: 1 }, { "x-gateway-quote": single.quote_id }),
    );
    expect(res.status).toBe(200);
    expect(chatOffer).toBe(single.offer_id);
  });
});

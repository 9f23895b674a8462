import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { reportedCharge, sseData } from "./helpers/sse.js";
import { authed, json, startChatStack, type TestStack } from "./helpers/stack.js";

/**
 * An Idempotency-Key whose result the database refuses to store (issue 19, item 8). The answer
 * is complete and its charge recorded: the client still gets it (200), with the charge it was
 * told; what is lost is only the replay, and the gateway says so in a warn line. The fault is
 * the database's own: a trigger on `idempotency_keys` that raises when a result is written.
 */
describe("Idempotency-Key result store failing", () => {
  let stack: TestStack;
  let fake: FakeUpstream;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack());
    await stack.database.db.pool.query(`
      CREATE FUNCTION test_refuse_idempotency_result() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF NEW.state = 'completed' THEN
          RAISE EXCEPTION 'test fault: idempotency results are refused';
        END IF;
        RETURN NEW;
      END $$`);
    await stack.database.db.pool.query(`
      CREATE TRIGGER test_refuse_idempotency_result BEFORE UPDATE ON idempotency_keys
      FOR EACH ROW EXECUTE FUNCTION test_refuse_idempotency_result()`);
  });
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  const chat = (key: string, body: object) =>
    authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "x-gateway-permit": stack.demo.permitId,
        "idempotency-key": key,
      },
      body: JSON.stringify({
        model: "demo-chat",
        messages: [{ role: "user", content: "keep my answer" }],
        max_tokens: 16,
        ...body,
      }),
    });

  async function requestsOfKey(): Promise<number> {
    const { rows } = await stack.database.db.pool.query<{ n: number }>(
      "SELECT count(*)::int AS n FROM inference_requests",
    );
    return rows[0]!.n;
  }

  /** The warn lines saying a key's replay is lost, for `requestId`. */
  const lostLines = (requestId: string) =>
    stack.logs.lines
      .map((line) => JSON.parse(line) as Record<string, unknown>)
      .filter(
        (l) =>
          l.requestId === requestId && String(l.msg).startsWith("idempotency result not stored"),
      );

  async function expectDeliveredAndCharged(res: Response, key: string, body: object) {
    const requestId = res.headers.get("x-gateway-request-id")!;
    expect(requestId).toMatch(/^0x[0-9a-f]{64}$/);
    const record = await json(await authed(stack, `/v1/requests/${requestId}`));
    expect(record).toMatchObject({ id: requestId, status: "completed", billing: "billed" });
    // The key's result is not stored: the row is still the claim.
    const { rows } = await stack.database.db.pool.query<{ state: string }>(
      "SELECT state FROM idempotency_keys WHERE key = $1",
      [key],
    );
    expect(rows).toEqual([{ state: "in_progress" }]);
    const lines = lostLines(requestId);
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({
      level: 40,
      requestId,
      error: "test fault: idempotency results are refused",
    });
    expect(JSON.stringify(lines[0])).not.toContain(stack.apiKey);
    expect(JSON.stringify(lines[0])).not.toContain(key);

    // A retry with the key: never served (nor charged) a second time.
    const calls = fake.calls("/v1/chat/completions");
    const requests = await requestsOfKey();
    const retry = await chat(key, body);
    expect(retry.status).toBe(409);
    expect((await json(retry)).error).toMatchObject({
      code: "idempotency_in_progress",
      type: "conflict_error",
    });
    expect(fake.calls("/v1/chat/completions")).toBe(calls);
    expect(await requestsOfKey()).toBe(requests);
    return record;
  }

  it("a JSON answer is delivered 200 and charged what its header says; the lost replay is logged", async () => {
    const res = await chat("store-fault-json", {});
    const text = await res.text();
    expect(res.status, text).toBe(200);
    expect(res.headers.get("content-type")).toMatch(/^application\/json/);
    const answer = JSON.parse(text) as { object: string; choices: unknown[] };
    expect(answer.object).toBe("chat.completion");
    expect(answer.choices).toHaveLength(1);
    const record = await expectDeliveredAndCharged(res, "store-fault-json", {});
    expect(BigInt(record.credits_charged)).toBeGreaterThan(0n);
    expect(res.headers.get("x-gateway-credits-charged")).toBe(record.credits_charged);
  });

  it("a streamed answer ends with its charge and [DONE], charged what it said", async () => {
    const body = { stream: true };
    const res = await chat("store-fault-stream", body);
    expect(res.status).toBe(200);
    const events = sseData(await res.text());
    expect(events.at(-1)).toBe("[DONE]");
    const record = await expectDeliveredAndCharged(res, "store-fault-stream", body);
    expect(BigInt(record.credits_charged)).toBeGreaterThan(0n);
    expect(reportedCharge(events)).toBe(BigInt(record.credits_charged));
  });
});

import { chatEvents } from "../../../test/helpers/chat-events.js";
import { describe, expect, it } from "vitest";
import {
  now,
  offerA,
  permitId,
  testCatalog,
  testOffer,
  testPermit,
  payerAuthority,
} from "../../../test/helpers/chat-market.js";
import {
  createInference,
  type ChatEvent,
  type ChatInput,
  type IdempotencyClaim,
  type IdempotencyStore,
  type Ledger,
  type UpstreamReply,
} from "./index.js";
import { flowFromEvents } from "../../../test/helpers/upstream-flow.js";

// Idempotency keys through the chat pipeline, against in-memory ports (issue 10, defect 7): a
// key's result is stored once; a stored completed result is never followed by a failed one.

const chunk = (content: string) =>
  JSON.stringify({ id: "c", object: "chat.completion.chunk", choices: [{ delta: { content } }] });

/**
 * A store that keeps whatever it is given, as the store did before `complete` refused to
 * overwrite: the pipeline itself must never store twice. Every `complete` is kept for the
 * assertions.
 */
function memoryStore() {
  const rows = new Map<string, { fingerprint: string; events?: readonly ChatEvent[] }>();
  const completes: (readonly ChatEvent[])[] = [];
  const releases: string[] = [];
  const begun: { key: string; requestId: string }[] = [];
  const store: IdempotencyStore = {
    async claim({ key, fingerprint }): Promise<IdempotencyClaim> {
      const row = rows.get(key);
      if (row === undefined) {
        rows.set(key, { fingerprint });
        return { state: "claimed" };
      }
      if (row.fingerprint !== fingerprint) return { state: "mismatch" };
      return row.events === undefined
        ? { state: "in_progress" }
        : { state: "completed", events: row.events };
    },
    async begin({ key, requestId }) {
      begun.push({ key, requestId });
    },
    async complete({ key, events }) {
      completes.push([...events]);
      const row = rows.get(key);
      if (row !== undefined) row.events = [...events];
    },
    async release({ key }) {
      releases.push(key);
      rows.delete(key);
    },
  };
  return { store, rows, completes, releases, begun };
}

function setup(options: { stream: boolean }) {
  const idempotency = memoryStore();
  const finalized: Parameters<Ledger["finalize"]>[0][] = [];
  let upstreamCalls = 0;
  // The clock can be broken from the test: the close's record reads it, so the record throws.
  let clockBroken = false;
  const ledger: Ledger = {
    reserve: async () => ({ ok: true }),
    markStreaming: async () => true,
    finalize: async (input) => {
      finalized.push(input);
      return { finalized: true, creditsCharged: input.creditsCharged };
    },
    switchOffer: async () => true,
    recordOfferFlag: async () => undefined,
  };
  const reply: UpstreamReply = {
    status: 200,
    text: async () =>
      JSON.stringify({
        id: "c",
        object: "chat.completion",
        choices: [{ message: { role: "assistant", content: "hi" } }],
        usage: { prompt_tokens: 3, completion_tokens: 1 },
      }),
    stream: (into: (data: string) => boolean) =>
      flowFromEvents(
        (async function* () {
          yield chunk("one");
          yield chunk("two");
          yield "[DONE]";
        })(),
        into,
      ),
    discard: async () => undefined,
  };
  const inference = createInference({
    catalog: testCatalog(() => [testOffer(offerA)]),
    permits: { get: async () => testPermit(), invalidate: () => undefined },
    quotes: { insert: async () => undefined, get: async () => undefined },
    ledger,
    endpoints: async () => ({ url: "http://provider.test" }),
    upstream: async () => {
      upstreamCalls++;
      return reply;
    },
    idempotency: idempotency.store,
    clock: () => {
      if (clockBroken) throw new Error("the close could not be recorded");
      return now;
    },
    bodyLimitBytes: 1 << 20,
  });
  const input = (key: string): ChatInput => ({
    apiKeyId: "key",
    authority: payerAuthority,
    body: new TextEncoder().encode(
      JSON.stringify({
        model: "m",
        messages: [{ role: "user", content: "hi" }],
        stream: options.stream,
      }),
    ),
    permitId,
    quoteId: undefined,
    idempotencyKey: key,
    signal: new AbortController().signal,
  });
  /** Every event of a (replayed) answer, and the error it ended with, if any. */
  const readAll = async (key: string) => {
    const events: ChatEvent[] = [];
    try {
      for await (const event of chatEvents(inference, input(key))) events.push(event);
      return { events, error: undefined };
    } catch (error) {
      return { events, error };
    }
  };
  return {
    inference,
    input,
    readAll,
    idempotency,
    finalized,
    upstreamCalls: () => upstreamCalls,
    breakClock: (broken = true) => void (clockBroken = broken),
  };
}

const types = (events: readonly ChatEvent[]) => events.map((e) => e.type);

describe("idempotency keys through the chat pipeline", () => {
  for (const stream of [false, true]) {
    const kind = stream ? "a stream" : "a JSON answer";

    it(`names ${kind}'s request on its claim before the answer begins; a claim that cannot be named releases the key, nothing begun`, async () => {
      const t = setup({ stream });
      const chat = chatEvents(t.inference, t.input("named"));
      const first = await chat.next();
      expect(first.value).toMatchObject({ type: "started" });
      const requestId = (first.value as { requestId: string }).requestId;
      expect(t.idempotency.begun).toEqual([{ key: "named", requestId }]);
      await chat.return(undefined);

      // The database refuses the write: the key is released and no event reaches the client.
      const failing = setup({ stream });
      failing.idempotency.store.begin = async () => {
        throw new Error("the database refused");
      };
      const outcome = await failing.readAll("refused");
      expect(outcome.events).toEqual([]);
      expect(outcome.error).toBeInstanceOf(Error);
      expect(failing.idempotency.releases).toEqual(["refused"]);
      expect(failing.idempotency.rows.has("refused")).toBe(false);
      // Its reservation is closed without a charge.
      expect(failing.finalized).toHaveLength(1);
      expect(failing.finalized[0]).toMatchObject({ creditsCharged: 0n });
    });

    it(`keeps ${kind}'s stored completed result when the consumer stops right after it and the close's record throws`, async () => {
      const t = setup({ stream });
      const chat = chatEvents(t.inference, t.input("k1"));
      const seen: ChatEvent[] = [];
      for (;;) {
        const next = await chat.next();
        if (next.done === true) throw new Error("the answer ended before it completed");
        seen.push(next.value);
        if (next.value.type === "completed") break;
      }
      // The completed result is stored before the event is handed on.
      expect(t.idempotency.completes).toHaveLength(1);
      // Then the consumer stops, and the close's record (run as the generator closes) throws.
      t.breakClock();
      await expect(chat.return(undefined)).rejects.toThrow("the close could not be recorded");
      t.breakClock(false);

      expect(t.idempotency.completes).toHaveLength(1);
      const stored = t.idempotency.rows.get("k1")!.events!;
      expect(types(stored).at(-1)).toBe("completed");
      expect(types(stored)).not.toContain("failed");

      // A retry with the same key replays the completed answer, without calling the provider.
      const calls = t.upstreamCalls();
      const replay = await t.readAll("k1");
      expect(replay.error).toBeUndefined();
      expect(types(replay.events)).toEqual(types(seen));
      expect(replay.events[0]).toMatchObject({ type: "started", replayed: true });
      expect(replay.events.at(-1)).toEqual(seen.at(-1));
      expect(t.upstreamCalls()).toBe(calls);
    });

    it(`keeps ${kind}'s stored completed result when the consumer fails right after it`, async () => {
      const t = setup({ stream });
      const chat = chatEvents(t.inference, t.input("k2"));
      for (;;) {
        const next = await chat.next();
        if (next.done === true) throw new Error("the answer ended before it completed");
        if (next.value.type === "completed") break;
      }
      // E.g. the transport could not write the last event and throws into the generator.
      await expect(chat.throw(new Error("socket closed"))).rejects.toThrow("socket closed");
      expect(t.idempotency.completes).toHaveLength(1);
      expect(types(t.idempotency.completes[0]!).at(-1)).toBe("completed");
      const replay = await t.readAll("k2");
      expect(replay.error).toBeUndefined();
      expect(types(replay.events).at(-1)).toBe("completed");
      // The request itself was closed once, completed.
      expect(t.finalized).toHaveLength(1);
      expect(t.finalized[0]).toMatchObject({ status: "completed" });
    });
  }

  it("stores how an answer that began ended when the consumer stops reading mid-stream (the key is not left in progress)", async () => {
    const t = setup({ stream: true });
    const chat = chatEvents(t.inference, t.input("k3"));
    expect((await chat.next()).value).toMatchObject({ type: "started" });
    expect((await chat.next()).value).toMatchObject({ type: "chunk" });
    await chat.return(undefined);
    expect(t.idempotency.completes).toHaveLength(1);
    expect(types(t.idempotency.completes[0]!)).toEqual(["started", "chunk", "failed"]);
    // The retry is answered from the key (its partial outcome), not 409 in progress.
    const replay = await t.readAll("k3");
    expect(types(replay.events)).toEqual(["started", "chunk"]);
    expect(replay.error).toMatchObject({ code: "upstream_error" });
    expect(t.finalized).toHaveLength(1);
    expect(t.finalized[0]).toMatchObject({ status: "cancelled", billing: "partial" });
  });
});

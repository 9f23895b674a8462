import { describe, expect, it } from "vitest";
import { createBatcher, type ItemOutcome } from "./batcher.js";

/** A `run` whose batches the test settles by hand. */
function manualRun<I, R>() {
  const calls: {
    items: readonly I[];
    settle: (outcomes: readonly ItemOutcome<R>[]) => void;
    fail: (error: unknown) => void;
  }[] = [];
  const run = (items: readonly I[]) =>
    new Promise<readonly ItemOutcome<R>[]>((resolve, reject) => {
      calls.push({ items, settle: resolve, fail: reject });
    });
  return { calls, run };
}

const ok = <R>(value: R): ItemOutcome<R> => ({ ok: true, value });

/** Lets every pending promise callback run. */
const flush = () => new Promise<void>((resolve) => setImmediate(resolve));

describe("natural batcher", () => {
  it("sends the first item at once, alone", async () => {
    const { calls, run } = manualRun<number, string>();
    const batcher = createBatcher({ run });
    const first = batcher.submit(1);
    // Synchronously: no timer, no waiting for company.
    expect(calls.map((c) => c.items)).toEqual([[1]]);
    calls[0]!.settle([ok("one")]);
    expect(await first).toBe("one");
    expect(batcher.stats()).toEqual({ batches: 1, items: 1, queued: 0, inFlight: 0 });
  });

  it("sends what queued while a batch was in flight as the next batch, in order", async () => {
    const { calls, run } = manualRun<number, number>();
    const batcher = createBatcher({ run });
    const results = [1, 2, 3, 4].map((n) => batcher.submit(n));
    expect(calls.map((c) => c.items)).toEqual([[1]]);
    expect(batcher.stats()).toMatchObject({ queued: 3, inFlight: 1 });

    calls[0]!.settle([ok(10)]);
    await flush();
    expect(calls.map((c) => c.items)).toEqual([[1], [2, 3, 4]]);
    const late = batcher.submit(5);
    await flush();
    expect(calls).toHaveLength(2);

    calls[1]!.settle([ok(20), ok(30), ok(40)]);
    await flush();
    expect(calls.map((c) => c.items)).toEqual([[1], [2, 3, 4], [5]]);
    calls[2]!.settle([ok(50)]);
    expect(await Promise.all([...results, late])).toEqual([10, 20, 30, 40, 50]);
  });

  it("puts at most maxBatch items in a batch and keeps the rest for the next", async () => {
    const { calls, run } = manualRun<number, number>();
    const batcher = createBatcher({ run, maxBatch: 3 });
    const results = [0, 1, 2, 3, 4, 5, 6, 7].map((n) => batcher.submit(n));
    calls[0]!.settle([ok(0)]);
    await flush();
    calls[1]!.settle([1, 2, 3].map(ok));
    await flush();
    calls[2]!.settle([4, 5, 6].map(ok));
    await flush();
    calls[3]!.settle([ok(7)]);
    expect(await Promise.all(results)).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    expect(calls.map((c) => c.items)).toEqual([[0], [1, 2, 3], [4, 5, 6], [7]]);
  });

  it("keeps at most maxInFlight batches in flight", async () => {
    const { calls, run } = manualRun<number, number>();
    const batcher = createBatcher({ run, maxInFlight: 2 });
    const results = [1, 2, 3, 4].map((n) => batcher.submit(n));
    expect(calls.map((c) => c.items)).toEqual([[1], [2]]);
    calls[1]!.settle([ok(2)]);
    await flush();
    expect(calls.map((c) => c.items)).toEqual([[1], [2], [3, 4]]);
    expect(batcher.stats().inFlight).toBe(2);
    calls[0]!.settle([ok(1)]);
    calls[2]!.settle([ok(3), ok(4)]);
    expect(await Promise.all(results)).toEqual([1, 2, 3, 4]);
  });

  it("rejects every item of a failed batch with its error, then keeps working", async () => {
    const { calls, run } = manualRun<number, number>();
    const batcher = createBatcher({ run });
    const first = batcher.submit(1);
    const queued = [2, 3].map((n) => batcher.submit(n));
    calls[0]!.settle([ok(1)]);
    await flush();
    const lost = new Error("Connection terminated unexpectedly");
    calls[1]!.fail(lost);
    await expect(Promise.all(queued.map((p) => p.catch((e: unknown) => e)))).resolves.toEqual([
      lost,
      lost,
    ]);
    expect(await first).toBe(1);

    const after = batcher.submit(4);
    expect(calls).toHaveLength(3);
    calls[2]!.settle([ok(4)]);
    expect(await after).toBe(4);
  });

  it("fails the batch when run throws synchronously or returns the wrong number of outcomes", async () => {
    let mode: "throw" | "short" | "fine" = "throw";
    const batcher = createBatcher<number, number>({
      run: (items) => {
        if (mode === "throw") throw new Error("bad query");
        if (mode === "short") return Promise.resolve([]);
        return Promise.resolve(items.map(ok));
      },
    });
    await expect(batcher.submit(1)).rejects.toThrow("bad query");
    mode = "short";
    await expect(batcher.submit(2)).rejects.toThrow("a batch of 1 items returned 0 outcomes");
    mode = "fine";
    expect(await batcher.submit(3)).toBe(3);
  });

  it("rejects only the item whose outcome is an error", async () => {
    const { calls, run } = manualRun<number, number>();
    const batcher = createBatcher({ run });
    const first = batcher.submit(0);
    const queued = [1, 2, 3].map((n) => batcher.submit(n));
    calls[0]!.settle([ok(0)]);
    await flush();
    const refused = new Error("item 2 failed");
    calls[1]!.settle([ok(1), { ok: false, error: refused }, ok(3)]);
    const settled = await Promise.allSettled(queued);
    expect(settled).toEqual([
      { status: "fulfilled", value: 1 },
      { status: "rejected", reason: refused },
      { status: "fulfilled", value: 3 },
    ]);
    expect(await first).toBe(0);
  });

  it("refuses a batch size or an in-flight limit below one", () => {
    const run = () => Promise.resolve([]);
    expect(() => createBatcher({ run, maxBatch: 0 })).toThrow(RangeError);
    expect(() => createBatcher({ run, maxInFlight: 1.5 })).toThrow(RangeError);
  });

  it("refuses a submit beyond maxQueued at once, without sending it", async () => {
    const { calls, run } = manualRun<number, number>();
    const batcher = createBatcher({ run, maxQueued: 2 });
    const first = batcher.submit(0); // in flight
    const queued = [batcher.submit(1), batcher.submit(2)];
    await expect(batcher.submit(3)).rejects.toMatchObject({
      name: "BatcherOverloadError",
      reason: "queue_full",
    });
    calls[0]!.settle([ok(0)]);
    await flush();
    calls[1]!.settle([ok(1), ok(2)]);
    expect(await Promise.all([first, ...queued])).toEqual([0, 1, 2]);
    expect(calls.map((c) => c.items)).toEqual([[0], [1, 2]]);
  });

  it("refuses an item that waited maxWaitMs behind a hung batch, and never sends it", async () => {
    const { calls, run } = manualRun<number, number>();
    const batcher = createBatcher({ run, maxWaitMs: 30 });
    const hung = batcher.submit(0);
    const waiting = batcher.submit(1);
    await expect(waiting).rejects.toMatchObject({ reason: "wait_timeout" });
    expect(batcher.stats().queued).toBe(0);
    calls[0]!.settle([ok(0)]);
    expect(await hung).toBe(0);
    await flush();
    // Item 1 was never sent: the only batch after the hung one is the next submit's.
    const next = batcher.submit(2);
    calls[1]!.settle([ok(2)]);
    expect(await next).toBe(2);
    expect(calls.map((c) => c.items)).toEqual([[0], [2]]);
  });

  it("lets an item sent before maxWaitMs keep its batch's outcome, however late it comes", async () => {
    const { calls, run } = manualRun<number, number>();
    const batcher = createBatcher({ run, maxWaitMs: 30 });
    const first = batcher.submit(0);
    const second = batcher.submit(1); // queued behind the first
    calls[0]!.settle([ok(0)]);
    await flush();
    expect(calls.map((c) => c.items)).toEqual([[0], [1]]); // sent well within its 30 ms
    await new Promise((r) => setTimeout(r, 60));
    calls[1]!.settle([ok(1)]);
    expect(await Promise.all([first, second])).toEqual([0, 1]);
  });

  it("with maxQueued 0 sends what can go at once and refuses what would wait", async () => {
    const { calls, run } = manualRun<number, number>();
    const batcher = createBatcher({ run, maxQueued: 0 });
    const first = batcher.submit(0);
    await expect(batcher.submit(1)).rejects.toMatchObject({ reason: "queue_full", sent: false });
    calls[0]!.settle([ok(0)]);
    expect(await first).toBe(0);
    await flush();
    const next = batcher.submit(2);
    calls[1]!.settle([ok(2)]);
    expect(await next).toBe(2);
    expect(calls.map((c) => c.items)).toEqual([[0], [2]]);
  });

  it("refuses a negative or fractional maxQueued and a negative or infinite maxWaitMs", () => {
    const run = () => Promise.resolve([]);
    expect(() => createBatcher({ run, maxQueued: -1 })).toThrow(RangeError);
    expect(() => createBatcher({ run, maxQueued: 1.5 })).toThrow(RangeError);
    expect(() => createBatcher({ run, maxWaitMs: -1 })).toThrow(RangeError);
    expect(() => createBatcher({ run, maxWaitMs: Number.POSITIVE_INFINITY })).toThrow(RangeError);
  });
});

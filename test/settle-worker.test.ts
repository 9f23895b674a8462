import { randomBytes } from "node:crypto";
import { Code } from "@connectrpc/connect";
import { afterEach, describe, expect, it } from "vitest";
import { createLogger } from "../src/runtime/logger.js";
import { connectSettlement } from "../src/clients/settlement.js";
import { createSettlementWorker, type SettlementWorker } from "../src/runtime/settlement-worker.js";
import { startSettlementFixture, type SettlementFixture } from "./helpers/settlement-fixture.js";
import { eventually, LogCapture } from "./helpers/stack.js";

const token = `op_${randomBytes(16).toString("hex")}`;

interface LogLine {
  level: number;
  msg: string;
  [key: string]: unknown;
}

function parsed(logs: LogCapture): LogLine[] {
  return logs.lines.map((l) => JSON.parse(l) as LogLine);
}

/** Timers and sockets this process holds (what would keep it from exiting). */
function ownHandles(): { timers: number; sockets: number } {
  const resources = process.getActiveResourcesInfo();
  return {
    timers: resources.filter((r) => r === "Timeout").length,
    sockets: resources.filter((r) => r.startsWith("TCP")).length,
  };
}

function gaps(fixture: SettlementFixture): number[] {
  const flushes = fixture.calls.filter((c) => c.method === "flush");
  return flushes.slice(1).map((c, i) => c.at - (flushes[i]!.endedAt ?? flushes[i]!.at));
}

describe("settlement worker (gRPC client of SettlementService)", () => {
  let fixture: SettlementFixture | undefined;
  let worker: SettlementWorker | undefined;
  let logs: LogCapture;

  function startWorker(
    options: Partial<Parameters<typeof createSettlementWorker>[0]> = {},
  ): SettlementWorker {
    logs = new LogCapture();
    worker = createSettlementWorker({
      ...connectSettlement(fixture!.url),
      token,
      intervalMs: 100,
      logger: createLogger("debug", logs),
      ...options,
    });
    return worker;
  }

  afterEach(async () => {
    await worker?.stop();
    await fixture?.close();
    worker = undefined;
    fixture = undefined;
  });

  it("sends the operator token as gRPC metadata, flushes on the interval, and logs batches and unsettleable charges", async () => {
    fixture = await startSettlementFixture(token);
    startWorker({ maxRequests: 25 }).start();
    await eventually(async () => fixture!.calls.length >= 3, 5000, 10);

    for (const call of fixture.calls.slice(0, 3)) {
      expect(call.method).toBe("flush");
      expect(call.authorization).toBe(`Bearer ${token}`);
      expect(call.protocol).toBe("grpc");
      expect(call.contentType).toMatch(/^application\/grpc/);
      expect(call.request?.maxRequests).toBe(25);
      expect(call.request?.dryRun).toBe(false);
    }
    // The next call starts an interval after the previous one ended (timers may fire a ms early).
    for (const gap of gaps(fixture).slice(0, 2)) expect(gap).toBeGreaterThanOrEqual(95);

    const lines = parsed(logs);
    const batch = lines.find((l) => l.msg === "settlement batch");
    expect(batch).toMatchObject({
      level: 30,
      component: "settlement-worker",
      batch_id: `0x${"ab".repeat(32)}`,
      requests: 3,
      credits: "1500",
      charges: 2,
      tx_hash: `0x${"cd".repeat(32)}`,
      status: "settled",
    });
    expect(lines.find((l) => l.reason === "permit_closed")).toMatchObject({
      level: 40,
      permit_id: `0x${"01".repeat(32)}`,
      offer_id: `0x${"02".repeat(32)}`,
      credits: "70",
    });
    expect(logs.text).not.toContain(token);
  });

  it("logs a busy answer at debug and carries on", async () => {
    fixture = await startSettlementFixture(token);
    fixture.busyNext(2);
    startWorker().start();
    await eventually(async () => fixture!.calls.length >= 3, 5000, 10);
    const lines = parsed(logs);
    const busy = lines.filter((l) => /another flusher/.test(l.msg));
    expect(busy).toHaveLength(2);
    for (const line of busy) expect(line.level).toBe(20);
    expect(lines.some((l) => l.level >= 40 && /flush (failed|refused)/.test(l.msg))).toBe(false);
  });

  it("backs off after failures (each gap longer, capped) and recovers to the interval", async () => {
    fixture = await startSettlementFixture(token);
    fixture.failNext(5, Code.Unavailable);
    startWorker({
      intervalMs: 100,
      backoff: { initialMs: 40, maxMs: 300, jitter: 0.2 },
    }).start();
    await eventually(async () => fixture!.calls.length >= 8, 10_000, 10);

    // Retries 1-5 follow failures 1-5: 40, 80, 160, 300 (capped), 300, less up to 20 % jitter.
    // The delay chosen is logged; what the clock shows is that delay plus this machine's
    // scheduling, never less: the bounds on measured gaps are computed from the delays logged.
    const failed = parsed(logs).filter((l) => l.msg === "settlement flush failed");
    expect(failed).toHaveLength(5);
    const delays = failed.map((l) => l.retry_in_ms as number);
    [40, 80, 160, 300, 300].forEach((base, i) => {
      expect(delays[i]).toBeGreaterThanOrEqual(Math.round(base * 0.8));
      expect(delays[i]).toBeLessThanOrEqual(base);
    });
    const measured = gaps(fixture);
    const lateness = delays.map((delay, i) => measured[i]! - delay);
    for (const late of lateness) expect(late).toBeGreaterThanOrEqual(-1); // timers never early
    // Call 6 succeeds: back to the plain interval (100 ms), not the capped backoff (240-300 ms),
    // give or take the lateness this run measured.
    const worstLateness = Math.max(...lateness);
    for (const gap of measured.slice(5, 7)) {
      expect(gap).toBeGreaterThanOrEqual(99);
      expect(gap).toBeLessThan(100 + worstLateness + 120);
    }

    expect(failed.map((l) => l.attempt)).toEqual([1, 2, 3, 4, 5]);
    expect(failed[0]).toMatchObject({ level: 40, code: "unavailable" });
    expect(parsed(logs).find((l) => l.msg === "settlement flush recovered")).toMatchObject({
      failures: 5,
    });
  });

  it("stop() lets a flush in flight finish, closes the connection, and the server closes at once", async () => {
    const before = ownHandles();
    fixture = await startSettlementFixture(token);
    fixture.flushDelayMs = 300;
    const w = startWorker({ stopGraceMs: 5000 });
    w.start();
    await eventually(async () => fixture!.calls.length === 1, 5000, 5);
    const stopping = Date.now();
    await w.stop();
    const first = fixture.calls[0]!;
    expect(first.endedAt).toBeDefined();
    expect(first.aborted).toBe(false);
    expect(Date.now() - stopping).toBeLessThan(2000);
    expect(fixture.calls).toHaveLength(1); // no call after stop
    await eventually(async () => fixture!.openSessions() === 0, 1000, 10);
    const closing = Date.now();
    await fixture.close();
    expect(Date.now() - closing).toBeLessThan(500);
    fixture = undefined;
    await expect(w.flushOnce()).rejects.toThrow(/stopped/);
    // Neither a timer nor a socket of the worker or its connection is left behind.
    await eventually(
      async () => ownHandles().sockets === 0 && ownHandles().timers <= before.timers,
      1000,
      10,
    );
  });

  it("stop() aborts a flush that outlives the grace period", async () => {
    fixture = await startSettlementFixture(token);
    fixture.flushDelayMs = 30_000;
    const w = startWorker({ stopGraceMs: 200 });
    w.start();
    await eventually(async () => fixture!.calls.length === 1, 5000, 5);
    const stopping = Date.now();
    await w.stop();
    expect(Date.now() - stopping).toBeLessThan(1500);
    await eventually(async () => fixture!.calls[0]!.aborted, 1000, 10);
    const closing = Date.now();
    await fixture.close();
    expect(Date.now() - closing).toBeLessThan(500);
    fixture = undefined;
    const lines = parsed(logs);
    expect(lines.some((l) => /aborting the flush in flight/.test(l.msg))).toBe(true);
    // An abort by stop() is not a failure to retry.
    expect(lines.some((l) => l.msg === "settlement flush failed")).toBe(false);
  });

  it("a refused token is logged as an error with the gateway's reason, and no token is logged", async () => {
    fixture = await startSettlementFixture(token);
    const wrong = `op_${randomBytes(16).toString("hex")}`;
    startWorker({ token: wrong, backoff: { initialMs: 20, maxMs: 40 } }).start();
    await eventually(async () => fixture!.calls.length >= 3, 5000, 10);
    expect(fixture.calls[0]!.authorization).toBe(`Bearer ${wrong}`);
    const refused = parsed(logs).filter((l) => l.msg === "settlement flush refused");
    expect(refused.length).toBeGreaterThanOrEqual(2);
    expect(refused[0]).toMatchObject({
      level: 50,
      code: "unauthenticated",
      reason: "invalid_operator_token",
    });
    expect(logs.text).not.toContain(wrong);
    expect(logs.text).not.toContain(token);
  });

  it("flushOnce() passes dry_run and returns the answer", async () => {
    fixture = await startSettlementFixture(token);
    const w = startWorker();
    const res = await w.flushOnce({ dryRun: true });
    expect(res.settledCredits).toBe("1500");
    expect(fixture.calls[0]!.request?.dryRun).toBe(true);
    expect(fixture.calls[0]!.request?.maxRequests).toBeUndefined();
    expect(parsed(logs).some((l) => l.msg === "settlement batch (dry run)")).toBe(true);
  });
});

import { Writable } from "node:stream";
import type pg from "pg";
import { describe, expect, it } from "vitest";
import { useTestDatabase } from "../../test/helpers/db.js";
import { id, reservation } from "../../test/helpers/ledger.js";
import { databaseNow, heartbeat, reserve } from "../adapters/pg/ledger/index.js";
import { getRequest } from "../adapters/pg/requests.js";
import { createHousekeeping } from "./housekeeping.js";
import { createLogger } from "./logger.js";

/**
 * The orphan rule judges others only while this process's own heartbeats have held for a full
 * orphan window (issue 19, item 4): after an outage every process looks dead, and the first one
 * back must not void the others' requests before they had a window to heartbeat and write the
 * closes their outboxes hold.
 */
describe("housekeeping: the orphan rule after this process's own heartbeats broke", () => {
  const test = useTestDatabase();

  /** An open request of a process that last heartbeated two minutes ago (a dead one). */
  const deadRequest = async (): Promise<string> => {
    const dead = id("gw_dead");
    const now = await databaseNow(test.db.pool);
    await heartbeat(test.db.pool, dead, now - 120);
    const r = reservation({ instanceId: dead, createdAt: now - 120 });
    expect(await reserve(test.db.pool, r)).toEqual({ ok: true });
    return r.requestId;
  };
  const status = async (requestId: string) =>
    (await getRequest(test.db.pool, requestId, "key_a"))?.status;

  /** Runs `act` while this pool's heartbeats fail as a connection lost at that moment would. */
  const heartbeatsFailing = async <T>(act: () => Promise<T>): Promise<T> => {
    const pool = test.db.pool;
    const original = pool.query;
    const failing = function (this: pg.Pool, ...args: unknown[]) {
      if (typeof args[0] === "string" && args[0].includes("INSERT INTO gateway_instances")) {
        return Promise.reject(new Error("Connection terminated unexpectedly"));
      }
      return (original as (...a: unknown[]) => unknown).apply(this, args);
    };
    pool.query = failing as typeof pool.query;
    try {
      return await act();
    } finally {
      pool.query = original;
    }
  };

  it("waits a full window of its own heartbeats after starting, after a failed heartbeat and after a gap", async () => {
    const clock = { ms: 0 };
    const lines: string[] = [];
    const logger = createLogger(
      "info",
      new Writable({
        write(chunk: Buffer, _encoding, done) {
          lines.push(...chunk.toString("utf8").split("\n").filter(Boolean));
          done();
        },
      }),
    );
    const housekeeping = createHousekeeping({
      pool: test.db.pool,
      instanceId: id("gw_live"),
      logger,
      staleAfterSeconds: 60,
      monotonicMs: () => clock.ms,
    });
    const round = async (advanceMs: number) => {
      clock.ms += advanceMs;
      return housekeeping.runOnce();
    };

    // Just started: it cannot know what came before it, so it waits a window.
    const first = await deadRequest();
    expect(await round(0)).toMatchObject({ judged: false, orphans: 0 });
    expect(await round(30_000)).toMatchObject({ judged: false, orphans: 0 });
    expect(await status(first)).toBe("pending");
    expect(await round(30_000)).toMatchObject({ judged: true, orphans: 1 });
    expect(await status(first)).toBe("failed");
    expect(lines.filter((l) => l.includes("orphan rule running"))).toHaveLength(1);

    // Its own heartbeat fails (the database away from this process): the rule pauses, and
    // resumes only once its heartbeats have held for a window again.
    await heartbeatsFailing(() => expect(round(1_000)).rejects.toThrow(/Connection terminated/));
    expect(lines.filter((l) => l.includes("orphan rule paused"))).toHaveLength(1);
    const second = await deadRequest();
    expect(await round(1_000)).toMatchObject({ judged: false, orphans: 0 });
    expect(await round(20_000)).toMatchObject({ judged: false, orphans: 0 });
    expect(await round(20_000)).toMatchObject({ judged: false, orphans: 0 });
    expect(await status(second)).toBe("pending");
    expect(await round(20_000)).toMatchObject({ judged: true, orphans: 1 });
    expect(await status(second)).toBe("failed");

    // Two heartbeats further apart than half the window (a hung connection, a paused process)
    // break the run as a failure does.
    const third = await deadRequest();
    expect(await round(30_001)).toMatchObject({ judged: false, orphans: 0 });
    expect(await round(30_000)).toMatchObject({ judged: false, orphans: 0 });
    expect(await status(third)).toBe("pending");
    expect(await round(30_000)).toMatchObject({ judged: true, orphans: 1 });
    expect(lines.filter((l) => l.includes("orphan rule paused"))).toHaveLength(2);
    expect(lines.filter((l) => l.includes("orphan rule running"))).toHaveLength(3);
  });

  it("says so when its interval is too long for the rule ever to run", async () => {
    const lines: string[] = [];
    const logger = createLogger(
      "info",
      new Writable({
        write(chunk: Buffer, _encoding, done) {
          lines.push(...chunk.toString("utf8").split("\n").filter(Boolean));
          done();
        },
      }),
    );
    for (const intervalMs of [30_000, 30_001]) {
      const housekeeping = createHousekeeping({
        pool: test.db.pool,
        instanceId: id("gw_slow"),
        logger,
        staleAfterSeconds: 60,
        intervalMs,
      });
      housekeeping.start();
      await housekeeping.stop();
    }
    const warned = lines.filter((l) => l.includes("never runs the orphan rule"));
    expect(warned.map((l) => (JSON.parse(l) as { intervalMs: number }).intervalMs)).toEqual([
      30_001,
    ]);
  });
});

import { afterAll, beforeAll, expect, it } from "vitest";
import { openDatabase, type Database } from "../src/adapters/pg/database.js";
import { startGateway, type Gateway } from "../src/app.js";
import { describeIfPostgres } from "./helpers/db.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { chatOn } from "./helpers/settlement.js";
import { eventually, startChatStack, type TestStack } from "./helpers/stack.js";

/**
 * Two gateway processes on one PostgreSQL whose hosts' clocks disagree by 120 s. Liveness is
 * judged on the database's clock, so neither process's orphan rule voids the other's requests.
 */
describeIfPostgres("gateways whose clocks are 120 s apart", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let behindDb: Database;
  let behind: Gateway;

  beforeAll(async () => {
    // A short orphan window, so that both orphan rules are running within the test (each only
    // once its own heartbeats have held for a window).
    ({ stack, fake } = await startChatStack({
      PERMIT_CACHE_MS: "0",
      ORPHAN_AFTER_SECONDS: "3",
      HOUSEKEEPING_INTERVAL_MS: "300",
    }));
    behindDb = await openDatabase({ url: stack.database.url! });
    behind = await startGateway(stack.config, {
      logger: stack.logger,
      database: behindDb,
      clock: () => Math.floor(Date.now() / 1000) - 120,
    });
  }, 60_000);
  afterAll(async () => {
    await behind?.close();
    await behindDb?.close();
    await fake?.stop();
    await stack?.close();
  });

  it("neither voids the other's open requests", async () => {
    await eventually(
      async () =>
        (await stack.gateway.housekeeping.runOnce()).judged &&
        (await behind.housekeeping.runOnce()).judged,
      10_000,
      250,
    );
    fake.setOptions({ delayMs: 1500 });
    try {
      const onBehind = chatOn({ ...stack, gateway: behind }, stack.demo.permitId);
      const onAhead = chatOn(stack, stack.demo.permitId);
      // While both are open, each process runs its orphan rule.
      await new Promise((r) => setTimeout(r, 500));
      expect(await stack.gateway.housekeeping.runOnce()).toMatchObject({
        judged: true,
        orphans: 0,
      });
      expect(await behind.housekeeping.runOnce()).toMatchObject({ judged: true, orphans: 0 });
      for (const chat of await Promise.all([onBehind, onAhead])) {
        const { rows } = await stack.database.db.pool.query<{
          status: string;
          billing: string;
          error: string | null;
        }>("SELECT status, billing, error FROM inference_requests WHERE id = $1", [chat.id]);
        expect(rows[0]).toEqual({ status: "completed", billing: "billed", error: null });
        expect(chat.charged).toBeGreaterThan(0n);
      }
    } finally {
      fake.setOptions({ delayMs: 0 });
    }
  });
});

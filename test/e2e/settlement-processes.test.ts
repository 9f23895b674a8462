import type { Hex } from "viem";
import { afterAll, beforeAll, expect, it } from "vitest";
import { describeIfPostgres } from "../helpers/db.js";
import type { FakeUpstream } from "../helpers/fake-upstream.js";
import { openPermit } from "../helpers/market.js";
import { serveProcess, stopProcess, type GatewayProcess } from "../helpers/processes.js";
import { chainPermit, chatOn, settlementRows } from "../helpers/settlement.js";
import { json, startChatStack, type TestStack } from "../helpers/stack.js";

describeIfPostgres("two gateway processes flushing at once", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let a: GatewayProcess | undefined;
  let b: GatewayProcess | undefined;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack({ PERMIT_CACHE_MS: "0" }));
    [a, b] = await Promise.all([serveProcess(stack), serveProcess(stack)]);
  }, 60_000);
  afterAll(async () => {
    await Promise.all([stopProcess(a), stopProcess(b)]);
    await fake?.stop();
    await stack?.close();
  });

  const flushAt = async (p: GatewayProcess) => {
    const res = await fetch(`${p.url}/settlements/flush`, {
      method: "POST",
      headers: { authorization: `Bearer ${stack.operatorToken}` },
    });
    expect(res.status).toBe(200);
    return json(res);
  };

  it("settles every charge exactly once", async () => {
    const permits: Hex[] = [];
    const ids: string[] = [];
    const totals = new Map<Hex, bigint>();
    for (let p = 0; p < 3; p++) {
      const permitId = await openPermit(stack, { deposit: 10n ** 18n });
      permits.push(permitId);
      for (let i = 0; i < 4; i++) {
        const chat = await chatOn(stack, permitId);
        ids.push(chat.id);
        totals.set(permitId, (totals.get(permitId) ?? 0n) + chat.charged);
      }
    }
    // Three rounds of both processes at once: whoever holds the account's lease settles, the
    // other answers busy at once; neither sends a transaction for a charge the other has.
    let settledRequests = 0;
    let busy = 0;
    for (let round = 0; round < 3; round++) {
      const answers = await Promise.all([flushAt(a!), flushAt(b!)]);
      for (const answer of answers) {
        settledRequests += answer.settled_requests;
        if (answer.busy) busy++;
      }
    }
    // Each charge counted by exactly one flush answer, across both processes.
    expect(settledRequests).toBe(ids.length);
    stack.logger.info({ busy }, "busy answers in the two-process flush test");
    for (const permitId of permits) {
      expect((await chainPermit(stack, permitId)).settled).toBe(totals.get(permitId));
    }
    const rows = await settlementRows(stack, ids);
    expect(rows.map((r) => r.settlement_status)).toEqual(ids.map(() => "settled"));
    // One batch id per transaction on chain, each settled once.
    const { rows: batches } = await stack.database.db.pool.query<{ n: string; settled: string }>(
      "SELECT count(*) AS n, count(*) FILTER (WHERE status = 'settled') AS settled FROM settlement_batches",
    );
    expect(batches[0]!.n).toBe(batches[0]!.settled);
  });
});

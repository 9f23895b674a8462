import { randomBytes } from "node:crypto";
import type { Hex } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { databaseNow } from "../../src/adapters/pg/ledger/index.js";
import { startGateway, type Gateway } from "../../src/app.js";
import type { FakeUpstream } from "../helpers/fake-upstream.js";
import { offerInFlight } from "../helpers/ledger.js";
import { openPermit } from "../helpers/market.js";
import { authed, eventually, startChatStack, type TestStack } from "../helpers/stack.js";

/**
 * The orphan rule judges a process by the later of its heartbeat and its open request's (and
 * Idempotency-Key claim's) creation, and it must do so on the database's clock only (issue 19,
 * item 6). A gateway whose host clock is 10 minutes ahead or behind serves a request with a
 * key; a second, healthy gateway on the same database runs the rule (a 3 s orphan window). The
 * skewed gateway's heartbeats are stopped, so only the request's creation speaks for it.
 */
describe("the orphan rule and gateways whose clocks are far off", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let chatOffer: Hex;
  const skewed: Gateway[] = [];

  beforeAll(async () => {
    ({ stack, fake, chatOffer } = await startChatStack({
      PERMIT_CACHE_MS: "0",
      ORPHAN_AFTER_SECONDS: "3",
      // Rounds run when the test says (runOnce), not on a timer.
      HOUSEKEEPING_INTERVAL_MS: "600000",
    }));
  }, 60_000);
  afterAll(async () => {
    fake?.releaseHolds();
    for (const gateway of skewed) await gateway.close().catch(() => undefined);
    await fake?.stop();
    await stack?.close();
  });

  /** A second gateway on the same database whose clock is `skew` seconds off; no heartbeats. */
  const startSkewed = async (skew: number): Promise<Gateway> => {
    const gateway = await startGateway(stack.config, {
      logger: stack.logger,
      database: stack.database.db,
      clock: () => Math.floor(Date.now() / 1000) + skew,
    });
    skewed.push(gateway);
    // Its startup heartbeat is its last.
    await gateway.housekeeping.stop();
    return gateway;
  };
  const pool = () => stack.database.db.pool;
  /**
   * The healthy gateway's first round that runs the orphan rule: a process judges others only
   * once its own heartbeats have held for a full window (issue 19, item 4), so it heartbeats
   * (a round every 300 ms) until it does.
   */
  const judgedRound = async () => {
    let round: Awaited<ReturnType<typeof stack.gateway.housekeeping.runOnce>> | undefined;
    await eventually(
      async () => (round = await stack.gateway.housekeeping.runOnce()).judged,
      15_000,
      300,
    );
    return round!;
  };
  /** A chat with an Idempotency-Key (a per-request reservation and a claim) on `gateway`. */
  const chatWithKey = (gateway: Gateway, permitId: Hex) =>
    authed({ ...stack, gateway }, "/v1/chat/completions", {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "x-gateway-permit": permitId,
        "idempotency-key": `clock-${randomBytes(8).toString("hex")}`,
      },
      body: JSON.stringify({
        model: "demo-chat",
        messages: [{ role: "user", content: "what time is it?" }],
        max_tokens: 16,
      }),
    });
  const requestOf = async (permitId: Hex) => {
    const { rows } = await pool().query<{
      id: string;
      status: string;
      billing: string | null;
      error: string | null;
      credits_charged: string | null;
      created_at: string;
      db_now: string;
    }>(
      `SELECT id, status, billing, error, credits_charged::text, created_at::text,
         extract(epoch from clock_timestamp())::bigint::text AS db_now
       FROM inference_requests WHERE permit_id = $1`,
      [permitId],
    );
    return rows;
  };
  const claimsOf = async (instanceId: string) => {
    const { rows } = await pool().query<{ state: string }>(
      "SELECT state FROM idempotency_keys WHERE instance_id = $1",
      [instanceId],
    );
    return rows;
  };
  const reserved = async (permitId: Hex) => {
    const { rows } = await pool().query<{ reserved: string }>(
      "SELECT reserved::text FROM permit_ledgers WHERE permit_id = $1",
      [permitId],
    );
    return rows[0]?.reserved;
  };

  it("voids the open request and releases the claim of a stopped gateway whose clock runs ahead", async () => {
    const ahead = await startSkewed(600);
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    fake.setOptions({ stallBeforeHeadersMs: 60_000 });
    const answer = chatWithKey(ahead, permitId).then(async (res) => {
      await res.text();
      return res.status;
    });
    try {
      await eventually(async () => (await requestOf(permitId)).length === 1, 10_000);
      const [open] = await requestOf(permitId);
      expect(open!.status).toBe("pending");
      // Created on the database's clock, not 600 s ahead.
      expect(Math.abs(Number(open!.created_at) - Number(open!.db_now))).toBeLessThanOrEqual(2);
      expect(await claimsOf(ahead.instanceId)).toEqual([{ state: "in_progress" }]);
      expect(await offerInFlight(pool(), chatOffer)).toBe(1);

      // Its heartbeat and its request are now older than the 3 s window (on the database's
      // clock, from when the request was seen): the process is dead.
      const seen = Number(open!.db_now);
      await eventually(async () => (await databaseNow(pool())) >= seen + 4, 10_000);
      const round = await judgedRound();
      expect(round).toMatchObject({ judged: true, orphans: 1, claimsReleased: 1 });
      expect(await requestOf(permitId)).toMatchObject([
        {
          id: open!.id,
          status: "failed",
          billing: "void",
          error: "orphaned",
          credits_charged: "0",
        },
      ]);
      expect(await claimsOf(ahead.instanceId)).toEqual([]);
      expect(await reserved(permitId)).toBe("0");
      expect(await offerInFlight(pool(), chatOffer)).toBe(0);
    } finally {
      fake.setOptions({ stallBeforeHeadersMs: undefined });
      fake.releaseHolds();
    }
    await answer;
    // The process coming back changes nothing: the request stays void, charged nothing.
    expect(await requestOf(permitId)).toMatchObject([
      { status: "failed", billing: "void", error: "orphaned", credits_charged: "0" },
    ]);
    expect(await reserved(permitId)).toBe("0");
  });

  it("keeps the fresh request and claim of a gateway whose clock runs behind and whose heartbeat is stale", async () => {
    const behind = await startSkewed(-600);
    const { rows } = await pool().query<{ heartbeat_at: string }>(
      "SELECT heartbeat_at::text FROM gateway_instances WHERE instance_id = $1",
      [behind.instanceId],
    );
    const beat = Number(rows[0]!.heartbeat_at);
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    // The healthy gateway heartbeats all along (a round every 300 ms), so it runs the rule; the
    // skewed one's heartbeat is older than the window before the request is made.
    const keeper = setInterval(
      () => void stack.gateway.housekeeping.runOnce().catch(() => undefined),
      300,
    );
    try {
      await judgedRound();
      await eventually(async () => (await databaseNow(pool())) >= beat + 4, 10_000);
      await keptFresh(behind, permitId);
    } finally {
      clearInterval(keeper);
    }
  });

  /** The rest of the test above: the fresh request of `behind` is kept by a judging round. */
  async function keptFresh(behind: Gateway, permitId: Hex) {
    fake.setOptions({ stallBeforeHeadersMs: 60_000 });
    const answer = chatWithKey(behind, permitId).then(async (res) => {
      const body = await res.text();
      return { status: res.status, body };
    });
    let id: string;
    try {
      await eventually(async () => (await requestOf(permitId)).length === 1, 10_000);
      const [open] = await requestOf(permitId);
      id = open!.id;
      // Made just now, on the database's clock: the process was alive then.
      expect(Number(open!.db_now) - Number(open!.created_at)).toBeLessThan(3);
      const round = await stack.gateway.housekeeping.runOnce();
      expect(round).toMatchObject({ judged: true, orphans: 0, claimsReleased: 0 });
      expect(await requestOf(permitId)).toMatchObject([{ id, status: "pending" }]);
      expect(await claimsOf(behind.instanceId)).toEqual([{ state: "in_progress" }]);
    } finally {
      fake.setOptions({ stallBeforeHeadersMs: undefined });
      fake.releaseHolds();
    }
    const { status } = await answer;
    expect(status).toBe(200);
    // The charge is committed right after the answer (docs/decisions/chat-quotes-and-money.md).
    await eventually(async () => (await requestOf(permitId))[0]?.status !== "pending");
    const [done] = await requestOf(permitId);
    expect(done).toMatchObject({ id, status: "completed", billing: "billed", error: null });
    expect(BigInt(done!.credits_charged!)).toBeGreaterThan(0n);
    expect(await claimsOf(behind.instanceId)).toEqual([{ state: "completed" }]);
  }
});

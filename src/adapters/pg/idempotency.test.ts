import { beforeEach, describe, expect, it } from "vitest";
import { useTestDatabase } from "../../../test/helpers/db.js";
import { completion, id, NOW, reservation } from "../../../test/helpers/ledger.js";
import type { ChatEvent } from "../../domain/chat/index.js";
import { createPgIdempotencyStore, releaseOrphanedClaims } from "./idempotency.js";
import {
  databaseNow,
  finalize,
  heartbeat,
  markStreaming,
  reconcileOrphans,
  reserve,
} from "./ledger/index.js";
import { getRequest } from "./requests.js";

// Idempotency claims are leases of the claiming process (issue 10, defect 7).

const test = useTestDatabase();

// Each test counts the claims it releases; those of the one before would be stale by then.
beforeEach(async () => {
  await test.db.pool.query("DELETE FROM idempotency_keys");
});

const fingerprint = "a".repeat(64);
const stale = 60;

const claimInput = (key: string, now: number, print = fingerprint) => ({
  apiKeyId: "key_a",
  key,
  fingerprint: print,
  now,
  expiresAt: now + 24 * 3600,
});

const started = (requestId: string): ChatEvent => ({
  type: "started",
  requestId: requestId as `0x${string}`,
  quoteId: `0x${"01".repeat(32)}`,
  offerId: `0x${"02".repeat(32)}`,
  tariffVersion: 1n,
  maximumCredits: 10n,
  stream: false,
  replayed: false,
});

const completedEvent = (requestId: string, credits: bigint): ChatEvent => ({
  type: "completed",
  requestId: requestId as `0x${string}`,
  quoteId: `0x${"01".repeat(32)}`,
  offerId: `0x${"02".repeat(32)}`,
  tariffVersion: 1n,
  inputTokens: 1n,
  outputTokens: 1n,
  creditsCharged: credits,
  billing: "billed",
  usageFromProvider: true,
});

async function keyRow(key: string) {
  const { rows } = await test.db.pool.query<{ state: string; instance_id: string | null }>(
    "SELECT state, instance_id FROM idempotency_keys WHERE api_key_id = 'key_a' AND key = $1",
    [key],
  );
  return rows[0];
}

async function claimedAt(key: string): Promise<number> {
  const { rows } = await test.db.pool.query<{ created_at: string }>(
    "SELECT created_at FROM idempotency_keys WHERE api_key_id = 'key_a' AND key = $1",
    [key],
  );
  return Number(rows[0]!.created_at);
}

describe("idempotency claims held by a process that died", () => {
  it("are released by the orphan rule, so the retry is claimed instead of 409; a live process's claim stays", async () => {
    // Claims are created on the database's clock, as heartbeats are placed here.
    const t = await databaseNow(test.db.pool);
    const dead = id("gw_dead");
    const live = id("gw_live");
    const deadStore = createPgIdempotencyStore(test.db.pool, { instanceId: dead });
    const liveStore = createPgIdempotencyStore(test.db.pool, { instanceId: live });
    const deadKey = id("idem");
    const liveKey = id("idem");
    await heartbeat(test.db.pool, dead, t);
    await heartbeat(test.db.pool, live, t);
    expect(await deadStore.claim(claimInput(deadKey, t))).toEqual({ state: "claimed" });
    expect(await liveStore.claim(claimInput(liveKey, t))).toEqual({ state: "claimed" });
    expect(await keyRow(deadKey)).toEqual({ state: "in_progress", instance_id: dead });

    // The dead process stops beating; the live one goes on.
    await heartbeat(test.db.pool, live, t + 100);
    expect(await liveStore.claim(claimInput(deadKey, t + 100))).toEqual({ state: "in_progress" });

    // Within the grace period nothing is released.
    expect(
      await releaseOrphanedClaims(test.db.pool, { now: t + stale, staleAfterSeconds: stale }),
    ).toBe(0);
    expect(
      await releaseOrphanedClaims(test.db.pool, { now: t + 100, staleAfterSeconds: stale }),
    ).toBe(1);
    // Idempotent: a second round (or another process's) releases nothing more.
    expect(
      await releaseOrphanedClaims(test.db.pool, { now: t + 100, staleAfterSeconds: stale }),
    ).toBe(0);

    // The retry, same key and body, is served.
    expect(await liveStore.claim(claimInput(deadKey, t + 101))).toEqual({ state: "claimed" });
    expect(await keyRow(deadKey)).toEqual({ state: "in_progress", instance_id: live });
    // The live process's own claim is untouched.
    expect(await keyRow(liveKey)).toEqual({ state: "in_progress", instance_id: live });
    expect(await deadStore.claim(claimInput(liveKey, t + 101))).toEqual({ state: "in_progress" });
  });

  it("releases a claim whose process has no instance row once the claim itself is stale", async () => {
    const ghost = createPgIdempotencyStore(test.db.pool, { instanceId: id("gw_ghost") });
    const key = id("idem");
    await ghost.claim(claimInput(key, await databaseNow(test.db.pool)));
    // The claim's creation, on the database's clock, is its holder's only sign of life.
    const t = await claimedAt(key);
    expect(
      await releaseOrphanedClaims(test.db.pool, { now: t + stale - 1, staleAfterSeconds: stale }),
    ).toBe(0);
    expect(await keyRow(key)).toMatchObject({ state: "in_progress" });
    expect(
      await releaseOrphanedClaims(test.db.pool, { now: t + stale + 1, staleAfterSeconds: stale }),
    ).toBe(1);
    expect(await keyRow(key)).toBeUndefined();
  });

  it("never releases a stored result, nor a claim from before migration 009 (no holder)", async () => {
    const t = NOW + 3_000;
    const dead = id("gw_dead");
    const store = createPgIdempotencyStore(test.db.pool, { instanceId: dead });
    const done = id("idem");
    const legacy = id("idem");
    await heartbeat(test.db.pool, dead, t);
    await store.claim(claimInput(done, t));
    await store.complete({
      apiKeyId: "key_a",
      key: done,
      requestId: `0x${"03".repeat(32)}`,
      events: [started(`0x${"03".repeat(32)}`), completedEvent(`0x${"03".repeat(32)}`, 7n)],
    });
    await test.db.pool.query(
      `INSERT INTO idempotency_keys (api_key_id, key, fingerprint, state, created_at, expires_at)
       VALUES ('key_a', $1, $2, 'in_progress', $3, $4)`,
      [legacy, fingerprint, t, t + 24 * 3600],
    );
    await releaseOrphanedClaims(test.db.pool, { now: t + 1_000, staleAfterSeconds: stale });
    expect(await keyRow(done)).toMatchObject({ state: "completed" });
    expect(await keyRow(legacy)).toEqual({ state: "in_progress", instance_id: null });
    const replay = await store.claim(claimInput(done, t + 1_000));
    expect(replay.state).toBe("completed");
  });

  it("releases the key of a request the dead process had begun answering, which the orphan rule voids", async () => {
    // Claims are created on the database's clock, as heartbeats are placed here.
    const t = await databaseNow(test.db.pool);
    const dead = id("gw_dead");
    const live = id("gw_live");
    const deadStore = createPgIdempotencyStore(test.db.pool, { instanceId: dead });
    const liveStore = createPgIdempotencyStore(test.db.pool, { instanceId: live });
    const key = id("idem");
    await heartbeat(test.db.pool, dead, t);
    await deadStore.claim(claimInput(key, t));
    const input = reservation({ instanceId: dead, createdAt: t });
    await reserve(test.db.pool, input);
    await deadStore.begin({ apiKeyId: "key_a", key, requestId: input.requestId as `0x${string}` });
    expect(await markStreaming(test.db.pool, input.requestId)).toBe(true);
    // The process dies mid-stream; the survivors' housekeeping runs the orphan rule.
    await heartbeat(test.db.pool, live, t + 120);
    expect(await reconcileOrphans(test.db.pool, { now: t + 120, staleAfterSeconds: stale })).toBe(
      1,
    );
    expect(
      await releaseOrphanedClaims(test.db.pool, { now: t + 120, staleAfterSeconds: stale }),
    ).toBe(1);
    expect(await getRequest(test.db.pool, input.requestId, "key_a")).toMatchObject({
      status: "failed",
      billing: "void",
      creditsCharged: 0n,
      error: "orphaned",
    });
    // Nothing stale is replayed: the retry claims the key and is served anew.
    expect(await liveStore.claim(claimInput(key, t + 121))).toEqual({ state: "claimed" });
  });
});

describe("only the holder writes its claim, and a stored result is final", () => {
  it("a process whose claim was released and taken anew neither completes nor releases the new claim", async () => {
    // Claims are created on the database's clock, as heartbeats are placed here.
    const t = await databaseNow(test.db.pool);
    const paused = id("gw_paused");
    const other = id("gw_other");
    const pausedStore = createPgIdempotencyStore(test.db.pool, { instanceId: paused });
    const otherStore = createPgIdempotencyStore(test.db.pool, { instanceId: other });
    const key = id("idem");
    await heartbeat(test.db.pool, paused, t);
    await pausedStore.claim(claimInput(key, t));
    await heartbeat(test.db.pool, other, t + 100);
    expect(
      await releaseOrphanedClaims(test.db.pool, { now: t + 100, staleAfterSeconds: stale }),
    ).toBe(1);
    expect(await otherStore.claim(claimInput(key, t + 100))).toEqual({ state: "claimed" });

    // The paused process comes back and finishes its (voided) request.
    const stale1 = `0x${"0a".repeat(32)}` as const;
    await pausedStore.complete({
      apiKeyId: "key_a",
      key,
      requestId: stale1,
      events: [started(stale1), completedEvent(stale1, 1n)],
    });
    await pausedStore.release({ apiKeyId: "key_a", key });
    expect(await keyRow(key)).toEqual({ state: "in_progress", instance_id: other });

    const fresh = `0x${"0b".repeat(32)}` as const;
    await otherStore.complete({
      apiKeyId: "key_a",
      key,
      requestId: fresh,
      events: [started(fresh), completedEvent(fresh, 5n)],
    });
    const replay = await pausedStore.claim(claimInput(key, t + 200));
    expect(replay.state).toBe("completed");
    if (replay.state === "completed")
      expect(replay.events.at(-1)).toMatchObject({ creditsCharged: 5n });
  });

  it("complete never overwrites a completed result (a failed event cannot follow it)", async () => {
    const t = NOW + 6_000;
    const store = createPgIdempotencyStore(test.db.pool, { instanceId: id("gw") });
    const key = id("idem");
    const requestId = `0x${"0c".repeat(32)}` as const;
    await store.claim(claimInput(key, t));
    const result = [started(requestId), completedEvent(requestId, 9n)];
    await store.complete({ apiKeyId: "key_a", key, requestId, events: result });
    await store.complete({
      apiKeyId: "key_a",
      key,
      requestId,
      events: [
        ...result,
        { type: "failed", code: "upstream_error", message: "the answer was interrupted" },
      ],
    });
    await store.release({ apiKeyId: "key_a", key });
    const replay = await store.claim(claimInput(key, t + 1));
    expect(replay.state).toBe("completed");
    if (replay.state === "completed") {
      expect(replay.events.map((e) => e.type)).toEqual(["started", "completed"]);
    }
  });
});

describe("a stored result keeps both numbers", () => {
  it("replays the completed event's claim and count exactly, bigints past 2^53 included", async () => {
    const t = NOW + 7_000;
    const store = createPgIdempotencyStore(test.db.pool, { instanceId: id("gw") });
    const key = id("idem");
    const requestId = `0x${"0d".repeat(32)}` as const;
    await store.claim(claimInput(key, t));
    const completed: ChatEvent = {
      ...(completedEvent(requestId, 9n) as Extract<ChatEvent, { type: "completed" }>),
      usageFromProvider: false,
      claimed: {
        inputTokens: 2n ** 60n,
        outputTokens: 2_000n,
        cachedInputTokens: 3n,
        reasoningTokens: 4n,
      },
      counted: { inputTokens: 12n, outputTokens: 5n, cachedInputTokens: 0n, reasoningTokens: 0n },
    };
    const result = [started(requestId), completed];
    await store.complete({ apiKeyId: "key_a", key, requestId, events: result });
    const replay = await store.claim(claimInput(key, t + 1));
    expect(replay).toEqual({ state: "completed", events: result });
  });
});

describe("the key of a charged request whose result was never stored", () => {
  it("is kept when its holder dies: a retry is refused 409, never served and charged again", async () => {
    const t = await databaseNow(test.db.pool);
    const dead = id("gw_dead");
    const live = id("gw_live");
    const deadStore = createPgIdempotencyStore(test.db.pool, { instanceId: dead });
    const liveStore = createPgIdempotencyStore(test.db.pool, { instanceId: live });
    await heartbeat(test.db.pool, dead, t);
    // Charged and answered; storing its result failed (so `complete` never ran).
    const charged = id("idem_charged");
    await deadStore.claim(claimInput(charged, t));
    const paid = reservation({ instanceId: dead, createdAt: t });
    await reserve(test.db.pool, paid);
    await deadStore.begin({
      apiKeyId: "key_a",
      key: charged,
      requestId: paid.requestId as `0x${string}`,
    });
    expect(await finalize(test.db.pool, completion(paid.requestId, 420n))).toMatchObject({
      finalized: true,
    });
    // Claimed and begun, but the request it names closed with nothing charged: released.
    const voided = id("idem_void");
    await deadStore.claim(claimInput(voided, t));
    const free = reservation({ instanceId: dead, createdAt: t });
    await reserve(test.db.pool, free);
    await deadStore.begin({
      apiKeyId: "key_a",
      key: voided,
      requestId: free.requestId as `0x${string}`,
    });
    expect(
      await finalize(test.db.pool, {
        ...completion(free.requestId, 0n),
        status: "failed",
        billing: "void",
      }),
    ).toMatchObject({ finalized: true });
    // Claimed, never begun: released.
    const unbegun = id("idem_unbegun");
    await deadStore.claim(claimInput(unbegun, t));

    // The holder dies; the survivors' housekeeping runs the orphan rule.
    await heartbeat(test.db.pool, live, t + 120);
    expect(
      await releaseOrphanedClaims(test.db.pool, { now: t + 120, staleAfterSeconds: stale }),
    ).toBe(2);
    expect(await keyRow(charged)).toEqual({ state: "in_progress", instance_id: dead });
    expect(await liveStore.claim(claimInput(charged, t + 121))).toEqual({ state: "in_progress" });
    expect(await liveStore.claim(claimInput(voided, t + 121))).toEqual({ state: "claimed" });
    expect(await liveStore.claim(claimInput(unbegun, t + 121))).toEqual({ state: "claimed" });
    // The one charge stands alone.
    expect(await getRequest(test.db.pool, paid.requestId, "key_a")).toMatchObject({
      status: "completed",
      creditsCharged: 420n,
    });
  });
});

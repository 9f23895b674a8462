import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { heartbeat } from "../src/adapters/pg/ledger/index.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { authed, eventually, json, startChatStack, type TestStack } from "./helpers/stack.js";

/**
 * An Idempotency-Key claimed by a gateway process that then crashed (issue 10, defect 7): the
 * claim is a lease of that process, so once its heartbeat is stale the orphan rule releases it
 * and the client's retry is served, instead of 409 `idempotency_in_progress` for 24 hours.
 */
describe("idempotency keys held by a crashed gateway process", () => {
  let stack: TestStack;
  let fake: FakeUpstream;

  beforeAll(async () => {
    // A short orphan window: the orphan rule runs only once this process's own heartbeats have
    // held for a window (docs/decisions/chat-quotes-and-money.md, "Orphans").
    ({ stack, fake } = await startChatStack({ ORPHAN_AFTER_SECONDS: "3" }));
    // Rounds are run by hand below; the timer must not release a claim between two steps.
    await stack.gateway.housekeeping.stop();
    await eventually(async () => (await stack.gateway.housekeeping.runOnce()).judged, 10_000, 250);
  });
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  const body = { model: "demo-chat", messages: [{ role: "user", content: "retry me" }] };
  const chat = (key: string) =>
    authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "x-gateway-permit": stack.demo.permitId,
        "idempotency-key": key,
      },
      body: JSON.stringify(body),
    });
  const pool = () => stack.database.db.pool;

  /** A claim of `key` on this very request, as the process `instanceId` left it 120 s ago. */
  const claimLeftBy = async (instanceId: string, key: string, fromKey: string) => {
    await pool().query(
      `INSERT INTO idempotency_keys
         (api_key_id, key, fingerprint, state, created_at, expires_at, instance_id)
       SELECT api_key_id, $1, fingerprint, 'in_progress', created_at - 120, expires_at, $2
       FROM idempotency_keys WHERE key = $3`,
      [key, instanceId, fromKey],
    );
  };

  it("releases a dead process's claim so the retry is served; a live process's claim stays", async () => {
    // The same request once with another key: its row carries the request's fingerprint.
    const probeKey = `idem-probe-${Date.now()}`;
    const probe = await chat(probeKey);
    expect(probe.status).toBe(200);
    await probe.text();

    const crashedKey = `idem-crashed-${Date.now()}`;
    const liveKey = `idem-live-${Date.now()}`;
    const { rows } = await pool().query<{ now: string }>(
      "SELECT extract(epoch from clock_timestamp())::bigint AS now",
    );
    const dbNow = Number(rows[0]!.now);
    // The crashed process last beat 120 s ago; the other is alive (it just beat).
    await heartbeat(pool(), "gw_crashed_test", dbNow - 120);
    await heartbeat(pool(), "gw_alive_test");
    await claimLeftBy("gw_crashed_test", crashedKey, probeKey);
    await claimLeftBy("gw_alive_test", liveKey, probeKey);

    const refused = await chat(crashedKey);
    expect(refused.status).toBe(409);
    expect((await json(refused)).error.code).toBe("idempotency_in_progress");

    const round = await stack.gateway.housekeeping.runOnce();
    expect(round).toMatchObject({ judged: true, claimsReleased: 1 });
    expect((await stack.gateway.housekeeping.runOnce()).claimsReleased).toBe(0);

    const calls = fake.calls("/v1/chat/completions");
    const retry = await chat(crashedKey);
    expect(retry.status).toBe(200);
    const retryText = await retry.text();
    expect(fake.calls("/v1/chat/completions")).toBe(calls + 1);
    expect(retry.headers.get("x-gateway-request-id")).not.toBe(
      probe.headers.get("x-gateway-request-id"),
    );
    // The key is the new answer's now: a replay returns it without calling the provider.
    const replay = await chat(crashedKey);
    expect(replay.status).toBe(200);
    expect(await replay.text()).toBe(retryText);
    expect(fake.calls("/v1/chat/completions")).toBe(calls + 1);

    // The live process's claim is untouched.
    const stillLive = await chat(liveKey);
    expect(stillLive.status).toBe(409);
    expect((await json(stillLive)).error.code).toBe("idempotency_in_progress");
  });
});

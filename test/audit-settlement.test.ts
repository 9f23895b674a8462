import { parseEventLogs, type Hex } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { marketAbi } from "../gen/contracts/artifacts.js";
import { seededRandom } from "../src/domain/audits/random.js";
import type { AuditOutcome } from "../src/domain/audits/runner.js";
import { utcDayStart } from "../src/domain/settlement/index.js";
import { startAuditStack, type AuditStack } from "./helpers/audits.js";
import { chatOn, flush, settlingEnv } from "./helpers/settlement.js";
import { authed } from "./helpers/stack.js";

/**
 * What settlement tells a provider about the audits (issue 39, item 1: a provider cannot tell an
 * audit from a client's request). Every `ChargeSettled` names its permit, offer and amount, and
 * the gateway settles every few seconds: one event per audit, its amount that audit's exact
 * charge, a few seconds after it, would show the provider which of its requests were audits
 * (the audit permit pays every offer of the model), and so, afterwards, the operator's private
 * prompts, which the audits ask again. So the audit permits' charges settle a UTC day at a time,
 * all of a day's in one entry per offer.
 */

let a: AuditStack;
let now = Math.floor(Date.UTC(2026, 10, 30, 9) / 1000);
let vnow = Date.UTC(2026, 10, 30, 9);

beforeAll(async () => {
  a = await startAuditStack({ env: settlingEnv }, { rng: seededRandom(3), nowMs: () => vnow });
  await a.restartWith({ clock: () => now }, { rng: seededRandom(4), nowMs: () => vnow });
}, 120_000);

afterAll(async () => {
  await a?.stack.close();
  await a?.fake.stop();
});

/** The ChargeSettled events of the market from `fromBlock`, as anyone reads them. */
async function chargesSettled(fromBlock: bigint) {
  const client = a.stack.clients.publicClient;
  const logs = await client.getLogs({ address: a.stack.demo.market, fromBlock });
  return parseEventLogs({ abi: marketAbi, logs, eventName: "ChargeSettled" }).map((e) => ({
    permitId: e.args.permitId.toLowerCase(),
    offerId: e.args.offerId.toLowerCase(),
    amount: e.args.amount,
  }));
}

/** A request's settlement state, from the ledger (audits are the audit key's requests). */
async function settlementOf(requestId: Hex | undefined): Promise<string | undefined> {
  const { rows } = await a.stack.database.db.pool.query<{ settlement_status: string }>(
    "SELECT settlement_status FROM inference_requests WHERE id = $1",
    [requestId],
  );
  return rows[0]?.settlement_status;
}

describe("the audits' charges on chain", () => {
  it("settle a UTC day at a time, in one ChargeSettled per offer, while the clients' settle at each flush", async () => {
    const from = await a.stack.clients.publicClient.getBlockNumber();
    const offer = a.chatOffer.toLowerCase();
    const audit = a.auditPermit.toLowerCase();
    const clientPermit = a.clientPermits[0]!.toLowerCase();
    // Framings the audits may copy: the demo payer's and two others' requests.
    for (const permitId of a.clientPermits)
      for (const t of [0, 1]) {
        const res = await authed(a.stack, "/v1/chat/completions", {
          method: "POST",
          headers: { "content-type": "application/json", "x-gateway-permit": permitId },
          body: JSON.stringify({
            model: "demo-chat",
            messages: [{ role: "user", content: "hi" }],
            temperature: t,
            max_tokens: 16,
          }),
        });
        expect(res.status).toBe(200);
        await res.text();
      }
    expect((await flush(a.stack)).status).toBe(200);
    const before = (await chargesSettled(from)).length;

    // Audits and clients interleaved, a flush after each pair, as the worker's interval does.
    const audits: Extract<AuditOutcome, { status: "sent" }>[] = [];
    const clients: bigint[] = [];
    for (let i = 0; i < 4; i += 1) {
      vnow += 60_000;
      now += 60;
      const outcome = await a.gateway.audits!.runOnce();
      expect(outcome.status).toBe("sent");
      audits.push(outcome as Extract<AuditOutcome, { status: "sent" }>);
      clients.push((await chatOn(a.stack, a.clientPermits[0]!)).charged);
      const flushed = await flush(a.stack);
      expect(flushed.status, JSON.stringify(flushed.body)).toBe(200);
    }
    const sameDay = (await chargesSettled(from)).slice(before);
    // Each flush settled the client's charge; none of the audits' was on chain.
    expect(sameDay).toEqual(
      clients.map((amount) => ({ permitId: clientPermit, offerId: offer, amount })),
    );
    for (const o of audits) expect(await settlementOf(o.answer.requestId)).toBe("unsettled");
    // Owed, and shown so; not settlement falling behind: the oldest charge's age leaves them out.
    const held = audits.reduce((sum, o) => sum + o.answer.charged!, 0n);
    const metrics = await (await fetch(a.gateway.metricsUrl)).text();
    expect(metrics).toMatch(new RegExp(`^gateway_unsettled_credits ${held}$`, "m"));
    expect(metrics).toMatch(/^gateway_oldest_unsettled_charge_age_seconds 0$/m);

    // The next UTC day: the day's audits settle, together.
    now = utcDayStart(now) + 86_400 + 5;
    expect((await flush(a.stack)).status).toBe(200);
    const nextDay = (await chargesSettled(from)).slice(before + sameDay.length);
    expect(audits.every((o) => o.answer.charged! > 0n && o.charged === o.answer.charged)).toBe(
      true,
    );
    expect(nextDay).toEqual([{ permitId: audit, offerId: offer, amount: held }]);
    for (const o of audits) expect(await settlementOf(o.answer.requestId)).toBe("settled");
  });
});

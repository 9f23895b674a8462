import type { Hex } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { auditSpendOn } from "../src/adapters/pg/audit-traffic.js";
import { auditDay } from "../src/domain/audits/budget.js";
import type { AuditOutcome } from "../src/domain/audits/runner.js";
import { seededRandom } from "../src/domain/audits/random.js";
import { runAuditsBudget } from "../src/cli/audits-budget.js";
import { clientChat, startAuditStack, type AuditStack } from "./helpers/audits.js";
import { flush, settlementRows, settlingEnv } from "./helpers/settlement.js";
import { eventually } from "./helpers/stack.js";

/**
 * Issue 39, acceptance: "Audits stop at the daily budget; their cost shows in the metrics and in
 * the operator's view." And the audits are requests like any other: charged to the operator's
 * audit permit, the provider paid, settled on chain like any request.
 *
 * The attack is on the operator's money: audits that keep spending past the budget, concurrent
 * audits that each see room and together pass it, a cost the metrics or the ledger disagree on.
 */

let a: AuditStack;
let vnow = Date.now();
/** The most one audit can cost here (a quote of a long corpus prompt at the clients' limit). */
let perAudit = 0n;
/** The day the budget was reached (`vnow` moves on after it). */
let budgetDay = "";
const budgetAudits = 4n;
/** The audits drawn and not sent this process (the budget's refusals, framings missing). */
const skipped: AuditOutcome[] = [];

/** A client's request from each of the stack's three payers (audits copy only those). */
async function sendClient(temperature: number): Promise<void> {
  for (const permitId of a.clientPermits) await sendOne(temperature, permitId);
}

async function sendOne(temperature: number, permitId: Hex): Promise<void> {
  const res = await clientChat(a, permitId, {
    messages: [{ role: "user", content: "a client's question" }],
    temperature,
    max_tokens: 32,
  });
  await res.text();
  expect(res.status).toBe(200);
}

async function metricValue(name: string, labels: string): Promise<number> {
  const text = await (await fetch(a.gateway.metricsUrl)).text();
  const line = text.split("\n").find((l) => l.startsWith(`${name}{${labels}}`));
  return line === undefined ? 0 : Number(line.split(" ").pop());
}

/** The ledger's charges of the audit permit's requests (the money the permit paid). */
async function ledgerCharged(): Promise<bigint> {
  const { rows } = await a.stack.database.db.pool.query<{ total: string }>(
    "SELECT coalesce(sum(credits_charged), 0)::text AS total FROM inference_requests WHERE permit_id = $1",
    [a.auditPermit],
  );
  return BigInt(rows[0]!.total);
}

beforeAll(async () => {
  // First without a budget it can reach: the first test measures what one audit reserves.
  a = await startAuditStack(
    {
      env: settlingEnv,
      budgetPerOffer: 10n ** 30n,
      budgetPerModel: 10n ** 30n,
    },
    { rng: seededRandom(11), nowMs: () => vnow },
  );
  for (const t of [0, 1, 0, 1]) await sendClient(t);
}, 120_000);

afterAll(async () => {
  await a?.stack.close();
  await a?.fake.stop();
});

describe("the daily audit budget", () => {
  let sent: Extract<AuditOutcome, { status: "sent" }>[] = [];

  it("concurrent audits stop at the budget: spent never passes it, and the ledger agrees to the credit", async () => {
    // What one audit reserves: measured on this stack with a budget it cannot reach.
    const probe = await a.gateway.audits!.runOnce();
    if (probe.status !== "sent") throw new Error(`probe audit: ${probe.status}`);
    const { rows } = await a.stack.database.db.pool.query<{ maximum_credits: string }>(
      "SELECT maximum_credits::text FROM inference_requests WHERE id = $1",
      [probe.answer.requestId],
    );
    perAudit = BigInt(rows[0]!.maximum_credits);
    expect(perAudit).toBeGreaterThan(probe.charged);
    // A new day with a budget of `budgetAudits` audits' worth: the gateway restarted with it.
    vnow += 86_400_000;
    await a.restartWith(
      {
        env: settlingEnv,
        budgetPerOffer: budgetAudits * perAudit,
        budgetPerModel: 100n * perAudit,
      },
      { rng: seededRandom(12), nowMs: () => vnow },
    );
    for (const t of [0, 1, 0, 1]) await sendClient(t);
    const runner = a.gateway.audits!;
    const outcomes = await Promise.all(Array.from({ length: 12 }, () => runner.runOnce()));
    sent = outcomes.filter(
      (o): o is Extract<AuditOutcome, { status: "sent" }> => o.status === "sent",
    );
    skipped.push(...outcomes.filter((o) => o.status === "over_budget" || o.status === "no_shape"));
    const refused = outcomes.filter((o) => o.status === "over_budget");
    expect(sent.length + refused.length).toBe(12);
    expect(refused.length).toBeGreaterThan(0);
    // Then one at a time: each is sent while its most fits what is left, refused once it does not.
    let last: AuditOutcome | undefined;
    for (let i = 0; i < 300 && last?.status !== "over_budget"; i += 1) {
      last = await runner.runOnce();
      if (last.status === "sent") sent.push(last);
      else if (last.status === "over_budget" || last.status === "no_shape") skipped.push(last);
    }
    const day = auditDay(vnow);
    budgetDay = day;
    const lines = await auditSpendOn(a.stack.database.db.pool, day);
    const offerLine = lines.find((l) => l.scope === "offer" && l.id === a.chatOffer)!;
    const budget = budgetAudits * perAudit;
    const spent = sent.reduce((sum, o) => sum + o.charged, 0n);
    expect(offerLine.reserved).toBe(0n);
    expect(offerLine.spent).toBe(spent);
    expect(offerLine.spent).toBeLessThanOrEqual(budget);
    // Stopped exactly at the budget: the last audit was refused because its most did not fit
    // in what was left, and every admitted one fit.
    if (last?.status !== "over_budget") throw new Error("the budget never stopped the audits");
    expect(offerLine.spent + last.maximumCredits).toBeGreaterThan(budget);
    expect(sent.length).toBeGreaterThanOrEqual(Number(budgetAudits) - 1);
    // The ledger charged the audit permit what the budget counted (today's and the probe's).
    expect(await ledgerCharged()).toBe(offerLine.spent + probe.charged);
    const modelLine = lines.find((l) => l.scope === "model")!;
    expect(modelLine.spent).toBe(offerLine.spent);
  }, 120_000);

  it("the metrics show the spend and the requests", async () => {
    const labels = `model="demo-chat",offer="${a.chatOffer}"`;
    const spent = sent.reduce((sum, o) => sum + o.charged, 0n);
    // This process's counters (restarted with the budget): exactly what it spent.
    expect(await metricValue("gateway_audit_credits_spent_total", labels)).toBe(Number(spent));
    const byTest = new Map<string, number>();
    for (const o of sent) byTest.set(o.test, (byTest.get(o.test) ?? 0) + 1);
    for (const [test, count] of byTest)
      expect(await metricValue("gateway_audit_requests_total", `${labels},test="${test}"`)).toBe(
        count,
      );
    // And the audits drawn but not sent, by test and reason: the budget's refusals among them.
    const byReason = new Map<string, number>();
    for (const o of skipped)
      if (o.status === "over_budget" || o.status === "no_shape") {
        const key = `test="${o.test}",reason="${o.status}"`;
        byReason.set(key, (byReason.get(key) ?? 0) + 1);
      }
    expect([...byReason.keys()].some((k) => k.includes('reason="over_budget"'))).toBe(true);
    for (const [key, count] of byReason)
      expect(await metricValue("gateway_audit_skipped_total", `model="demo-chat",${key}`)).toBe(
        count,
      );
  });

  it("the operator's view: `gateway audits budget` shows spend against budget per model and offer", async () => {
    const out: string[] = [];
    const env = {
      AUDIT_PERMITS: `${a.modelId}=${a.auditPermit}`,
      AUDIT_DAILY_BUDGET_PER_OFFER: (budgetAudits * perAudit).toString(),
      AUDIT_DAILY_BUDGET_PER_MODEL: (100n * perAudit).toString(),
    };
    // `gateway audits budget --day <day>`: the command's function (src/cli/audits-budget.ts, what
    // the CLI runs after its arguments) over the stack's database.
    const argv = ["audits", "budget", "--day", budgetDay];
    const status = await runAuditsBudget(a.stack.database.db.pool, argv.slice(2), env, {
      out: (line) => out.push(line),
    });
    expect(status).toBe(0);
    const spent = sent.reduce((sum, o) => sum + o.charged, 0n);
    const budget = budgetAudits * perAudit;
    expect(out[0]).toBe(
      `audits on ${budgetDay} (UTC): budget ${100n * perAudit} per model, ${budget} per offer (credits, base units)`,
    );
    expect(out.slice(1)).toEqual([
      `model\t${a.modelId}\tspent ${spent}\treserved 0\tbudget ${100n * perAudit}\tleft ${100n * perAudit - spent}\taudits ${sent.length}`,
      `offer\t${a.chatOffer}\tspent ${spent}\treserved 0\tbudget ${budget}\tleft ${budget - spent}\taudits ${sent.length}`,
    ]);
    // A budget lowered below what was spent shows the line over it (exit status 1).
    const lower = { ...env, AUDIT_DAILY_BUDGET_PER_OFFER: (spent - 1n).toString() };
    expect(
      await runAuditsBudget(a.stack.database.db.pool, ["--day", budgetDay], lower, {
        out: () => {},
      }),
    ).toBe(1);
    await expect(
      runAuditsBudget(a.stack.database.db.pool, ["--day", "yesterday"], env, { out: () => {} }),
    ).rejects.toThrow("--day takes YYYY-MM-DD");
  });

  it("the next day (UTC) they resume", async () => {
    vnow += 86_400_000;
    const next = await a.gateway.audits!.runOnce();
    expect(next.status).toBe("sent");
    if (next.status === "sent") sent.push(next);
  });

  it("audits are charged to the audit permit, the provider paid, and settle like any request", async () => {
    const ids = sent.map((o) => o.answer.requestId!);
    const { rows } = await a.stack.database.db.pool.query<{
      permit_id: string;
      api_key_id: string;
      offer_id: Hex;
      credits_charged: string;
      status: string;
    }>(
      "SELECT permit_id, api_key_id, offer_id, credits_charged::text, status FROM inference_requests WHERE id = ANY ($1::text[]) ORDER BY id",
      [ids],
    );
    expect(rows).toHaveLength(ids.length);
    const charged = new Map(sent.map((o) => [o.answer.requestId!, o.charged]));
    for (const row of rows) {
      expect(row.permit_id).toBe(a.auditPermit);
      expect(row.api_key_id).toBe(a.auditKeyId);
      expect(row.offer_id).toBe(a.chatOffer);
      expect(row.status).toBe("completed");
    }
    const byId = await settlementRows(a.stack, ids);
    for (const r of byId) expect(BigInt(r.credits_charged)).toBe(charged.get(r.id as Hex));
    const flushed = await flush(a.stack);
    expect(flushed.status).toBe(200);
    for (const r of await settlementRows(a.stack, ids)) expect(r.settlement_status).toBe("settled");
  }, 60_000);

  it("started with the gateway, audits go on their own at random times, and stop with it", async () => {
    const before = await auditRequests();
    // About one audit every 10 ms of the offer's day: a few within the wait.
    await a.restartWith(
      { env: settlingEnv, requestsPerOfferPerDay: 8_640_000 },
      { rng: seededRandom(13), nowMs: () => vnow, start: true },
    );
    // A new process knows nothing of its clients yet: audits wait for their framings.
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(await auditRequests()).toBe(before);
    for (const t of [0, 1]) await sendClient(t);
    await eventually(async () => (await auditRequests()) >= before + 3, 20_000);
    await a.gateway.close();
    const after = await auditRequests();
    // Stopped: nothing more is sent once the gateway closed.
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(await auditRequests()).toBe(after);
    const { rows } = await a.stack.database.db.pool.query<{ open: string }>(
      "SELECT count(*)::text AS open FROM inference_requests WHERE permit_id = $1 AND status IN ('pending', 'streaming')",
      [a.auditPermit],
    );
    expect(rows[0]!.open).toBe("0");
    // The stack's own close starts the gateway again for nothing: give it one to close.
    await a.restartWith({ env: settlingEnv }, { nowMs: () => vnow });
  }, 60_000);
});

async function auditRequests(): Promise<number> {
  const { rows } = await a.stack.database.db.pool.query<{ n: string }>(
    "SELECT count(*)::text AS n FROM inference_requests WHERE permit_id = $1",
    [a.auditPermit],
  );
  return Number(rows[0]!.n);
}

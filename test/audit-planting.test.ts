import type { Hex } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createApiKey } from "../src/adapters/pg/api-keys.js";
import { seededRandom } from "../src/domain/audits/random.js";
import type { AuditOutcome } from "../src/domain/audits/runner.js";
import { startAuditStack, type AuditStack } from "./helpers/audits.js";
import { authorizeKey } from "./helpers/authorize.js";
import { auditSecret } from "./helpers/log-audit.js";
import { openPermit } from "./helpers/market.js";

/**
 * Issue 39: a provider that is also a client plants a marker in the audits' framing. It sends
 * requests through the gateway carrying a parameter value no one else sends (`max_tokens`
 * 4093); an audit that copied that shape would carry it, and the provider would answer every
 * request with the marker that it did not send itself honestly. Its other way in is free: a
 * request the gateway refuses (here: a permit that cannot pay), sent from several payers of its
 * own, carrying another marker (`max_tokens` 3071). Three honest payers (one API key spending
 * the three payers' permits: a payer is not a key) send what clients send, among it a value no
 * list holds as common (`top_p` 0.85), which the audits still copy.
 */

const model = "demo-chat";
/** The admitted marker, sent by one payer; the refused one, sent by three. */
const admittedMarker = 4093;
const refusedMarker = 3071;

let a: AuditStack;
const outcomes: AuditOutcome[] = [];
/** The bodies the provider received from the auditor. */
const audits: Record<string, unknown>[] = [];
const refusals: number[] = [];

async function chat(apiKey: string, permitId: Hex, body: Record<string, unknown>): Promise<number> {
  const res = await fetch(`${a.gateway.url}/v1/chat/completions`, {
    method: "POST",
    headers: {
      authorization: `Bearer ${apiKey}`,
      "content-type": "application/json",
      "x-gateway-permit": permitId,
    },
    body: JSON.stringify(body),
  });
  await res.text();
  return res.status;
}

const question = (text: string) => [{ role: "user", content: text }];

beforeAll(async () => {
  a = await startAuditStack({ requestsPerOfferPerDay: 100 }, { rng: seededRandom(39) });
  const { stack } = a;
  const accounts = stack.anvil.accounts;
  // The honest payers: the demo payer and anvil's accounts 5 and 6, their permits spent by the
  // stack's key.
  const honest = a.clientPermits;
  // The provider as a client: its own key, a funded permit of account 7, and a permit that
  // cannot pay for anything from each of accounts 7, 8 and 9.
  const attackerKey = (await createApiKey(stack.database.db.pool, "attacker")).key;
  auditSecret("api key", attackerKey);
  const funded = await openPermit(stack, {
    deposit: 10n ** 24n,
    payerPrivateKey: accounts[7]!.privateKey,
  });
  await authorizeKey(a.gateway.url, attackerKey, accounts[7]!.privateKey, { permitId: funded });
  const unfunded: Hex[] = [];
  for (const account of accounts.slice(7, 10)) {
    const permitId = await openPermit(stack, {
      deposit: 1n,
      payerPrivateKey: account.privateKey,
    });
    await authorizeKey(a.gateway.url, attackerKey, account.privateKey, { permitId });
    unfunded.push(permitId);
  }

  for (let round = 0; round < 2; round += 1) {
    for (const permitId of honest) {
      const cold = { model, messages: question("hi"), temperature: 0, max_tokens: 64 };
      expect(await chat(stack.apiKey, permitId, cold)).toBe(200);
      const warm = { model, messages: question("hello"), temperature: 1, top_p: 0.85 };
      expect(await chat(stack.apiKey, permitId, warm)).toBe(200);
    }
    // The marked requests, as many as the honest ones at each temperature.
    for (let i = 0; i < 3; i += 1) {
      const marked = {
        model,
        messages: question("hi"),
        temperature: 0,
        max_tokens: admittedMarker,
      };
      expect(await chat(attackerKey, funded, marked)).toBe(200);
    }
    for (const permitId of unfunded) {
      const marked = {
        model,
        messages: question("hello"),
        temperature: 1,
        max_tokens: refusedMarker,
      };
      refusals.push(await chat(attackerKey, permitId, marked));
    }
  }

  const before = a.fake.requests.length;
  const runner = a.gateway.audits!;
  for (let i = 0; i < 40; i += 1) {
    const outcome = await runner.runOnce();
    if (outcome.status === "failed") throw outcome.error;
    outcomes.push(outcome);
  }
  for (const r of a.fake.requests.slice(before)) audits.push(r.body as Record<string, unknown>);
}, 180_000);

afterAll(async () => {
  await a?.stack.close();
  await a?.fake.stop();
});

describe("a provider that plants a marker in the audits' framing", () => {
  it("every audit was sent, at both temperatures", () => {
    expect(outcomes.map((o) => o.status)).toEqual(Array(40).fill("sent"));
    expect(audits).toHaveLength(40);
    expect(new Set(audits.map((b) => b["temperature"]))).toEqual(new Set([0, 1]));
  });

  it("a marker one payer sent, admitted, is never copied", () => {
    for (const body of audits) expect(Object.values(body)).not.toContain(admittedMarker);
  });

  it("a marker sent in refused requests, from three payers, is never copied", () => {
    expect(refusals).toEqual(Array(6).fill(402));
    for (const body of audits) expect(Object.values(body)).not.toContain(refusedMarker);
  });

  it("what three payers sent is copied, values no list holds as common among it", () => {
    const cold = audits.filter((b) => b["temperature"] === 0);
    const warm = audits.filter((b) => b["temperature"] === 1);
    for (const body of cold) expect(body["max_tokens"]).toBe(64);
    for (const body of warm) expect(body["top_p"]).toBe(0.85);
  });
});

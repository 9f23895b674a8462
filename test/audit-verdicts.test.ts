import type { Hex } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mixSeed, seededRandom } from "../src/domain/audits/random.js";
import type { AuditOutcome } from "../src/domain/audits/runner.js";
import { clientChat, startAuditStack, type AuditStack } from "./helpers/audits.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { secondChatOffer } from "./helpers/market.js";
import { createImpostorLm, createReferenceLm, promptOf, type NgramLm } from "./helpers/ngram-lm.js";
import { json } from "./helpers/stack.js";

/**
 * Issue 39 from end to end, no part stood in for: two offers of `demo-chat`, each a real HTTP
 * provider answering from the n-gram fixture (the honest one samples the reference model, the
 * cheaper one another model), the gateway's own auditor sending blind audits to both through its
 * gRPC port, the statistics judging what came back, the verdicts stored in the standing every
 * process reads, and routing acting on them. The operator named the honest offer the anchor.
 */

/** A provider answering from `lm`: each request's randomness seeded from its order. */
function answering(lm: NgramLm, seed: number): (body: Record<string, unknown>) => string[] {
  let n = 0;
  return (body) => {
    const maxTokens = Number(body.max_completion_tokens ?? body.max_tokens ?? 32);
    const { tokens } = lm.generate(promptOf(body), {
      temperature: Number(body.temperature ?? 1),
      maxTokens: Math.min(maxTokens, 32),
      rng: seededRandom(mixSeed(seed, (n += 1))),
    });
    return tokens.map((t, i) => (i === 0 ? t : ` ${t}`));
  };
}

let a: AuditStack;
let honest: Hex;
let fakeHonest: FakeUpstream;
let impostor: Hex;
let vnow = Date.UTC(2026, 10, 30, 12);

async function client(
  temperature: number,
  extra: Record<string, unknown> = {},
  permitId: Hex = a.clientPermit,
) {
  return clientChat(a, permitId, {
    messages: [{ role: "user", content: "tell me something about the sea" }],
    temperature,
    max_tokens: 32,
    ...extra,
  });
}

beforeAll(async () => {
  a = await startAuditStack({}, { rng: seededRandom(5), nowMs: () => vnow });
  // The demo offer (the cheaper) serves another model; the second offer the reference.
  impostor = a.chatOffer;
  ({ b: honest, fakeB: fakeHonest } = await secondChatOffer(a.stack));
  const reference = createReferenceLm(901);
  a.fake.setOptions({ answer: answering(createImpostorLm(reference, 77), 1) });
  fakeHonest.setOptions({ answer: answering(reference, 2) });
  await a.restartWith(
    { anchors: new Map([[a.modelId, honest]]) },
    { rng: seededRandom(6), nowMs: () => vnow },
  );
}, 120_000);

afterAll(async () => {
  await a?.stack.close();
  await a?.fake.stop();
  await fakeHonest?.stop();
});

describe("audits end to end: an offer serving another model is found and taken out of routing", () => {
  it("the blind audits' evidence flags the impostor beyond the exclusion threshold, never the anchor, and routing follows", async () => {
    // Before: the cheaper offer (the impostor) gets the clients. Their framings, at the
    // temperatures the audits use, are what the audits copy (sent by three payers).
    const before = a.fake.calls("/v1/chat/completions");
    for (const permitId of a.clientPermits)
      for (const t of [0, 1]) {
        const res = await client(t, {}, permitId);
        expect(res.status).toBe(200);
        expect(res.headers.get("x-gateway-offer-id")?.toLowerCase()).toBe(impostor.toLowerCase());
        await res.text();
      }
    expect(a.fake.calls("/v1/chat/completions")).toBe(before + 6);

    const runner = a.gateway.audits!;
    const outcomes: AuditOutcome[] = [];
    let verdicts = await runner.evaluate();
    // Audits until the evidence settles it, judged as the gateway's own round does.
    for (let round = 0; round < 40; round += 1) {
      for (let i = 0; i < 40; i += 1) {
        vnow += 60_000;
        outcomes.push(await runner.runOnce());
      }
      verdicts = await runner.evaluate();
      if (verdicts.find((v) => v.offerId === impostor)?.state === "excluded") break;
    }
    expect(outcomes.every((o) => o.status === "sent")).toBe(true);
    // The seeded run settles it after 5 rounds of 40 (both offers audited, half of them border
    // probes at temperature 0). The border probes carry the evidence: the fixture's models differ
    // on the near-ties, which the runner finds on the anchor and then mostly asks (520 audits
    // before it did, asking every candidate alike); MMD on 100 characters of 32 words does not
    // tell these two apart.
    expect(outcomes.length).toBe(200);
    const byOffer = new Map(verdicts.map((v) => [v.offerId, v]));
    const bad = byOffer.get(impostor)!;
    const anchor = byOffer.get(honest)!;
    expect(bad.state).toBe("excluded");
    expect(bad.reference).toEqual({ kind: "anchor", offerId: honest });
    expect(bad.eValue).toBeGreaterThanOrEqual(bad.excludeAt);
    // The anchor is the reference: compared with the only other offer, it differs as much, and
    // its e-value says so, but it is never flagged for it.
    expect(anchor.state).toBe("passing");
    expect(anchor.reference.kind).toBe("majority");

    // Every process reads the standing; this one now, the others on their round.
    await a.gateway.standings.refresh();
    const offers = await json(
      await fetch(`${a.gateway.url}/v1/models/${a.modelId}/offers`, {
        headers: { authorization: `Bearer ${a.stack.apiKey}` },
      }),
    );
    const shown = new Map(
      (
        offers.data as { offer_id: string; audit: { state: string; model_mismatch: boolean } }[]
      ).map((o) => [o.offer_id.toLowerCase(), o.audit]),
    );
    expect(shown.get(impostor.toLowerCase())).toMatchObject({
      state: "excluded",
      model_mismatch: true,
    });
    expect(shown.get(honest.toLowerCase())).toMatchObject({
      state: "passing",
      model_mismatch: false,
    });

    const metrics = await (await fetch(a.gateway.metricsUrl)).text();
    expect(metrics).toMatch(/^gateway_audit_offers\{state="excluded"\} 1$/m);
    expect(metrics).toMatch(/^gateway_audit_offers\{state="passing"\} 1$/m);
    expect(metrics).toMatch(/^gateway_audit_offers\{state="flagged"\} 0$/m);

    // After: the impostor receives no client request, the anchor serves them; pinned to the
    // impostor: 503 naming the reason.
    const impostorCalls = a.fake.calls("/v1/chat/completions");
    for (const t of [0, 1]) {
      const res = await client(t);
      expect(res.status).toBe(200);
      expect(res.headers.get("x-gateway-offer-id")?.toLowerCase()).toBe(honest.toLowerCase());
      await res.text();
    }
    const pinned = await client(1, { offer: impostor });
    expect(pinned.status).toBe(503);
    expect((await json(pinned)).error.code).toBe("offer_model_mismatch");
    expect(a.fake.calls("/v1/chat/completions")).toBe(impostorCalls);
  });
});

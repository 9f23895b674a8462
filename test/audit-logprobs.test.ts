import type { Hex } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { verifyOffer } from "../src/clients/provider.js";
import { seededRandom } from "../src/domain/audits/random.js";
import type { AuditOutcome } from "../src/domain/audits/runner.js";
import { LOGPROB_TOKENS } from "../src/domain/audits/logprobs.js";
import { clientChat, startAuditStack, type AuditStack } from "./helpers/audits.js";
import type { FakeUpstream, LogprobsOf } from "./helpers/fake-upstream.js";
import { secondChatOffer } from "./helpers/market.js";
import { contextOf, createReferenceLm, promptOf, VOCAB } from "./helpers/ngram-lm.js";
import { sseData } from "./helpers/sse.js";
import { json } from "./helpers/stack.js";

/**
 * Issue 39, item 3's third test from end to end: logprob challenges. Two offers of `demo-chat`
 * expose log-probabilities (their verification proved the `logprobs` feature). The honest one,
 * the anchor, answers greedily from the n-gram fixture's reference model and reports its values.
 * The other serves a model with the same greedy answers and other probabilities (the reference
 * sharpened: a distilled or re-tuned model whose top token agrees everywhere): no temperature-0
 * answer of it differs from the anchor's, so border probes cannot tell them apart, and its
 * clients ask nothing at temperature 1, so no MMD batch runs. Only the logprob challenges can
 * find it, and they do: it is excluded, and its evidence says which test did it.
 */

/** Log-probabilities after a context: the reference's, or sharpened by 1/`temperature`. */
type Distribution = (context: number) => Float64Array;

function sharpened(base: Distribution, temperature: number): Distribution {
  return (context) => {
    const scaled = base(context).map((v) => v / temperature);
    const max = Math.max(...scaled);
    const norm = max + Math.log(scaled.reduce((sum, v) => sum + Math.exp(v - max), 0));
    return scaled.map((v) => v - norm);
  };
}

/** The greedy answer of `dist` to a request and, per token, its values and top alternatives. */
function greedy(dist: Distribution, body: Record<string, unknown>) {
  const prompt = promptOf(body);
  const limit = Math.min(Number(body.max_completion_tokens ?? body.max_tokens ?? 16), 16);
  const topK = Number(body.top_logprobs ?? 0);
  let context = contextOf(prompt);
  const pieces: string[] = [];
  const values: ReturnType<LogprobsOf> = [];
  for (let i = 0; i < limit; i++) {
    const logp = dist(context);
    const order = [...logp.keys()].sort((a, b) => logp[b]! - logp[a]! || a - b);
    const token = order[0]!;
    const piece = (i === 0 ? "" : " ") + VOCAB[token]!;
    pieces.push(piece);
    values.push({
      logprob: logp[token]!,
      top_logprobs: order
        .slice(0, topK)
        .map((t) => ({ token: (i === 0 ? "" : " ") + VOCAB[t]!, logprob: logp[t]! })),
    });
    context = token;
  }
  return { pieces, values };
}

/** A provider answering greedily from `dist`, with its values when asked for them. */
function serving(fake: FakeUpstream, dist: Distribution): void {
  const answers = new WeakMap<object, ReturnType<typeof greedy>>();
  const answer = (body: Record<string, unknown>) => {
    const a = greedy(dist, body);
    answers.set(body, a);
    return a.pieces;
  };
  const logprobs: LogprobsOf = (body) => answers.get(body)?.values ?? [];
  fake.setOptions({ answer, logprobs });
}

let a: AuditStack;
let honest: Hex;
let fakeHonest: FakeUpstream;
let impostor: Hex;
let vnow = Date.UTC(2026, 10, 30, 12);
const reference = createReferenceLm(901);
const referenceDist: Distribution = (c) => reference.logProbs(c);

async function client(extra: Record<string, unknown> = {}, permitId: Hex = a.clientPermit) {
  return clientChat(a, permitId, {
    messages: [{ role: "user", content: "classify the sea" }],
    temperature: 0,
    max_tokens: 64,
    logprobs: true,
    top_logprobs: 3,
    ...extra,
  });
}

beforeAll(async () => {
  // Operators verify again at once (the bound between two runs is for the endpoint's sake).
  a = await startAuditStack(
    { env: { VERIFY_MIN_INTERVAL_SECONDS: "0" } },
    { rng: seededRandom(5), nowMs: () => vnow },
  );
  impostor = a.chatOffer;
  ({ b: honest, fakeB: fakeHonest } = await secondChatOffer(a.stack));
  serving(a.fake, sharpened(referenceDist, 0.5));
  serving(fakeHonest, referenceDist);
  // Their operators verify them again: both prove the feature.
  const connection = { baseUrl: a.stack.gateway.url, apiKey: a.stack.apiKey };
  for (const offer of [impostor, honest]) await verifyOffer(connection, offer);
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

describe("logprob audits", () => {
  it("the gateway relays a provider's log-probabilities to its client, JSON and stream", async () => {
    const offers = await json(
      await fetch(`${a.gateway.url}/v1/models/${a.modelId}/offers`, {
        headers: { authorization: `Bearer ${a.stack.apiKey}` },
      }),
    );
    for (const offer of offers.data as { offer_id: string; verified_features: string[] }[])
      if ([honest, impostor].some((o) => o.toLowerCase() === offer.offer_id.toLowerCase()))
        expect(offer.verified_features).toContain("logprobs");

    const expected = greedy(sharpened(referenceDist, 0.5), {
      messages: [{ role: "user", content: "classify the sea" }],
      max_tokens: 64,
      top_logprobs: 3,
    });
    const res = await client();
    expect(res.status).toBe(200);
    const body = await json(res);
    const content = body.choices[0].logprobs.content as { token: string; logprob: number }[];
    expect(content.map((e) => e.token)).toEqual(expected.pieces);
    expect(content.map((e) => e.logprob)).toEqual(expected.values.map((v) => v.logprob));

    const streamed = await client({ stream: true });
    const events = sseData(await streamed.text());
    const tokens = events
      .filter((data) => data !== "[DONE]")
      .flatMap((data) => JSON.parse(data).choices?.[0]?.logprobs?.content ?? [])
      .map((e: { token: string }) => e.token);
    expect(tokens).toEqual(expected.pieces);
  });

  it(
    "excludes an offer whose answers match the anchor's but whose probabilities do not",
    {
      timeout: 600_000,
    },
    async () => {
      // The other two payers ask the same (an audit copies a framing three payers sent).
      for (const permitId of a.clientPermits.slice(1))
        expect((await client({}, permitId)).status).toBe(200);
      const runner = a.gateway.audits!;
      const outcomes: AuditOutcome[] = [];
      let verdicts = await runner.evaluate();
      for (let round = 0; round < 30; round += 1) {
        for (let i = 0; i < 40; i += 1) {
          vnow += 60_000;
          outcomes.push(await runner.runOnce());
        }
        verdicts = await runner.evaluate();
        if (verdicts.find((v) => v.offerId === impostor)?.state === "excluded") break;
      }
      const sent = outcomes.filter((o) => o.status === "sent");
      // The seeded run settles it after 4 rounds of 40: 102 audits sent, 43 of them logprob
      // challenges (a quarter of the audits of offers that expose log-probabilities), framed as
      // the clients' requests were.
      expect(outcomes.length).toBe(160);
      expect(sent.length).toBe(102);
      const challenges = sent.filter((o) => o.test === "logprob");
      expect(challenges.length).toBe(43);
      // No client asked at temperature 1: the MMD audits found no framing to copy.
      expect(outcomes.filter((o) => o.status === "no_shape").every((o) => o.test === "mmd")).toBe(
        true,
      );
      const bad = verdicts.find((v) => v.offerId === impostor)!;
      const anchor = verdicts.find((v) => v.offerId === honest)!;
      expect(bad.state).toBe("excluded");
      expect(anchor.state).toBe("passing");
      const byTest = new Map(bad.tests.map((t) => [t.test, t]));
      // The border probes saw the same first tokens: no evidence there.
      expect(byTest.get("border_probe")!.eValue).toBe(1);
      // The logprob test carried it: the sharpened model claims more confidence than the anchor.
      const logprob = byTest.get("logprob")!;
      expect(logprob.eValue).toBeGreaterThanOrEqual(bad.excludeAt);
      expect(logprob.statistic).toBeGreaterThan(0.07);
      expect(logprob.samples).toBe(14);
      // Each sample scored the first LOGPROB_TOKENS tokens of its answer (16 words).
      const stored = await a.stack.database.db.pool.query<{ prompt_id: string }>(
        "SELECT DISTINCT prompt_id FROM audit_samples WHERE test = 'logprob'",
      );
      expect(stored.rows.every((r) => r.prompt_id.endsWith(`#${LOGPROB_TOKENS}`))).toBe(true);
    },
  );
});

import { createHash } from "node:crypto";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Hex } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { auditDataDir } from "../src/adapters/audits/corpus.js";
import { mixSeed, seededRandom } from "../src/domain/audits/random.js";
import type { AuditOutcome, AuditRunner } from "../src/domain/audits/runner.js";
import type { OfferAuditVerdict } from "../src/domain/audits/types.js";
import { clientChat, startAuditStack, type AuditStack } from "./helpers/audits.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { secondChatOffer } from "./helpers/market.js";
import {
  createImpostorLm,
  createReferenceLm,
  promptOf,
  VOCAB,
  type NgramLm,
} from "./helpers/ngram-lm.js";
import { json } from "./helpers/stack.js";

/**
 * What a provider can do with the shipped corpus (issue 39, item 1: audits a provider cannot
 * tell from clients). The corpus ships in this repository, so a provider can read it and answer
 * from the model it sells exactly the requests whose prompt is in it, and from a cheaper one
 * everything else. On the shipped corpus the audits then see only honest answers: the gateway
 * says so at start (a warning, `gateway_audit_corpus_public 1`). With the operator's own corpus
 * (`AUDIT_CORPUS_DIR`) the same provider is caught.
 */

const fold = (text: string) => text.trim().replace(/\s+/g, " ").toLowerCase();

/** Every user turn of the shipped corpus, read as a provider would read it from the repository. */
async function shippedUserTurns(): Promise<Set<string>> {
  const corpus = JSON.parse(await readFile(`${auditDataDir}corpus.json`, "utf8")) as {
    prompts: { turns: { role: string; content: string }[] }[];
    probes: { turns: { role: string; content: string }[] }[];
  };
  const turns = new Set<string>();
  for (const p of [...corpus.prompts, ...corpus.probes])
    for (const t of p.turns) if (t.role === "user") turns.add(fold(t.content));
  return turns;
}

/**
 * The corpus-reading provider: the reference model for a prompt of the shipped corpus, the
 * impostor for any other. `answered` counts which model answered what.
 */
function corpusReader(reference: NgramLm, impostor: NgramLm, known: Set<string>, seed: number) {
  const answered = { reference: 0, impostor: 0 };
  let n = 0;
  const answer = (body: Record<string, unknown>): string[] => {
    const prompt = promptOf(body);
    const lm = known.has(fold(prompt)) ? reference : impostor;
    answered[lm === reference ? "reference" : "impostor"] += 1;
    const { tokens } = lm.generate(prompt, {
      temperature: Number(body.temperature ?? 1),
      maxTokens: Math.min(Number(body.max_completion_tokens ?? body.max_tokens ?? 32), 32),
      rng: seededRandom(mixSeed(seed, (n += 1))),
    });
    return tokens.map((t, i) => (i === 0 ? t : ` ${t}`));
  };
  return { answer, answered };
}

function honestly(lm: NgramLm, seed: number): (body: Record<string, unknown>) => string[] {
  let n = 0;
  return (body) =>
    lm
      .generate(promptOf(body), {
        temperature: Number(body.temperature ?? 1),
        maxTokens: Math.min(Number(body.max_completion_tokens ?? body.max_tokens ?? 32), 32),
        rng: seededRandom(mixSeed(seed, (n += 1))),
      })
      .tokens.map((t, i) => (i === 0 ? t : ` ${t}`));
}

/**
 * An operator's own corpus in `dir`: questions and short-answer probes of its own words (none
 * of the shipped corpus's), pinned by its manifest as the shipped one is.
 */
async function writeOwnCorpus(dir: string): Promise<void> {
  const user = (content: string) => [{ role: "user", content }];
  const corpus = {
    version: 1,
    prompts: Array.from({ length: 40 }, (_, i) => ({
      id: `own-${i}`,
      lang: "en",
      task: "question",
      turns: user(`Our team keeps asking about ${VOCAB[i]} ${VOCAB[i + 40]}`),
    })),
    probes: Array.from({ length: 60 }, (_, i) => ({
      id: `own-probe-${i}`,
      lang: "en",
      task: "probe",
      turns: user(`Answer with one word: what follows ${VOCAB[100 + i]}`),
    })),
    systems: { en: ["Keep answers short and plain."] },
  };
  const text = JSON.stringify(corpus, null, 2);
  const sha = createHash("sha256").update(text).digest("hex");
  await writeFile(join(dir, "corpus.json"), text);
  await writeFile(join(dir, "manifest.json"), JSON.stringify({ files: { "corpus.json": sha } }));
}

let a: AuditStack;
let honest: Hex;
let fakeHonest: FakeUpstream;
let reader: Hex;
let readerAnswered: { reference: number; impostor: number };
let ownDir: string;
let vnow = Date.UTC(2026, 10, 30, 12);
const day = 86_400_000;

async function clientRequests(): Promise<void> {
  // Clients of the model, at the audits' temperatures, from three payers (what audits copy).
  for (const permitId of a.clientPermits)
    for (const temperature of [0, 1]) {
      const res = await clientChat(a, permitId, {
        messages: [{ role: "user", content: "tell me something about the sea" }],
        temperature,
        max_tokens: 32,
        offer: reader,
      });
      expect(res.status).toBe(200);
      await res.text();
    }
}

/** Audits in rounds of 40, judged after each, until the reader is excluded or 10 rounds pass. */
async function auditRounds(runner: AuditRunner): Promise<{
  outcomes: AuditOutcome[];
  verdict: OfferAuditVerdict;
}> {
  const outcomes: AuditOutcome[] = [];
  let verdicts = await runner.evaluate();
  for (let round = 0; round < 10; round += 1) {
    for (let i = 0; i < 40; i += 1) {
      vnow += 60_000;
      outcomes.push(await runner.runOnce());
    }
    verdicts = await runner.evaluate();
    if (verdicts.find((v) => v.offerId === reader)?.state === "excluded") break;
  }
  return { outcomes, verdict: verdicts.find((v) => v.offerId === reader)! };
}

beforeAll(async () => {
  ownDir = await mkdtemp(join(tmpdir(), "gw-own-corpus-"));
  await writeOwnCorpus(ownDir);
  a = await startAuditStack({}, { rng: seededRandom(5), nowMs: () => vnow });
  reader = a.chatOffer;
  ({ b: honest, fakeB: fakeHonest } = await secondChatOffer(a.stack));
  const reference = createReferenceLm(901);
  const provider = corpusReader(
    reference,
    createImpostorLm(reference, 77),
    await shippedUserTurns(),
    1,
  );
  readerAnswered = provider.answered;
  a.fake.setOptions({ answer: provider.answer });
  fakeHonest.setOptions({ answer: honestly(reference, 2) });
}, 120_000);

afterAll(async () => {
  await a?.stack.close();
  await a?.fake.stop();
  await fakeHonest?.stop();
  if (ownDir !== undefined) await rm(ownDir, { recursive: true, force: true });
});

describe("a provider that reads the shipped corpus", () => {
  it("on the shipped corpus: answers every audit honestly and its clients from another model, and passes; the gateway warned the operator", async () => {
    const logged = a.stack.logs.lines.length;
    await a.restartWith(
      { anchors: new Map([[a.modelId, honest]]) },
      { rng: seededRandom(6), nowMs: () => vnow },
    );
    const warning = a.stack.logs.lines
      .slice(logged)
      .map((l) => JSON.parse(l) as { level: number; corpus?: string; msg: string })
      .filter((l) => l.corpus === "shipped");
    expect(warning.map((l) => [l.level, l.msg.split(":")[0]])).toEqual([
      [40, "audits ask the shipped corpus's prompts, which anyone can read"],
    ]);
    expect(await (await fetch(a.gateway.metricsUrl)).text()).toMatch(
      /^gateway_audit_corpus_public 1$/m,
    );
    // Clients and payers see it too: a passing status from a public corpus says little.
    expect((await json(await fetch(`${a.gateway.url}/v1/gateway`))).audit_corpus).toBe("shipped");

    await clientRequests();
    expect(readerAnswered).toEqual({ reference: 0, impostor: 6 });
    const { outcomes, verdict } = await auditRounds(a.gateway.audits!);
    expect(outcomes.length).toBe(400);
    const sentToReader = outcomes.filter((o) => o.status === "sent" && o.target.offerId === reader);
    expect(outcomes.every((o) => o.status === "sent")).toBe(true);
    // Ten rounds, never excluded; half the audits went to the reader (seeded).
    expect(sentToReader.length).toBe(209);
    // Every audit the reader received carried a prompt it had read: all answered honestly.
    expect(readerAnswered).toEqual({ reference: sentToReader.length, impostor: 6 });
    expect(verdict.state).toBe("passing");
  });

  it("with the operator's own corpus (AUDIT_CORPUS_DIR): it cannot tell the audits, answers them from the cheaper model, and is excluded", async () => {
    // Past the evidence window of the first test's samples: only this corpus's audits count.
    vnow += 2 * day;
    await a.restartWith(
      { anchors: new Map([[a.modelId, honest]]), corpusDir: ownDir, evidenceWindowDays: 1 },
      { rng: seededRandom(7), nowMs: () => vnow },
    );
    expect(await (await fetch(a.gateway.metricsUrl)).text()).toMatch(
      /^gateway_audit_corpus_public 0$/m,
    );
    expect((await json(await fetch(`${a.gateway.url}/v1/gateway`))).audit_corpus).toBe("operator");
    const before = { ...readerAnswered };
    await clientRequests();
    const { outcomes, verdict } = await auditRounds(a.gateway.audits!);
    const sentToReader = outcomes.filter((o) => o.status === "sent" && o.target.offerId === reader);
    // Excluded after nine rounds of 40 (seeded); the first test's 400 audits did not.
    expect(outcomes.length).toBe(360);
    expect(outcomes.every((o) => o.status === "sent")).toBe(true);
    expect(sentToReader.length).toBe(177);
    expect(readerAnswered).toEqual({
      reference: before.reference,
      impostor: before.impostor + 6 + sentToReader.length,
    });
    expect(verdict.state).toBe("excluded");
    expect(verdict.eValue).toBeGreaterThanOrEqual(verdict.excludeAt);
  });
});

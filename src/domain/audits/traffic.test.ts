import type { Hex } from "viem";
import { describe, expect, it } from "vitest";
import { loadAuditCorpus } from "../../adapters/audits/corpus.js";
import { parseChatRequest } from "../chat/request/index.js";
import { canonicalBody, dialects } from "../dialects/index.js";
import { createShapeSample, shapeOf, type RequestShape, type ShapeDialect } from "./shapes.js";
import { seededRandom } from "./random.js";
import type { AuditSample } from "./types.js";
import {
  answerText,
  auditBody,
  mmdPeriodMs,
  mmdPrompts,
  nextGapMs,
  logprobShare,
  pickAuditTest,
  pickShape,
  foundBorders,
  pickBorderPrompt,
} from "./traffic.js";

const bounds = { maxBytes: 1 << 20, maxDepth: 64, maxArrayItems: 10_000 };
const encoder = new TextEncoder();
const model = "demo-chat";
const modelId: Hex = `0x${"11".repeat(32)}`;

/** What the pipeline makes of a client's body: its canonical request, and its shape. */
function shapeOfBody(dialect: ShapeDialect, raw: string): RequestShape {
  const bytes = encoder.encode(raw);
  const body = dialect === "chat" ? bytes : canonicalBody(dialects[dialect], bytes, bounds).body;
  return shapeOf(parseChatRequest(body, bounds), dialect);
}

const clientBodies: [string, ShapeDialect, string][] = [
  [
    "chat, compact, parts",
    "chat",
    JSON.stringify({
      model,
      messages: [{ role: "user", content: [{ type: "text", text: "hi" }] }],
      temperature: 0,
      max_tokens: 64,
      seed: 123456,
    }),
  ],
  [
    "chat, Python-spaced, streamed",
    "chat",
    `{"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}], "model": "${model}", "temperature": 1, "top_p": 0.9, "stream": true, "stream_options": {"include_usage": true}}`,
  ],
  [
    "chat, Python-spaced, floats",
    "chat",
    `{"model": "${model}", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64, "temperature": 0.0, "top_p": 1.0}`,
  ],
  [
    "chat, pretty (4)",
    "chat",
    JSON.stringify({ model, temperature: 0, messages: [{ role: "user", content: "hi" }] }, null, 4),
  ],
  [
    "messages",
    "messages",
    JSON.stringify({
      model,
      max_tokens: 300,
      system: "Be brief.",
      messages: [{ role: "user", content: "hi" }],
      temperature: 1,
      stream: true,
    }),
  ],
  [
    "responses",
    "responses",
    JSON.stringify({
      model,
      input: [{ role: "user", content: [{ type: "input_text", text: "hi" }] }],
      temperature: 0,
      max_output_tokens: 100,
      reasoning: { effort: "low" },
    }),
  ],
];

describe("an audit framed as a client's request", async () => {
  const corpus = await loadAuditCorpus();

  it.each(clientBodies)(
    "%s: the audit's canonical request has the client's shape",
    (_name, dialect, raw) => {
      const client = shapeOfBody(dialect, raw);
      const rng = seededRandom(1);
      // A multi-turn prompt and a single one: the framing is the client's either way.
      for (const prompt of [corpus.prompts.find((p) => p.turns.length === 3)!, corpus.probes[0]!]) {
        const body = auditBody(corpus, rng, { shape: client, prompt, modelName: model });
        expect(body.dialect).toBe(dialect);
        const audit = shapeOfBody(dialect, new TextDecoder().decode(body.bytes));
        const { seed: clientSeed, ...clientParams } = client.params;
        const { seed: auditSeed, ...auditParams } = audit.params;
        expect({ ...audit, params: auditParams }).toEqual({ ...client, params: clientParams });
        // A seed is a fresh one of the same size, never the client's.
        if (clientSeed !== undefined) {
          expect(auditSeed).not.toBe(clientSeed);
          expect(String(auditSeed).length).toBe(String(clientSeed).length);
        }
      }
    },
  );

  it("a shape keeps no content: no text, no user, no tool, no stop string", () => {
    const raw = JSON.stringify({
      model,
      messages: [{ role: "user", content: "my secret text" }],
      user: "customer-4711",
      stop: ["SECRET-STOP"],
      tools: [{ type: "function", function: { name: "lookup_secret", parameters: {} } }],
      temperature: 0,
    });
    const shape = shapeOfBody("chat", raw);
    expect(JSON.stringify(shape)).not.toMatch(/secret|4711|SECRET/i);
    expect(shape.members).toEqual(["model", "messages", "user", "stop", "tools", "temperature"]);
    // Not copiable: an audit never takes this framing.
    expect(pickShape(seededRandom(1), [shape], "border_probe")).toBeUndefined();
  });

  it("picks only copiable shapes at the test's temperature", () => {
    const cold = shapeOfBody("chat", clientBodies[0]![2]);
    const warm = shapeOfBody("chat", clientBodies[1]![2]);
    const rng = seededRandom(2);
    for (let i = 0; i < 20; i += 1) {
      expect(pickShape(rng, [cold, warm], "border_probe")).toBe(cold);
      expect(pickShape(rng, [cold, warm], "mmd")).toBe(warm);
    }
    expect(pickShape(rng, [cold], "mmd")).toBeUndefined();
  });

  it("sends a logprob challenge only to an offer exposing logprobs, and only when a client's framing asked for them", () => {
    const cold = shapeOfBody("chat", clientBodies[0]![2]);
    const asking = shapeOfBody(
      "chat",
      JSON.stringify({
        model,
        messages: [{ role: "user", content: "x" }],
        temperature: 0,
        logprobs: true,
      }),
    );
    const target = {
      modelId: `0x${"ab".repeat(32)}` as Hex,
      modelName: model,
      offerId: `0x${"cd".repeat(32)}` as Hex,
      permitId: `0x${"ef".repeat(32)}` as Hex,
    };
    const tests = (logprobs: boolean, shapes: RequestShape[]) => {
      const rng = seededRandom(11);
      const drawn = Array.from({ length: 400 }, () =>
        pickAuditTest(rng, { ...target, logprobs }, shapes),
      );
      return drawn.filter((t) => t === "logprob").length;
    };
    // No client asked for log-probabilities: none of its audits is spent on a challenge that
    // would find no framing to copy.
    expect(tests(true, [cold])).toBe(0);
    // The offer exposes none: no challenge, whatever clients ask.
    expect(tests(false, [cold, asking])).toBe(0);
    // Both: about a quarter of its audits (logprobShare); with this seed, 118 of 400 draws.
    const share = tests(true, [cold, asking]);
    expect(share).toBe(118);
    expect(Math.abs(share / 400 - logprobShare)).toBeLessThan(0.05);
    expect(pickShape(seededRandom(3), [cold, asking], "logprob")).toBe(asking);
  });

  it("the sample keeps the last shapes of each model, never the auditor's own", () => {
    const sample = createShapeSample({ ignoredKey: () => "key_audit", size: 3 });
    const req = (t: number) =>
      parseChatRequest(
        encoder.encode(
          JSON.stringify({ model, messages: [{ role: "user", content: "x" }], temperature: t }),
        ),
        bounds,
      );
    const payer = (n: number): Hex => `0x${String(n).repeat(40)}`;
    // The first falls out of the sample; the auditor's own (temperature 0.5) is never in it.
    sample.observe(modelId, req(1), undefined, "key_client", payer(5));
    sample.observe(modelId, req(1), undefined, "key_client", payer(1));
    sample.observe(modelId, req(0.5), undefined, "key_audit", payer(4));
    sample.observe(modelId, req(1), undefined, "key_client", payer(2));
    sample.observe(modelId, req(1), undefined, "key_client", payer(3));
    sample.observe(`0x${"22".repeat(32)}`, req(0), undefined, "key_client", payer(6));
    expect(sample.shapes(modelId).map((s) => s.params["temperature"])).toEqual([1, 1, 1]);
  });

  it("MMD prompts are one draw per model and period, the same for every offer", () => {
    const now = 1_800_000_000_000;
    const a = mmdPrompts(corpus, modelId, now).map((p) => p.id);
    expect(a).toHaveLength(25);
    expect(new Set(a).size).toBe(25);
    expect(mmdPrompts(corpus, modelId, now + 1000).map((p) => p.id)).toEqual(a);
    expect(mmdPrompts(corpus, modelId, now + mmdPeriodMs).map((p) => p.id)).not.toEqual(a);
  });
});

describe("the audits' schedule", () => {
  it("gaps are exponential: the mean is a day over audits per offer per day times offers", () => {
    const rng = seededRandom(5);
    const n = 20_000;
    const gaps = Array.from({ length: n }, () => nextGapMs(rng, 100, 4));
    const mean = gaps.reduce((s, g) => s + g, 0) / n;
    expect(Math.abs(mean - 86_400_000 / 400) / (86_400_000 / 400)).toBeLessThan(0.03);
    // Memoryless: about e^-1 of the gaps are longer than the mean.
    const longer = gaps.filter((g) => g > 86_400_000 / 400).length / n;
    expect(Math.abs(longer - Math.exp(-1))).toBeLessThan(0.01);
    expect(nextGapMs(rng, 100, 0)).toBe(Number.POSITIVE_INFINITY);
  });
});

describe("the answer's text, as each dialect carries it", () => {
  it("reads chat, Messages and Responses events and JSON answers", () => {
    expect(answerText("chat", { choices: [{ delta: { content: "Hel" } }] })).toBe("Hel");
    expect(answerText("chat", { choices: [{ message: { content: "Hello" } }] })).toBe("Hello");
    expect(
      answerText(
        "messages",
        { type: "content_block_delta", delta: { text: "lo" } },
        "content_block_delta",
      ),
    ).toBe("lo");
    expect(
      answerText("messages", { type: "message", content: [{ type: "text", text: "Hi" }] }),
    ).toBe("Hi");
    expect(
      answerText(
        "responses",
        { type: "response.output_text.delta", delta: "Yo" },
        "response.output_text.delta",
      ),
    ).toBe("Yo");
    expect(
      answerText("responses", {
        object: "response",
        output: [{ type: "message", content: [{ type: "output_text", text: "Fine" }] }],
      }),
    ).toBe("Fine");
    expect(answerText("chat", { choices: [] })).toBe("");
  });
});

describe("border inputs found on the reference", () => {
  const probe = (promptId: string, text: string): AuditSample => ({
    offerId: `0x${"a".repeat(64)}` as Hex,
    modelId: `0x${"b".repeat(64)}` as Hex,
    test: "border_probe",
    promptId,
    text,
    atMs: 0,
  });

  it("a candidate whose temperature-0 answers began with two tokens, asked often enough, is a near-tie", () => {
    const samples = [
      // Asked 3 times, two first tokens: a near-tie.
      probe("p1", "Paris is"),
      probe("p1", "The capital"),
      probe("p1", "Paris, of course"),
      // Asked 3 times, one first token: not.
      probe("p2", "Blue sky"),
      probe("p2", "Blue"),
      probe("p2", "Blue, mostly"),
      // Two tokens but asked twice: not judged yet.
      probe("p3", "yes"),
      probe("p3", "no"),
      // A completion for MMD is not a probe.
      { ...probe("p4", "one"), test: "mmd" as const },
      { ...probe("p4", "two"), test: "mmd" as const },
      { ...probe("p4", "three"), test: "mmd" as const },
    ];
    expect([...foundBorders(samples)]).toEqual(["p1"]);
  });

  it("border probes mostly ask the near-ties found, and go on searching the other candidates", () => {
    const candidates = ["p1", "p2", "p3", "p4"].map((id) => ({ id, turns: [] }) as never);
    const rng = seededRandom(3);
    const asked = new Map<string, number>();
    for (let i = 0; i < 4000; i += 1) {
      const p = pickBorderPrompt(rng, candidates, new Set(["p2"])) as { id: string };
      asked.set(p.id, (asked.get(p.id) ?? 0) + 1);
    }
    // 75 % from the near-ties, the other 25 % spread over every candidate (p2 among them).
    const share = (id: string) => asked.get(id)! / 4000;
    expect(share("p2")).toBeGreaterThan(0.78);
    expect(share("p2")).toBeLessThan(0.84);
    for (const id of ["p1", "p3", "p4"]) expect(share(id)).toBeGreaterThan(0.04);
    // Nothing found yet: every candidate alike, and no draw spent on the choice.
    const a = seededRandom(9);
    const b = seededRandom(9);
    expect(pickBorderPrompt(a, candidates, new Set())).toBe(
      pickBorderPrompt(b, candidates, undefined),
    );
  });
});

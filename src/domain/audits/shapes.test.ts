import type { Hex } from "viem";
import { describe, expect, it } from "vitest";
import { loadAuditCorpus } from "../../adapters/audits/corpus.js";
import { parseChatRequest } from "../chat/request/index.js";
import { seededRandom } from "./random.js";
import { copiableShapes, createShapeSample, shapeOf, type ObservedShape } from "./shapes.js";
import { auditBody, pickShape, pickTest } from "./traffic.js";

/**
 * Issue 39: a provider that is also a client plants a marker (a value, an order of members, a
 * layout no one else sends) for the audits to copy. An audit copies a value only when it is
 * common or three payers sent it, and a whole shape only when three payers sent it.
 */

const bounds = { maxBytes: 1 << 20, maxDepth: 64, maxArrayItems: 10_000 };
const encoder = new TextEncoder();
const decoder = new TextDecoder();
const model = "demo-chat";
const modelId: Hex = `0x${"11".repeat(32)}`;
const honest = ["0xaa", "0xbb", "0xcc"];
const provider = "0xdd";

function observed(payer: string, body: Record<string, unknown>, indent = 0): ObservedShape {
  const raw = indent === 0 ? JSON.stringify(body) : JSON.stringify(body, null, indent);
  return { shape: shapeOf(parseChatRequest(encoder.encode(raw), bounds), "chat"), payer };
}

const messages = [{ role: "user", content: "hi" }];
const fromAll = (body: Record<string, unknown>) => honest.map((p) => observed(p, body));
const params = (sample: readonly ObservedShape[]) =>
  copiableShapes(sample).map((s) => ({ ...s.params }));

describe("a provider's marker never reaches an audit", async () => {
  const corpus = await loadAuditCorpus();

  it("a value one payer sent, however often, is made common in every audit body", () => {
    const sample = [
      ...fromAll({ model, messages, temperature: 0, max_tokens: 4096 }),
      ...fromAll({ model, messages, temperature: 1, top_p: 0.9 }),
      ...Array.from({ length: 20 }, () =>
        observed(provider, { model, messages, temperature: 0, max_tokens: 4093 }),
      ),
      ...Array.from({ length: 20 }, () =>
        observed(provider, { model, messages, temperature: 1, top_p: 0.9123 }),
      ),
    ];
    const shapes = copiableShapes(sample);
    expect(shapes).toHaveLength(46);
    const rng = seededRandom(39);
    const sent = new Set<string>();
    for (let i = 0; i < 400; i += 1) {
      const shape = pickShape(rng, shapes, pickTest(rng))!;
      const prompt = corpus.prompts[i % corpus.prompts.length]!;
      const bytes = auditBody(corpus, rng, { shape, prompt, modelName: model }).bytes;
      const { max_tokens, top_p } = JSON.parse(decoder.decode(bytes)) as Record<string, unknown>;
      sent.add(JSON.stringify({ max_tokens, top_p }));
    }
    // The provider's requests became the honest framings (4093 the nearest 4096, 0.9123 the
    // nearest 0.9): they count among them, and carry nothing of the provider's own.
    expect(sent).toEqual(new Set(['{"max_tokens":4096}', '{"top_p":0.9}']));
  });

  it("a value three payers sent is copied as it is; two payers' is made common", () => {
    const three = fromAll({ model, messages, temperature: 0.45, max_tokens: 1200 });
    expect(params(three)).toEqual(Array(3).fill({ temperature: 0.45, max_tokens: 1200 }));
    const two = three.slice(1);
    // The nearest common values: 0.5 (0.3 is further), 1024 (1000 is further).
    const made = { temperature: 0.5, max_tokens: 1024 };
    expect(params([...two, ...fromAll({ model, messages, ...made })])).toEqual(Array(5).fill(made));
    // Made common, but no one else sends what it became: not copied either.
    expect(params(two)).toEqual([]);
  });

  it("the temperature a test needs is reached by the nearest common value, never lost", () => {
    const sample = [
      ...fromAll({ model, messages, temperature: 1, max_tokens: 256 }),
      observed(provider, { model, messages, temperature: 0.97, max_tokens: 256 }),
      observed(provider, { model, messages, temperature: 0.03, max_tokens: 256 }),
    ];
    const shapes = copiableShapes(sample);
    expect(shapes.map((s) => s.params["temperature"])).toEqual([1, 1, 1, 1]);
    expect(pickShape(seededRandom(1), shapes, "border_probe")).toBeUndefined();
  });

  it("a value with no nearest (a string, a boolean) from one payer leaves its shape uncopied", () => {
    const base = { model, messages, temperature: 0 };
    expect(
      params([
        ...fromAll(base),
        observed(provider, { ...base, reasoning_effort: "minimal" }),
        observed(provider, { ...base, logprobs: true }),
      ]),
    ).toEqual(Array(3).fill({ temperature: 0 }));
    expect(params(fromAll({ ...base, reasoning_effort: "minimal" }))).toEqual(
      Array(3).fill({ temperature: 0, reasoning_effort: "minimal" }),
    );
  });

  it("a seed's length is what is counted: one payer's length is not copied", () => {
    const base = { model, messages, temperature: 0 };
    const sample = [
      ...honest.map((p, i) => observed(p, { ...base, seed: 1000 + i })),
      observed(provider, { ...base, seed: 1_234_567_890_123 }),
    ];
    expect(copiableShapes(sample).map((s) => s.params["seed"])).toEqual([1000, 1001, 1002]);
  });

  it("a combination of common values, an order of members, a layout: one payer's is not copied", () => {
    const values = { temperature: 0, max_tokens: 512 };
    const base = { model, messages, ...values };
    const sample = [
      ...fromAll(base),
      ...fromAll({ model, messages, temperature: 1, top_p: 0.5 }),
      ...fromAll({ model, messages, temperature: 0.3, max_tokens: 700 }),
      // Each value is common, and each is also sent by the honest payers; together, only by it.
      observed(provider, { model, messages, temperature: 1, top_p: 0.5, max_tokens: 700 }),
      // The honest members and values in an order of its own.
      observed(provider, { messages, model, max_tokens: 512, temperature: 0 }),
      // The honest body, indented by three.
      observed(provider, base, 3),
      // The honest body, from the provider: one more of the honest shape.
      observed(provider, base),
    ];
    const shapes = copiableShapes(sample);
    expect(shapes.map((s) => [s.members.join(","), s.layout.kind, { ...s.params }])).toEqual([
      ...Array(3).fill(["model,messages,temperature,max_tokens", "compact", values]),
      ...Array(3).fill([
        "model,messages,temperature,top_p",
        "compact",
        { temperature: 1, top_p: 0.5 },
      ]),
      ...Array(3).fill([
        "model,messages,temperature,max_tokens",
        "compact",
        { temperature: 0.3, max_tokens: 700 },
      ]),
      ["model,messages,temperature,max_tokens", "compact", values],
    ]);
  });

  it("a whole number written as a float (`1.0`) is copied as written, and one payer's way of writing it is not", () => {
    const python = (payer: string, temperature: string) => ({
      shape: shapeOf(
        parseChatRequest(
          encoder.encode(
            `{"model": "${model}", "messages": [{"role": "user", "content": "hi"}], "temperature": ${temperature}}`,
          ),
          bounds,
        ),
        "chat",
      ),
      payer,
    });
    // Three payers write 1.0 (Python floats): audits write 1.0 too, as their bodies' bytes show.
    const floats = copiableShapes(honest.map((p) => python(p, "1.0")));
    expect(floats.map((s) => s.floats)).toEqual([
      ["temperature"],
      ["temperature"],
      ["temperature"],
    ]);
    const bytes = auditBody(corpus, seededRandom(5), {
      shape: floats[0]!,
      prompt: corpus.probes[0]!,
      modelName: model,
    }).bytes;
    expect(decoder.decode(bytes)).toMatch(/, "temperature": 1\.0\}$/);
    // Three write 1, the provider alone 1e0: its framing is not copied.
    const mixed = copiableShapes([...honest.map((p) => python(p, "1")), python(provider, "1e0")]);
    expect(mixed.map((s) => s.floats)).toEqual([undefined, undefined, undefined]);
  });

  it("payers are counted, not API keys: one payer's three keys are one", () => {
    const sample = createShapeSample({ ignoredKey: () => "key_audit" });
    const req = parseChatRequest(
      encoder.encode(JSON.stringify({ model, messages, temperature: 0.45 })),
      bounds,
    );
    const payer = (c: string): Hex => `0x${c.repeat(40)}`;
    for (const key of ["k1", "k2", "k3"]) sample.observe(modelId, req, undefined, key, payer("a"));
    expect(sample.shapes(modelId)).toEqual([]);
    // Two more payers (through one key, and the address as a wallet writes it): three payers.
    sample.observe(modelId, req, undefined, "k1", payer("b"));
    sample.observe(modelId, req, undefined, "k1", payer("C"));
    sample.observe(modelId, req, undefined, "k1", payer("c"));
    expect(sample.shapes(modelId).map((s) => s.params["temperature"])).toEqual(Array(6).fill(0.45));
  });
});

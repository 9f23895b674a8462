import { createHash } from "node:crypto";
import { cp, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Hex } from "viem";
import { afterAll, describe, expect, it } from "vitest";
import {
  auditDataDir,
  loadAuditCorpus,
  loadOperatorCorpus,
} from "../src/adapters/audits/corpus.js";
import { insertAuditSample } from "../src/adapters/pg/audit-traffic.js";
import { runAuditsExport } from "../src/cli/audits-export.js";
import type { AuditTestName } from "../src/domain/audits/types.js";
import { useTestDatabase } from "./helpers/db.js";

/**
 * Issue 39: an operator with an anchor exports the model's reference (border inputs found on it,
 * the median of its logprob scores) as corpus files, so a gateway without an anchor ships them.
 * The attack: a reference that is not the anchor's (another offer's samples mixed in), values
 * one faulty answer moves, files whose bytes (and so their pins) change with nothing measured
 * changing, or a file the loader then reads differently from what was exported.
 */

const hex = (n: number): Hex => `0x${n.toString(16).padStart(64, "0")}`;
const model = hex(0x39);
const anchor = hex(0xa1);
const other = hex(0xb2);
const sha = (text: string) => createHash("sha256").update(text, "utf8").digest("hex");
const dirs: string[] = [];

afterAll(async () => {
  for (const dir of dirs) await rm(dir, { recursive: true, force: true });
});

async function tempDir(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "gw-audit-export-"));
  dirs.push(dir);
  return dir;
}

async function run(
  db: Parameters<typeof runAuditsExport>[0],
  args: string[],
  env: Record<string, string>,
) {
  const out: string[] = [];
  const error: string[] = [];
  const code = await runAuditsExport(db, args, env, {
    out: (l) => out.push(l),
    error: (l) => error.push(l),
  });
  return { code, out, error };
}

const expectedBorders = `{
  "modelId": "${model}",
  "prompts": [
    {
      "id": "en-probe-01",
      "lang": "en",
      "task": "probe",
      "turns": [
        {
          "content": "Name one primary color. Answer with one word.",
          "role": "user"
        }
      ]
    }
  ]
}
`;

const expectedReference = `{
  "logprobs": {
    "en-question-01#8": -0.3,
    "en-question-02#8": -0.225,
    "en-question-04#8": 0,
    "en-question-05#8": -0.123457
  },
  "modelId": "${model}"
}
`;

describe("gateway audits export-reference", () => {
  const test = useTestDatabase();
  let atMs = 1_000;

  async function add(
    offerId: Hex,
    testName: AuditTestName,
    promptId: string,
    value: string | number,
  ) {
    await insertAuditSample(test.db.pool, {
      modelId: model,
      offerId,
      test: testName,
      promptId,
      ...(typeof value === "string" ? { text: value } : { meanLogprob: value }),
      atMs: atMs++,
    });
  }

  it("refuses a model without an anchor, and an anchor with too few samples", async () => {
    const none = await run(test.db.pool, ["--model", model, "--out", await tempDir()], {});
    expect(none.code).toBe(1);
    expect(none.error).toEqual([
      `model ${model} has no anchor (AUDIT_ANCHORS): only an anchor's samples are a reference to ship`,
    ]);
    // Two answers of a candidate, two scores of a sequence: not yet a border, not yet a value.
    await add(anchor, "border_probe", "en-probe-03", "Red");
    await add(anchor, "border_probe", "en-probe-03", "Blue");
    await add(anchor, "logprob", "en-question-03#5", -0.4);
    await add(anchor, "logprob", "en-question-03#5", -0.2);
    const out = await tempDir();
    const few = await run(test.db.pool, ["--model", model, "--out", out], {
      AUDIT_ANCHORS: `${model}=${anchor}`,
    });
    expect(few.code).toBe(1);
    expect(few.error).toEqual([
      `too few samples of anchor ${anchor} for model ${model}: no border input found and no logprob sequence with 3 finite scores; let the audits run longer`,
    ]);
  });

  it("writes the anchor's borders and median scores byte-stably, and the corpus loader reads them back", async () => {
    // A near-tie on the anchor (two first tokens in three answers), and a candidate it always
    // answers alike; another offer's ties and scores are not the reference.
    for (const text of ["Red", "Blue", "Red."])
      await add(anchor, "border_probe", "en-probe-01", text);
    for (const text of ["7", "7", "7"]) await add(anchor, "border_probe", "en-probe-02", text);
    for (const text of ["x", "y", "z"]) await add(other, "border_probe", "en-probe-04", text);
    // A faulty answer (-Infinity) is left out; the median of the rest, not their mean.
    for (const v of [-0.5, -0.1, Number.NEGATIVE_INFINITY, -0.3])
      await add(anchor, "logprob", "en-question-01#8", v);
    for (const v of [-5, -5, -5]) await add(other, "logprob", "en-question-01#8", v);
    for (const v of [-0.25, -0.2, -0.3, -0.1]) await add(anchor, "logprob", "en-question-02#8", v);
    // Values above 0 by an endpoint's rounding ship as 0; six decimals kept.
    for (const v of [0.0004, 0.0005, 0.0002]) await add(anchor, "logprob", "en-question-04#8", v);
    for (const v of [-0.1234567, -0.1234567, -0.1234567])
      await add(anchor, "logprob", "en-question-05#8", v);

    const catalog = join(await tempDir(), "catalog.json");
    await writeFile(catalog, JSON.stringify({ models: [{ id: "demo-chat", modelId: model }] }));
    const env = { AUDIT_ANCHORS: `${model}=${anchor}`, CATALOG_FILE: catalog };
    const out = await tempDir();
    const done = await run(test.db.pool, ["--model", "demo-chat", "--out", out], env);
    expect(done.error).toEqual([]);
    expect(done.code).toBe(0);
    const borders = await readFile(join(out, "borders", `${model}.json`), "utf8");
    const reference = await readFile(join(out, "reference", `${model}.json`), "utf8");
    expect(borders).toBe(expectedBorders);
    expect(reference).toBe(expectedReference);
    // Pinned digits: the same samples give these bytes on every machine and every run.
    const bordersSha = "8e9bb8776b1285563e35f5d6308e1fed1aedcd563c99ac3e442a22b56e909e15";
    const referenceSha = "01b196dfc23cb5b43c92fd83aa983609c6724b5e02e8e68e487044b09785a8a2";
    expect([sha(borders), sha(reference)]).toEqual([bordersSha, referenceSha]);
    expect(done.out).toEqual([
      `model ${model}, anchor ${anchor}: 1 border inputs, 4 logprob sequences`,
      `borders/${model}.json\tsha256 ${bordersSha}`,
      `reference/${model}.json\tsha256 ${referenceSha}`,
      `add to the "files" of manifest.json (files under ${out}):`,
      `  "borders/${model}.json": "${bordersSha}"`,
      `  "reference/${model}.json": "${referenceSha}"`,
    ]);
    const again = await run(test.db.pool, ["--model", model, "--out", await tempDir()], env);
    expect(again.out.slice(1, 3)).toEqual(done.out.slice(1, 3));

    // Shipped: the corpus loader, given a manifest that pins them, reads what was exported.
    const data = await tempDir();
    await cp(auditDataDir, data, { recursive: true });
    await cp(join(out, "borders"), join(data, "borders"), { recursive: true });
    await cp(join(out, "reference"), join(data, "reference"), { recursive: true });
    const manifest = JSON.parse(await readFile(join(data, "manifest.json"), "utf8")) as {
      files: Record<string, string>;
    };
    manifest.files[`borders/${model}.json`] = bordersSha;
    manifest.files[`reference/${model}.json`] = referenceSha;
    await writeFile(join(data, "manifest.json"), JSON.stringify(manifest));
    const corpus = await loadAuditCorpus(`${data}/`);
    const probe = corpus.probes.find((p) => p.id === "en-probe-01");
    expect(corpus.borders.get(model)).toEqual([probe]);
    expect(corpus.referenceLogprobs.get(model)).toEqual(
      new Map([
        ["en-question-01#8", -0.3],
        ["en-question-02#8", -0.225],
        ["en-question-04#8", 0],
        ["en-question-05#8", -0.123457],
      ]),
    );
  });

  it("with AUDIT_CORPUS_DIR, exports the border inputs of the operator's corpus, which it then reads back", async () => {
    // The operator's corpus: its audits' samples name its prompts, not the shipped ones.
    const dir = await tempDir();
    const prompt = (id: string, task: string, content: string) => ({
      id,
      lang: "en",
      task,
      turns: [{ role: "user", content }],
    });
    const corpus = JSON.stringify({
      prompts: Array.from({ length: 25 }, (_, i) => prompt(`own-q${i}`, "question", `Q ${i}?`)),
      probes: [prompt("own-p0", "probe", "Heads or tails? One word.")],
      systems: { en: ["Answer in one short line."] },
    });
    const manifest = { files: { "corpus.json": sha(corpus) } as Record<string, string> };
    await writeFile(join(dir, "corpus.json"), corpus);
    await writeFile(join(dir, "manifest.json"), JSON.stringify(manifest));
    for (const text of ["Heads", "Tails", "Heads"])
      await add(anchor, "border_probe", "own-p0", text);

    const env = { AUDIT_ANCHORS: `${model}=${anchor}`, AUDIT_CORPUS_DIR: dir };
    const done = await run(test.db.pool, ["--model", model, "--out", dir], env);
    expect(done.error).toEqual([]);
    expect(done.code).toBe(0);
    // The anchor's scores of the shipped corpus's sequences (the test above) name prompts this
    // corpus does not state: no audit of it asks them, they are left out.
    expect(done.out[0]).toBe(
      `model ${model}, anchor ${anchor}: 1 border inputs, 0 logprob sequences`,
    );
    const file = `borders/${model}.json`;
    const bordersSha = sha(await readFile(join(dir, file), "utf8"));
    expect(done.out[1]).toBe(`${file}\tsha256 ${bordersSha}`);
    manifest.files[file] = bordersSha;
    await writeFile(join(dir, "manifest.json"), JSON.stringify(manifest));
    const loaded = await loadOperatorCorpus(dir);
    expect(loaded.borders.get(model)?.map((p) => p.id)).toEqual(["own-p0"]);
  });
});

import { createHash } from "node:crypto";
import { cp, mkdtemp, mkdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { auditDataDir, AuditCorpusError, loadAuditCorpus, loadOperatorCorpus } from "./corpus.js";

const sha = (text: string) => createHash("sha256").update(text).digest("hex");
const dirs: string[] = [];

/** A copy of the shipped data in a temporary folder (ends with a slash, as auditDataDir). */
async function copy(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "gw-audit-corpus-"));
  dirs.push(dir);
  await cp(auditDataDir, dir, { recursive: true });
  return `${dir}/`;
}

afterAll(async () => {
  for (const dir of dirs) await rm(dir, { recursive: true, force: true });
});

describe("the shipped audit corpus", () => {
  it("holds a few hundred varied prompts: six languages and more, every task", async () => {
    const corpus = await loadAuditCorpus();
    expect(corpus.prompts.length + corpus.probes.length).toBeGreaterThanOrEqual(280);
    const langs = new Set(corpus.prompts.map((p) => p.lang));
    for (const lang of ["en", "es", "fr", "de", "zh", "ja"]) expect(langs).toContain(lang);
    const tasks = new Set(corpus.prompts.map((p) => p.task));
    for (const task of ["question", "summarise", "code", "rewrite", "chat", "extract"])
      expect(tasks).toContain(task);
    // Chat with history: user, assistant, user.
    expect(corpus.prompts.filter((p) => p.turns.length === 3).length).toBeGreaterThanOrEqual(20);
    const ids = [...corpus.prompts, ...corpus.probes].map((p) => p.id);
    expect(new Set(ids).size).toBe(ids.length);
    // Nothing in it names what it is for.
    expect(JSON.stringify(corpus.prompts)).not.toMatch(/audit|gateway|canary|probe/i);
    for (const lang of ["en", "es", "fr", "de", "zh", "ja"])
      expect(corpus.systems[lang]!.length).toBeGreaterThan(0);
  });

  it("is pinned: a changed byte stops the load", async () => {
    const dir = await copy();
    const text = await readFile(`${dir}corpus.json`, "utf8");
    await writeFile(`${dir}corpus.json`, text.replace("Why is the sky blue", "Why is the sky red"));
    await expect(loadAuditCorpus(dir)).rejects.toThrow(AuditCorpusError);
    await expect(loadAuditCorpus(dir)).rejects.toThrow(
      /has sha256 [0-9a-f]{64}, its manifest pins/,
    );
  });

  it("reads a model's border inputs and reference values when the manifest pins them, and no unpinned file", async () => {
    const dir = await copy();
    const modelId = `0x${"ab".repeat(32)}`;
    await mkdir(`${dir}borders`);
    await mkdir(`${dir}reference`);
    const borders = JSON.stringify({
      modelId,
      prompts: [
        {
          id: "b1",
          lang: "en",
          task: "probe",
          turns: [{ role: "user", content: "Pick: A or B?" }],
        },
      ],
    });
    const reference = JSON.stringify({ modelId, logprobs: { "seq-1": -1.25 } });
    await writeFile(`${dir}borders/${modelId}.json`, borders);
    await writeFile(`${dir}reference/${modelId}.json`, reference);
    const manifest = JSON.parse(await readFile(`${dir}manifest.json`, "utf8")) as {
      files: Record<string, string>;
    };
    // Unpinned: not read.
    expect((await loadAuditCorpus(dir)).borders.size).toBe(0);
    manifest.files[`borders/${modelId}.json`] = sha(borders);
    manifest.files[`reference/${modelId}.json`] = sha(reference);
    await writeFile(`${dir}manifest.json`, JSON.stringify(manifest));
    const corpus = await loadAuditCorpus(dir);
    expect(corpus.borders.get(modelId as `0x${string}`)?.map((p) => p.id)).toEqual(["b1"]);
    expect([...corpus.referenceLogprobs.get(modelId as `0x${string}`)!]).toEqual([
      ["seq-1", -1.25],
    ]);
  });
});

/** An operator's corpus folder: `prompts` questions and `probes` probes, pinned (no slash). */
async function ownCorpus(
  prompts: number,
  probes: number,
  edit: (corpus: {
    prompts: { id: string; turns: { role: string; content: string }[] }[];
  }) => void = () => {},
): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "gw-own-corpus-"));
  dirs.push(dir);
  const prompt = (id: string, content: string) => ({
    id,
    lang: "en",
    task: "question",
    turns: [{ role: "user", content }],
  });
  const corpus = {
    prompts: Array.from({ length: prompts }, (_, i) =>
      prompt(`q${i}`, `Our question number ${i}?`),
    ),
    probes: Array.from({ length: probes }, (_, i) =>
      prompt(`p${i}`, `Pick one: ${i} or ${i + 1}?`),
    ),
    systems: { en: ["Be brief."] },
  };
  edit(corpus);
  const text = JSON.stringify(corpus);
  await writeFile(join(dir, "corpus.json"), text);
  await writeFile(
    join(dir, "manifest.json"),
    JSON.stringify({ files: { "corpus.json": sha(text) } }),
  );
  return dir;
}

describe("an operator's own corpus (AUDIT_CORPUS_DIR)", () => {
  it("is read from its folder, pinned by its own manifest; without one the shipped corpus is used", async () => {
    const own = await loadOperatorCorpus(await ownCorpus(25, 1));
    expect(own.prompts.map((p) => p.id)).toEqual(Array.from({ length: 25 }, (_, i) => `q${i}`));
    expect(own.probes.map((p) => p.id)).toEqual(["p0"]);
    expect(await loadOperatorCorpus(undefined)).toEqual(await loadAuditCorpus());
  });

  it("refuses a user turn of the shipped corpus, whatever its spaces and case: a provider reads those here", async () => {
    const shipped = await loadAuditCorpus();
    const copied = shipped.prompts[3]!.turns[0]!.content;
    const dir = await ownCorpus(30, 2, (c) => {
      c.prompts[7]!.turns[0]!.content = `  ${copied.toUpperCase().replace(/ /g, "   ")} `;
    });
    await expect(loadOperatorCorpus(dir)).rejects.toThrow(AuditCorpusError);
    await expect(loadOperatorCorpus(dir)).rejects.toThrow(
      `AUDIT_CORPUS_DIR: 1 text(s) are the shipped corpus's (q7, as shipped ${shipped.prompts[3]!.id})`,
    );
  });

  it("refuses a system message of the shipped corpus: an audit sends it as the client's", async () => {
    const system = (await loadAuditCorpus()).systems["fr"]![1]!;
    const dir = await ownCorpus(25, 1, (c) => {
      (c as { systems?: Record<string, string[]> }).systems = { en: ["Be brief.", system] };
    });
    await expect(loadOperatorCorpus(dir)).rejects.toThrow(
      "AUDIT_CORPUS_DIR: 1 text(s) are the shipped corpus's (systems.en[1], as shipped systems.fr[1])",
    );
  });

  it("refuses prompts no system message can frame: none of their own, none for their language or English", async () => {
    const dir = await ownCorpus(25, 1, (c) => {
      (c as { systems?: Record<string, string[]> }).systems = { de: ["Antworte kurz."] };
    });
    await expect(loadOperatorCorpus(dir)).rejects.toThrow(
      "corpus.json: prompt q0 has no system message, and systems has none for en (an audit copying a framing with a system message needs one)",
    );
  });

  it("refuses a folder without a manifest, naming the file", async () => {
    const dir = await mkdtemp(join(tmpdir(), "gw-own-corpus-"));
    dirs.push(dir);
    await expect(loadOperatorCorpus(dir)).rejects.toThrow(
      `cannot read the audit corpus manifest ${dir}/manifest.json: ENOENT`,
    );
  });

  it("refuses too few prompts for an MMD period (25), no probe, or an id used twice", async () => {
    await expect(loadOperatorCorpus(await ownCorpus(24, 1))).rejects.toThrow(
      "corpus.json has 24 prompts and 1 probes: the audits need at least 25 prompts and 1 probe",
    );
    await expect(loadOperatorCorpus(await ownCorpus(25, 0))).rejects.toThrow(
      "corpus.json has 25 prompts and 0 probes",
    );
    await expect(
      loadOperatorCorpus(await ownCorpus(26, 1, (c) => (c.prompts[5]!.id = "q2"))),
    ).rejects.toThrow("corpus.json: prompt id q2 is used twice");
  });
});

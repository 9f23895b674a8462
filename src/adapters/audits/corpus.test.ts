import { createHash } from "node:crypto";
import { cp, mkdtemp, mkdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { auditDataDir, AuditCorpusError, loadAuditCorpus } from "./corpus.js";

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

import { createHash } from "node:crypto";
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { ReferenceExport } from "../../domain/audits/reference-export.js";
import type { CorpusPrompt } from "../../domain/audits/traffic.js";

/**
 * The files a model's exported reference ships as (corpus.ts: `borders/<ModelID>.json`,
 * `reference/<ModelID>.json`), byte-stable: keys sorted at every level, two-space indent, one
 * final newline, numbers as JavaScript prints them (shortest round trip, already rounded by the
 * export). The same samples give the same bytes, so the same SHA-256 in every manifest.
 */

type Json = string | number | boolean | null | readonly Json[] | { readonly [key: string]: Json };

function sorted(value: Json): Json {
  if (value === null || typeof value !== "object") return value;
  if (Array.isArray(value)) return (value as readonly Json[]).map(sorted);
  const out: Record<string, Json> = {};
  const record = value as { readonly [key: string]: Json };
  for (const key of Object.keys(record).sort()) out[key] = sorted(record[key]!);
  return out;
}

/** `value` as the bytes a shipped file holds. */
export function stableJson(value: Json): string {
  return `${JSON.stringify(sorted(value), null, 2)}\n`;
}

function promptJson(p: CorpusPrompt): Json {
  return {
    id: p.id,
    lang: p.lang,
    task: p.task,
    ...(p.system === undefined ? {} : { system: p.system }),
    turns: p.turns.map((t) => ({ role: t.role, content: t.content })),
  };
}

export interface ReferenceFile {
  /** Its path under the data folder, as the manifest names it. */
  readonly file: string;
  readonly text: string;
  readonly sha256: string;
}

/**
 * The files of an export: `borders/` when a border input was found, `reference/` when a
 * sequence has a value; none is made empty (the model would then audit as if it had none).
 */
export function referenceFiles(data: ReferenceExport): ReferenceFile[] {
  const files: { file: string; value: Json }[] = [];
  if (data.borders.length > 0)
    files.push({
      file: `borders/${data.modelId}.json`,
      value: { modelId: data.modelId, prompts: data.borders.map(promptJson) },
    });
  if (data.logprobs.size > 0)
    files.push({
      file: `reference/${data.modelId}.json`,
      value: { modelId: data.modelId, logprobs: Object.fromEntries(data.logprobs) },
    });
  return files.map(({ file, value }) => {
    const text = stableJson(value);
    return { file, text, sha256: createHash("sha256").update(text, "utf8").digest("hex") };
  });
}

/** Writes `files` under `dir` (their folders made as needed). */
export async function writeReferenceFiles(
  dir: string,
  files: readonly ReferenceFile[],
): Promise<void> {
  for (const f of files) {
    const path = join(dir, f.file);
    await mkdir(join(path, ".."), { recursive: true });
    await writeFile(path, f.text, "utf8");
  }
}

import { parseArgs } from "node:util";
import type { Hex } from "viem";
import { loadOperatorCorpus } from "../adapters/audits/corpus.js";
import { referenceFiles, writeReferenceFiles } from "../adapters/audits/reference-files.js";
import { loadCatalogFile } from "../adapters/catalog-file.js";
import { auditSamplesSince } from "../adapters/pg/audit-traffic.js";
import type { Queryable } from "../adapters/pg/catalog.js";
import { parseAuditAnchors, parseAuditCorpusDir } from "../config/audits.js";
import type { Env } from "../config/read.js";
import { exportReference, referenceMinSamples } from "../domain/audits/reference-export.js";
import { ModelDirectory } from "../domain/catalog.js";

/**
 * `gateway audits export-reference --model MODEL [--out DIR]` (issue 39): a model's reference
 * data measured on its anchor (AUDIT_ANCHORS), as the files a gateway without an anchor ships
 * (src/adapters/audits/corpus.ts): the border inputs found on the anchor and the median of its
 * logprob scores per sequence (src/domain/audits/reference-export.ts). Reads the samples every
 * gateway process stored (audit_samples, migration 043); writes `borders/<ModelID>.json` and
 * `reference/<ModelID>.json` under DIR (the current folder by default) and prints their SHA-256
 * and the manifest lines that pin them.
 */

export const auditsExportUsage = "audits export-reference --model MODEL [--out DIR]";

export interface AuditsExportIo {
  readonly out: (line: string) => void;
  readonly error: (line: string) => void;
}

/** MODEL as typed: a ModelID, or a public id or alias of the catalog file (CATALOG_FILE). */
async function resolveModel(model: string, env: Env): Promise<Hex | undefined> {
  const file = env["CATALOG_FILE"];
  const directory = new ModelDirectory(file ? await loadCatalogFile(file) : []);
  return directory.resolve(model);
}

/**
 * Writes the files and prints what to pin; returns the exit status (1: refused, nothing
 * written). Throws RangeError on usage.
 */
export async function runAuditsExport(
  db: Queryable,
  args: string[],
  env: Env,
  io: AuditsExportIo,
): Promise<number> {
  let parsed;
  try {
    parsed = parseArgs({
      args,
      allowPositionals: true,
      options: { model: { type: "string" }, out: { type: "string" } },
    });
  } catch (error) {
    throw new RangeError(`${(error as Error).message}; usage: gateway ${auditsExportUsage}`);
  }
  const { values, positionals } = parsed;
  if (values.model === undefined || positionals.length > 0)
    throw new RangeError(`usage: gateway ${auditsExportUsage}`);
  const modelId = await resolveModel(values.model, env);
  if (modelId === undefined) {
    io.error(`'${values.model}' is neither a ModelID nor a public id of CATALOG_FILE`);
    return 1;
  }
  const anchor = parseAuditAnchors(env).get(modelId);
  if (anchor === undefined) {
    io.error(
      `model ${modelId} has no anchor (AUDIT_ANCHORS): only an anchor's samples are a reference to ship`,
    );
    return 1;
  }
  // The corpus the gateway's audits ask: the samples' prompt ids are its.
  const corpus = await loadOperatorCorpus(parseAuditCorpusDir(env));
  const data = exportReference(corpus, modelId, anchor, await auditSamplesSince(db, modelId, 0));
  const files = referenceFiles(data);
  if (files.length === 0) {
    io.error(
      `too few samples of anchor ${anchor} for model ${modelId}: no border input found and no ` +
        `logprob sequence with ${referenceMinSamples} finite scores; let the audits run longer`,
    );
    return 1;
  }
  const dir = values.out ?? ".";
  await writeReferenceFiles(dir, files);
  io.out(
    `model ${modelId}, anchor ${anchor}: ${data.borders.length} border inputs, ` +
      `${data.logprobs.size} logprob sequences`,
  );
  for (const f of files) io.out(`${f.file}\tsha256 ${f.sha256}`);
  io.out(`add to the "files" of manifest.json (files under ${dir}):`);
  for (const f of files) io.out(`  "${f.file}": "${f.sha256}"`);
  return 0;
}

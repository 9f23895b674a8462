import { createHash } from "node:crypto";
import { readFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import type { Hex } from "viem";
import { BaseError } from "../../domain/base-error.js";
import { isHex32, normalizeHex } from "../../domain/hex.js";
import {
  mmdPromptsPerPeriod,
  type AuditCorpus,
  type CorpusPrompt,
  type CorpusTurn,
} from "../../domain/audits/traffic.js";

/**
 * The audit corpus shipped with the gateway (issue 39, item 1), and its reference data: files
 * under `data/`, each pinned by its SHA-256 in `data/manifest.json`, as the tokenizers' files are
 * (src/adapters/tokenizers/registry.ts): what an audit asks, and what it is compared with, is the
 * same for every gateway with the same files, and a changed file is a start-up error rather than
 * silently different audits. A file the manifest does not list is never read.
 *
 * - `corpus.json`: `{ "prompts": [...], "probes": [...], "systems": { "en": [...] } }`; a prompt
 *   is `{ "id", "lang", "task", "system"?, "turns": [{ "role": "user" | "assistant",
 *   "content" }] }`, user first and last.
 * - `borders/<ModelID>.json`: `{ "modelId", "prompts": [...] }`, border inputs found black-box on
 *   the model's anchor (prompts whose top-1 first token nearly ties), in the prompts' format.
 * - `reference/<ModelID>.json`: `{ "modelId", "logprobs": { "<sequence id>": <mean nats/token> } }`,
 *   measured once on the reference weights (types.ts `referenceLogprobs`).
 *
 * The shipped corpus is public: anyone, a provider included, can read its prompts and answer
 * honestly exactly the requests that carry one. An operator's own corpus (`AUDIT_CORPUS_DIR`,
 * {@link loadOperatorCorpus}) has the same layout and is kept where no provider reads it.
 */

export class AuditCorpusError extends BaseError {
  readonly reason = "audit_corpus_invalid";
  override readonly name = "AuditCorpusError";
}

/** The folder of the shipped corpus and its manifest. */
export const auditDataDir = fileURLToPath(new URL("./data/", import.meta.url));

interface Manifest {
  readonly files: Readonly<Record<string, string>>;
}

async function readPinned(dir: string, file: string, pinned: string): Promise<unknown> {
  const bytes = await readFile(`${dir}${file}`);
  const actual = createHash("sha256").update(bytes).digest("hex");
  if (actual !== pinned)
    throw new AuditCorpusError(
      `audit data file ${file} has sha256 ${actual}, its manifest pins ${pinned}`,
    );
  return JSON.parse(bytes.toString("utf8")) as unknown;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function prompts(value: unknown, file: string): CorpusPrompt[] {
  if (!Array.isArray(value)) throw new AuditCorpusError(`${file}: prompts must be an array`);
  return value.map((p, i) => {
    const where = `${file}: prompt ${i}`;
    if (!isObject(p) || typeof p["id"] !== "string" || typeof p["lang"] !== "string")
      throw new AuditCorpusError(`${where} needs a string id and lang`);
    const turns = p["turns"];
    if (!Array.isArray(turns) || turns.length === 0 || turns.length % 2 === 0)
      throw new AuditCorpusError(`${where}: turns must alternate user and assistant, user last`);
    const checked = turns.map((t, j): CorpusTurn => {
      const role = j % 2 === 0 ? "user" : "assistant";
      if (!isObject(t) || t["role"] !== role || typeof t["content"] !== "string")
        throw new AuditCorpusError(`${where}: turn ${j} must be a ${role} turn with text`);
      return { role, content: t["content"] };
    });
    return {
      id: p["id"],
      lang: p["lang"],
      task: typeof p["task"] === "string" ? p["task"] : "chat",
      system: typeof p["system"] === "string" ? p["system"] : undefined,
      turns: checked,
    };
  });
}

function modelOf(file: string, value: Record<string, unknown>): Hex {
  const id = value["modelId"];
  if (typeof id !== "string" || !isHex32(id) || !file.includes(normalizeHex(id)))
    throw new AuditCorpusError(`${file}: modelId must be the Hex32 its file is named after`);
  return normalizeHex(id);
}

/**
 * Loads the corpus of `dir` (the shipped one by default), checking every file's SHA-256, that
 * ids are unique, and that it has what the audits draw: at least {@link mmdPromptsPerPeriod}
 * prompts (an MMD period's draw; fewer, and each would be asked more often) and one short-answer
 * probe (the border inputs' candidates).
 */
export async function loadAuditCorpus(dir: string = auditDataDir): Promise<AuditCorpus> {
  let manifest: Manifest;
  try {
    manifest = JSON.parse(await readFile(`${dir}manifest.json`, "utf8")) as Manifest;
  } catch (error) {
    throw new AuditCorpusError(
      `cannot read the audit corpus manifest ${dir}manifest.json: ${(error as Error).message}`,
    );
  }
  const pin = manifest.files["corpus.json"];
  if (pin === undefined) throw new AuditCorpusError("the manifest pins no corpus.json");
  const main = await readPinned(dir, "corpus.json", pin);
  if (!isObject(main)) throw new AuditCorpusError("corpus.json must be an object");
  const systems: Record<string, string[]> = {};
  for (const [lang, list] of Object.entries(isObject(main["systems"]) ? main["systems"] : {}))
    if (Array.isArray(list)) systems[lang] = list.filter((s): s is string => typeof s === "string");
  const borders = new Map<Hex, CorpusPrompt[]>();
  const referenceLogprobs = new Map<Hex, Map<string, number>>();
  for (const [file, sha] of Object.entries(manifest.files)) {
    if (file.startsWith("borders/")) {
      const value = await readPinned(dir, file, sha);
      if (!isObject(value)) throw new AuditCorpusError(`${file} must be an object`);
      borders.set(modelOf(file, value), prompts(value["prompts"], file));
    } else if (file.startsWith("reference/")) {
      const value = await readPinned(dir, file, sha);
      if (!isObject(value) || !isObject(value["logprobs"]))
        throw new AuditCorpusError(`${file} needs a logprobs object`);
      const values = new Map<string, number>();
      for (const [id, v] of Object.entries(value["logprobs"])) {
        if (typeof v !== "number" || !(v <= 0))
          throw new AuditCorpusError(`${file}: ${id} must be a mean log-probability (<= 0)`);
        values.set(id, v);
      }
      referenceLogprobs.set(modelOf(file, value), values);
    }
  }
  const corpus = {
    prompts: prompts(main["prompts"], "corpus.json"),
    probes: prompts(main["probes"], "corpus.json"),
    systems,
    borders,
    referenceLogprobs,
  };
  const ids = new Set<string>();
  for (const { id } of [...corpus.prompts, ...corpus.probes]) {
    if (ids.has(id)) throw new AuditCorpusError(`corpus.json: prompt id ${id} is used twice`);
    ids.add(id);
  }
  // A framing whose clients send a system message gets one from the prompt, else its language's
  // list, else English's: an audit without one would differ from the clients it copies.
  const bare = [...corpus.prompts, ...corpus.probes].find(
    (p) =>
      p.system === undefined &&
      (systems[p.lang] ?? []).length === 0 &&
      (systems["en"] ?? []).length === 0,
  );
  if (bare !== undefined)
    throw new AuditCorpusError(
      `corpus.json: prompt ${bare.id} has no system message, and systems has none for ` +
        `${bare.lang === "en" ? "en" : `${bare.lang} nor for en`} (an audit copying a framing ` +
        "with a system message needs one)",
    );
  if (corpus.prompts.length < mmdPromptsPerPeriod || corpus.probes.length === 0)
    throw new AuditCorpusError(
      `corpus.json has ${corpus.prompts.length} prompts and ${corpus.probes.length} probes: ` +
        `the audits need at least ${mmdPromptsPerPeriod} prompts and 1 probe`,
    );
  return corpus;
}

/** A user turn as compared across corpora: spaces folded, case ignored. */
const folded = (text: string) => text.trim().replace(/\s+/g, " ").toLowerCase();

/** The corpus's texts an audit sends as the client's (user turns, system messages), by where. */
function ownTexts(corpus: AuditCorpus): Map<string, string> {
  const texts = new Map<string, string>();
  const all = [...corpus.prompts, ...corpus.probes, ...[...corpus.borders.values()].flat()];
  for (const p of all) {
    for (const t of p.turns) if (t.role === "user") texts.set(folded(t.content), p.id);
    if (p.system !== undefined) texts.set(folded(p.system), `${p.id}'s system`);
  }
  for (const [lang, list] of Object.entries(corpus.systems))
    list.forEach((text, i) => texts.set(folded(text), `systems.${lang}[${i}]`));
  return texts;
}

/**
 * The operator's corpus at `dir` (`AUDIT_CORPUS_DIR`: the shipped layout, its own manifest), or
 * the shipped one when `dir` is undefined. An operator's corpus may hold no user turn or system
 * message of the shipped one (spaces and case aside): a provider reads those in this repository,
 * and would answer honestly the audits that carry them.
 */
export async function loadOperatorCorpus(dir: string | undefined): Promise<AuditCorpus> {
  if (dir === undefined) return loadAuditCorpus();
  const corpus = await loadAuditCorpus(dir.endsWith("/") ? dir : `${dir}/`);
  const shipped = ownTexts(await loadAuditCorpus());
  const public_ = [...ownTexts(corpus)].filter(([text]) => shipped.has(text));
  if (public_.length > 0)
    throw new AuditCorpusError(
      `AUDIT_CORPUS_DIR: ${public_.length} text(s) are the shipped corpus's ` +
        `(${public_
          .slice(0, 3)
          .map(([text, id]) => `${id}, as shipped ${shipped.get(text)}`)
          .join("; ")}), which anyone can read: a provider would answer those audits honestly`,
    );
  return corpus;
}

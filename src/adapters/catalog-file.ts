import { readFile } from "node:fs/promises";
import type { CatalogEntry } from "../domain/catalog.js";
import { isHex32, normalizeHex } from "../domain/hex.js";

/**
 * Reads the catalog file: `{"models": [{"id", "modelId", "aliases"?}]}`.
 * It gives models public ids and aliases; the chain stays the source of the
 * models themselves. Errors name the file and the entry at fault.
 */
export async function loadCatalogFile(path: string): Promise<CatalogEntry[]> {
  let parsed: unknown;
  try {
    parsed = JSON.parse(await readFile(path, "utf8"));
  } catch (error) {
    throw new Error(`catalog file ${path}: ${(error as Error).message}`, { cause: error });
  }
  return parseCatalog(parsed, path);
}

export function parseCatalog(value: unknown, source = "catalog"): CatalogEntry[] {
  const fail = (message: string): never => {
    throw new Error(`${source}: ${message}`);
  };
  if (
    typeof value !== "object" ||
    value === null ||
    !Array.isArray((value as { models?: unknown }).models)
  ) {
    fail('expected an object with a "models" array');
  }
  const models = (value as { models: unknown[] }).models;
  return models.map((raw, index) => {
    const entry = raw as { id?: unknown; modelId?: unknown; aliases?: unknown };
    if (typeof entry !== "object" || entry === null) fail(`models[${index}] is not an object`);
    if (typeof entry.id !== "string" || !/^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$/.test(entry.id)) {
      fail(`models[${index}].id must be 1-128 characters of letters, digits and . _ : / -`);
    }
    if (typeof entry.modelId !== "string" || !isHex32(entry.modelId)) {
      fail(`models[${index}].modelId must be a Hex32 ModelID`);
    }
    const aliases = entry.aliases ?? [];
    if (!Array.isArray(aliases) || !aliases.every((a) => typeof a === "string" && a.length > 0)) {
      fail(`models[${index}].aliases must be an array of non-empty strings`);
    }
    return {
      id: entry.id as string,
      modelId: normalizeHex(entry.modelId as string),
      aliases: aliases as string[],
    };
  });
}

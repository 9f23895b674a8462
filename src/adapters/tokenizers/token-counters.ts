import type { Tokenizer } from "@huggingface/tokenizers";
import { boundCounter, type TokenCounter, type TokenCounters } from "../../domain/tokens.js";
import { createTokenizerCounter, loadTokenizer } from "./counter.js";
import {
  checkTokenizerRegistry,
  findTokenizer,
  loadTokenizerRegistry,
  type TokenizerEntry,
  type TokenizerRegistry,
} from "./registry.js";

/** The gateway's token counters, with what they were made of. */
export interface TokenizerCounters extends TokenCounters {
  readonly registry: TokenizerRegistry;
  /** Names of the tokenizers loaded so far (metrics, tests). */
  loaded(): readonly string[];
}

/**
 * The token counters of the composition root: the embedded registry with the operator's
 * (TOKENIZER_REGISTRY) over it, every file checked against its SHA-256 before the gateway
 * starts (a missing or changed file is a start-up error naming it; nothing is downloaded).
 * A tokenizer is parsed the first time one of its models is served, once, shared by concurrent
 * callers (parsing takes 0.4 to 1.5 s and 40 to 100 MB each: bench/figures/tokenizers.md); a
 * model the registry does not know is counted by the byte bound ({@link boundCounter}). A load
 * that fails rejects its callers and is tried again by the next.
 */
export async function createTokenCounters(
  options: {
    /** The operator's registry file (TOKENIZER_REGISTRY); absent: the embedded one only. */
    readonly registryFile?: string | undefined;
    /** Told when a tokenizer has been loaded, with the time it took (for the log). */
    readonly onLoad?: (name: string, ms: number) => void;
  } = {},
): Promise<TokenizerCounters> {
  const registry = loadTokenizerRegistry(options.registryFile);
  await checkTokenizerRegistry(registry);
  return createLazyCounters(registry, options.onLoad);
}

/** Models whose route {@link createLazyCounters} remembers before it starts afresh. */
const maxRoutedModels = 4096;

/** {@link createTokenCounters} over a registry already checked (tests, the bench). */
export function createLazyCounters(
  registry: TokenizerRegistry,
  onLoad?: (name: string, ms: number) => void,
): TokenizerCounters {
  const counters = new Map<string, Promise<TokenCounter>>();
  const parsed = new Map<string, Promise<Tokenizer>>();
  const done = new Set<string>();
  // The entry of each model asked for: routes are matched once per model, not per request
  // (a glob route compiles a regular expression). Models are few; the map is bounded anyway.
  const routed = new Map<string, TokenizerEntry | undefined>();
  const entryOf = (model: { readonly repository: string; readonly revision: string }) => {
    const key = `${model.repository}\0${model.revision}`;
    if (routed.has(key)) return routed.get(key);
    if (routed.size >= maxRoutedModels) routed.clear();
    const entry = findTokenizer(registry, model);
    routed.set(key, entry);
    return entry;
  };
  return {
    registry,
    loaded: () => [...done],
    forModel(model) {
      const entry = entryOf(model);
      if (entry === undefined) return Promise.resolve(boundCounter);
      let counter = counters.get(entry.name);
      if (counter === undefined) {
        const started = performance.now();
        counter = loadTokenizer(entry, parsed).then(
          (loaded) => {
            done.add(entry.name);
            onLoad?.(entry.name, performance.now() - started);
            return createTokenizerCounter(loaded);
          },
          (err: unknown) => {
            counters.delete(entry.name);
            throw err;
          },
        );
        counters.set(entry.name, counter);
      }
      return counter;
    },
  };
}

import {
  boundCounter,
  type Metering,
  type ModelRef,
  type TokenCounter,
  type TokenCounters,
} from "../../domain/tokens.js";
import { createCountPool, type CountPool } from "./count-pool.js";
import { createTokenizerCounter, loadTokenizer, type EngineChoice } from "./counter.js";
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
  /**
   * Names of the tokenizers being loaded now: their models are not routable yet (`/ready`
   * says so).
   */
  loading(): readonly string[];
  /** Stops the count pool's workers (shutdown). */
  close(): Promise<void>;
}

/** How {@link createTokenCounters} counts. */
export interface TokenCountersOptions {
  /** The operator's registry file (TOKENIZER_REGISTRY); absent: the embedded one only. */
  readonly registryFile?: string | undefined;
  /** Told when a tokenizer has been loaded, with the time it took (for the log). */
  readonly onLoad?: ((name: string, ms: number) => void) | undefined;
  /**
   * Worker threads long prompts are counted in (default 1); 0 counts every prompt inline
   * (tests that want no threads).
   */
  readonly threads?: number | undefined;
}

/**
 * The token counters of the composition root: the embedded registry with the operator's
 * (TOKENIZER_REGISTRY) over it, every file checked against its SHA-256 before the gateway
 * starts (a missing or changed file is a start-up error naming it; nothing is downloaded).
 * Tokenizers are loaded by {@link TokenCounters.preload} (at start, and when the indexer adds a
 * model), in the main thread for output and short prompts and in the count pool for long ones;
 * never on a request's path: until its tokenizer is loaded a model has no counter (forModel is
 * undefined) and is not routable. A model the registry does not know is counted by the byte
 * bound ({@link boundCounter}).
 */
export async function createTokenCounters(
  options: TokenCountersOptions = {},
): Promise<TokenizerCounters> {
  const registry = loadTokenizerRegistry(options.registryFile);
  await checkTokenizerRegistry(registry);
  return createCountersOver(registry, options);
}

/** Models whose route {@link createCountersOver} remembers before it starts afresh. */
const maxRoutedModels = 4096;

/** {@link createTokenCounters} over a registry already checked (tests, the bench). */
export function createCountersOver(
  registry: TokenizerRegistry,
  options: Omit<TokenCountersOptions, "registryFile"> = {},
): TokenizerCounters {
  const threads = options.threads ?? 1;
  const pool: CountPool | undefined = threads > 0 ? createCountPool({ threads }) : undefined;
  const counters = new Map<string, TokenCounter>();
  const loads = new Map<string, Promise<void>>();
  const engines = new Map<string, Promise<EngineChoice>>();
  // The entry of each model asked for: routes are matched once per model, not per request
  // (a glob route compiles a regular expression). Models are few; the map is bounded anyway.
  const routed = new Map<string, TokenizerEntry | undefined>();
  const entryOf = (model: ModelRef) => {
    const key = `${model.repository}\0${model.revision}`;
    if (routed.has(key)) return routed.get(key);
    if (routed.size >= maxRoutedModels) routed.clear();
    const entry = findTokenizer(registry, model);
    routed.set(key, entry);
    return entry;
  };
  const load = (entry: TokenizerEntry): Promise<void> => {
    let loading = loads.get(entry.name);
    if (loading === undefined) {
      const started = performance.now();
      loading = Promise.all([loadTokenizer(entry, engines), pool?.preload(entry)]).then(
        ([loaded]) => {
          counters.set(entry.name, createTokenizerCounter(loaded, pool));
          loads.delete(entry.name);
          options.onLoad?.(entry.name, performance.now() - started);
        },
        (err: unknown) => {
          loads.delete(entry.name);
          throw err;
        },
      );
      loads.set(entry.name, loading);
    }
    return loading;
  };
  return {
    registry,
    loaded: () => [...counters.keys()],
    loading: () => [...loads.keys()],
    forModel(model) {
      const entry = entryOf(model);
      if (entry === undefined) return boundCounter;
      return counters.get(entry.name);
    },
    meteringOf(model): Metering {
      const entry = entryOf(model);
      return entry === undefined ? { kind: "bound" } : { kind: "exact", tokenizer: entry.name };
    },
    async preload(models) {
      const entries = new Map<string, TokenizerEntry>();
      for (const model of models) {
        const entry = entryOf(model);
        if (entry !== undefined && !counters.has(entry.name)) entries.set(entry.name, entry);
      }
      // One at a time: loads parse large files on the event loop, and each finished tokenizer
      // makes its models routable without waiting for the others. One that fails does not
      // keep the others from loading; the first failure is reported.
      let failure: unknown;
      for (const entry of entries.values()) {
        try {
          await load(entry);
        } catch (err) {
          failure ??= err;
        }
      }
      if (failure !== undefined) throw failure;
    },
    async close() {
      await pool?.close();
    },
  };
}

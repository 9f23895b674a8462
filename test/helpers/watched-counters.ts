import { inputTokenUpperBound } from "../../src/domain/chat/request/index.js";
import {
  boundCounter,
  type Metering,
  type ModelRef,
  type TokenCounter,
  type TokenCounters,
} from "../../src/domain/tokens.js";

/**
 * Token counters whose loads a test watches (issue 35, item 5: loaded before served): each
 * repository in `routes` is metered by the named tokenizer (its counts are the byte bound's,
 * which is all a routing or readiness test needs), any other by the bound. A tokenizer is
 * usable (`forModel` defined) only once `preload` has loaded it; loads take `loadMs`, or wait
 * for {@link WatchedCounters.release} while the tokenizer is held.
 */
export interface WatchedCounters extends TokenCounters {
  loading(): readonly string[];
  /** Every `preload` call, in order (the repositories it was given). */
  readonly preloads: string[][];
  /** Every `forModel` call that found its tokenizer not loaded (a request would have waited). */
  readonly notLoaded: string[];
  /** Changes a route (a model the registry learns of later, in tests). */
  route(repository: string, tokenizer: string | undefined): void;
  /** Loads of this tokenizer wait until released. */
  hold(tokenizer: string): void;
  release(tokenizer: string): void;
  /** Loads of this tokenizer fail. */
  breakLoads(tokenizer: string): void;
}

/**
 * The byte bound under a tokenizer's name. Its input count is returned as a bigint, which
 * `await` takes as is, so that the counter serves callers written before the port's
 * countInput became asynchronous as well as after (issue 35 lands in parts).
 */
function namedBound(name: string): TokenCounter {
  return {
    ...boundCounter,
    name,
    countInput: (req) => inputTokenUpperBound(req) as unknown as Promise<bigint>,
  };
}

export function watchedCounters(
  routes: Record<string, string>,
  options: { loadMs?: number } = {},
): WatchedCounters {
  const table = new Map(Object.entries(routes));
  const loaded = new Map<string, TokenCounter>();
  const loading = new Map<string, Promise<void>>();
  const held = new Map<string, () => void>();
  const holding = new Set<string>();
  const broken = new Set<string>();
  const preloads: string[][] = [];
  const notLoaded: string[] = [];
  const tokenizerOf = (model: ModelRef) => table.get(model.repository);

  const load = (tokenizer: string): Promise<void> => {
    const running = loading.get(tokenizer);
    if (running !== undefined) return running;
    const done = (async () => {
      if (holding.has(tokenizer)) await new Promise<void>((r) => held.set(tokenizer, r));
      else await new Promise((r) => setTimeout(r, options.loadMs ?? 20));
      if (broken.has(tokenizer)) throw new Error(`${tokenizer}: tokenizer.json is not valid`);
      loaded.set(tokenizer, namedBound(tokenizer));
    })().finally(() => loading.delete(tokenizer));
    loading.set(tokenizer, done);
    return done;
  };

  return {
    preloads,
    notLoaded,
    forModel(model) {
      const tokenizer = tokenizerOf(model);
      if (tokenizer === undefined) return namedBound("bound");
      const counter = loaded.get(tokenizer);
      if (counter === undefined) notLoaded.push(model.repository);
      return counter;
    },
    meteringOf(model): Metering {
      const tokenizer = tokenizerOf(model);
      return tokenizer === undefined ? { kind: "bound" } : { kind: "exact", tokenizer };
    },
    async preload(models) {
      preloads.push(models.map((m) => m.repository));
      const names = new Set(models.flatMap((m) => tokenizerOf(m) ?? []));
      await Promise.all([...names].filter((n) => !loaded.has(n)).map(load));
    },
    loading: () => [...loading.keys()],
    route(repository, tokenizer) {
      if (tokenizer === undefined) table.delete(repository);
      else table.set(repository, tokenizer);
    },
    hold: (tokenizer) => void holding.add(tokenizer),
    release(tokenizer) {
      holding.delete(tokenizer);
      held.get(tokenizer)?.();
      held.delete(tokenizer);
    },
    breakLoads: (tokenizer) => void broken.add(tokenizer),
  };
}

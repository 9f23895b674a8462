import type { PublicClient } from "viem";
import type { Database } from "../adapters/pg/database.js";
import { createSharedRefresh } from "../domain/shared-refresh.js";
import { publicStateMaxAgeMs } from "./metrics.js";
import type { Readiness } from "../rest/route-kit.js";

export async function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** What readiness and the metrics' scrape ask: the gateway's database, and the chain's head. */
export function dependencySources(db: Database, chain: PublicClient) {
  return {
    query: (text: string) => db.pool.query(text),
    chainHead: () => chain.getBlockNumber({ cacheTime: 0 }),
  };
}

/** What `/ready` says of the tokenizers (src/app/tokenizer-preloads.ts keeps it). */
export interface TokenizerReadiness {
  /** No tokenizer a model with an active offer needs is loading. */
  readonly ok: boolean;
  /** Tokenizers loading now (an active offer's model's, or a just-indexed model's). */
  readonly loading: readonly string[];
  /** Tokenizers whose last load failed: their models stay unroutable until a load succeeds. */
  readonly failed: readonly string[];
}

/**
 * GET /ready: unauthenticated, so it answers from one check of the database and the chain per
 * publicStateMaxAgeMs, shared by every caller (DESIGN.md section 8), never one per request.
 * Draining is this process's own state: said at once, not after the next check. So are the
 * tokenizers (issue 35, item 5): not ready while one that a model with an active offer needs is
 * loading; the check names the tokenizers loading, and those whose last load failed (their
 * models are not routable; the rest of the gateway serves, so a failed load alone does not make
 * it unready).
 */
export function createReadiness(deps: {
  readonly db: Database;
  readonly chain: PublicClient;
  readonly draining: () => boolean;
  /** The tokenizer preloads' state (src/app/tokenizer-preloads.ts); absent: not checked. */
  readonly tokenizers?: (() => TokenizerReadiness) | undefined;
}): () => Promise<Readiness> {
  const sources = dependencySources(deps.db, deps.chain);
  const dependencyChecks = createSharedRefresh(
    async (): Promise<Readiness> => {
      const check = async (probe: () => Promise<unknown>) => {
        try {
          await withTimeout(probe(), 2000);
          return { ok: true };
        } catch (error) {
          return { ok: false, error: (error as Error).message.split("\n")[0] ?? "failed" };
        }
      };
      const [database, chain] = await Promise.all([
        check(() => sources.query("SELECT 1")),
        check(() => sources.chainHead()),
      ]);
      return { ok: database.ok && chain.ok, checks: { database, chain } };
    },
    { maxAgeMs: publicStateMaxAgeMs },
  );
  const { tokenizers } = deps;
  return async () => {
    if (deps.draining()) return { ok: false, shuttingDown: true, checks: {} };
    const dependencies = await dependencyChecks.get();
    if (tokenizers === undefined) return dependencies;
    const state = tokenizers();
    const check = {
      ok: state.ok,
      ...(state.ok ? {} : { error: `loading: ${state.loading.join(", ")}` }),
      loading: [...state.loading],
      failed: [...state.failed],
    };
    return {
      ok: dependencies.ok && check.ok,
      checks: { ...dependencies.checks, tokenizers: check },
    };
  };
}

import type { PublicClient } from "viem";
import type { Database } from "../adapters/pg/database.js";
import { createSharedRefresh } from "../domain/shared-refresh.js";
import { publicStateMaxAgeMs } from "./metrics.js";
import type { Readiness } from "../rest/facade.js";

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

/**
 * GET /ready: unauthenticated, so it answers from one check of the database and the chain per
 * publicStateMaxAgeMs, shared by every caller (DESIGN.md section 8), never one per request.
 * Draining is this process's own state: said at once, not after the next check.
 */
export function createReadiness(deps: {
  readonly db: Database;
  readonly chain: PublicClient;
  readonly draining: () => boolean;
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
  return async () =>
    deps.draining() ? { ok: false, shuttingDown: true, checks: {} } : dependencyChecks.get();
}

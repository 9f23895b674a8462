import type { PublicClient } from "viem";
import type { Database } from "../adapters/pg/database.js";
import { createSharedRefresh } from "../domain/shared-refresh.js";
import { publicStateMaxAgeMs } from "../runtime/metrics.js";
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
        check(() => deps.db.pool.query("SELECT 1")),
        check(() => deps.chain.getBlockNumber({ cacheTime: 0 })),
      ]);
      return { ok: database.ok && chain.ok, checks: { database, chain } };
    },
    { maxAgeMs: publicStateMaxAgeMs },
  );
  return async () =>
    deps.draining() ? { ok: false, shuttingDown: true, checks: {} } : dependencyChecks.get();
}

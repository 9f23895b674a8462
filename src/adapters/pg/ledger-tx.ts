/**
 * What the ledger's modules share (ledger.ts): its inconsistency error, the checks of amounts
 * and rows, and {@link inTransaction}, the transaction every multi-statement change runs in.
 */
import type pg from "pg";
import { BaseError } from "../../domain/base-error.js";
import type { UsageFigures } from "../../domain/chat/index.js";

/** The ledger found itself inconsistent (a bug, or a hand edit); the transaction was undone. */
export class LedgerInconsistencyError extends BaseError {
  readonly reason = "ledger_inconsistent";
  override readonly name = "LedgerInconsistencyError";
}

export function expectOneRow(rowCount: number | null, what: string): void {
  if (rowCount !== 1) throw new LedgerInconsistencyError(`${what} is missing`);
}

export function requireAmount(name: string, value: bigint): void {
  if (value < 0n) throw new RangeError(`${name} must not be negative (got ${value})`);
}

export function requireFigures(name: string, figures: UsageFigures | undefined): void {
  if (figures === undefined) return;
  requireAmount(`${name}.inputTokens`, figures.inputTokens);
  requireAmount(`${name}.outputTokens`, figures.outputTokens);
  requireAmount(`${name}.cachedInputTokens`, figures.cachedInputTokens);
  requireAmount(`${name}.reasoningTokens`, figures.reasoningTokens);
}

/** A transaction's result that must not be committed: everything it wrote is rolled back. */
export class Refusal<T> {
  constructor(readonly value: T) {}
}

export function refuse<T>(value: T): Refusal<T> {
  return new Refusal(value);
}

/**
 * Runs `body` in a transaction on one client: commits what it returns, rolls back on a
 * {@link Refusal} (returning its value) or an error (rethrown). A client whose transaction
 * state is unknown because even ROLLBACK failed is destroyed rather than returned to the pool,
 * where the next user would find itself inside our transaction; after a failed query whose
 * ROLLBACK worked, the connection is fine and goes back.
 */
export async function inTransaction<T>(
  pool: pg.Pool,
  body: (client: pg.PoolClient) => Promise<T | Refusal<T>>,
): Promise<T> {
  const client = await pool.connect();
  let discard: Error | boolean = false;
  try {
    // Explicit: a different server default must not change what the module comment relies on.
    await client.query("BEGIN ISOLATION LEVEL READ COMMITTED");
    const result = await body(client);
    if (result instanceof Refusal) {
      await client.query("ROLLBACK");
      return result.value;
    }
    await client.query("COMMIT");
    return result;
  } catch (err) {
    try {
      await client.query("ROLLBACK");
    } catch (rollbackError) {
      discard = rollbackError instanceof Error ? rollbackError : true;
    }
    throw err;
  } finally {
    client.release(discard);
  }
}

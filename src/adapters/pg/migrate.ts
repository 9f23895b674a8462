import { readdir, readFile } from "node:fs/promises";
import { BaseError } from "../../domain/base-error.js";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type pg from "pg";

const MIGRATIONS_DIR = fileURLToPath(new URL("./migrations/", import.meta.url));
const FUNCTIONS_DIR = fileURLToPath(new URL("./functions/", import.meta.url));

// Any constant will do as long as nothing else in the database uses it: every gateway process
// that starts takes this lock, so migrations run one process at a time.
const MIGRATION_LOCK_KEY = "7201934488021365";

const FILE_NAME = /^(\d+)_([A-Za-z0-9_-]+)\.sql$/;

/**
 * The first line of a migration that needs the SQL functions before it runs (a trigger names
 * its function, which lives in `functions/`): they are applied in its transaction, before it.
 */
const FUNCTIONS_FIRST = /^-- migrate: functions first\s*$/;

/** A migration could not be applied, or the database does not fit the code. */
export class MigrationError extends BaseError {
  readonly reason = "migration_failed";
  override readonly name = "MigrationError";
}

interface MigrationFile {
  version: number;
  /** The file name without `.sql`, e.g. `001_api_keys`. */
  id: string;
  name: string;
  path: string;
}

/**
 * Applies the numbered `.sql` files in `dir` that the database has not recorded yet, in numeric
 * order, each in its own transaction together with its row in `schema_migrations`, so a failing
 * migration leaves nothing behind. An advisory lock held for the whole run makes concurrent
 * starts safe: the second process waits, then finds nothing left to do. Migrations must
 * therefore be transactional (no `CREATE INDEX CONCURRENTLY`, no BEGIN/COMMIT of their own).
 *
 * Then, in the same locked run, every `.sql` file of `functionsDir` (by default the project's
 * `functions/` when `dir` is the project's migrations) is applied, in name order, in one
 * transaction: the one live definition of each SQL function, re-applied on every start
 * (idempotent: CREATE OR REPLACE, and DROP ... IF EXISTS for a signature that changed), so a
 * database migrated from any past version ends with exactly the current functions. Migrations
 * hold tables, indexes, triggers and data changes only; one whose first line is
 * `-- migrate: functions first` (its triggers name a function) gets the function files applied
 * in its own transaction, before it.
 *
 * @returns the ids (file names without `.sql`) of the migrations applied by this call.
 */
export async function migrate(
  pool: pg.Pool,
  dir: string = MIGRATIONS_DIR,
  functionsDir: string | undefined = dir === MIGRATIONS_DIR ? FUNCTIONS_DIR : undefined,
): Promise<{ applied: string[] }> {
  const files = await readMigrationFiles(dir);
  const functions = functionsDir === undefined ? [] : await readFunctionFiles(functionsDir);
  // Everything runs on this one client: the advisory lock belongs to its session, and the
  // embedded PGlite pool has only one connection anyway.
  const client = await pool.connect();
  let broken: Error | undefined;
  try {
    // A migration (or the wait for another process's) may outlast the pool's statement timeout.
    await client.query("SET statement_timeout = 0");
    await client.query(`SELECT pg_advisory_lock(${MIGRATION_LOCK_KEY})`);
    try {
      await client.query(`
        CREATE TABLE IF NOT EXISTS schema_migrations (
          version int PRIMARY KEY,
          name text NOT NULL,
          applied_at timestamptz NOT NULL DEFAULT now()
        )`);
      const recorded = await client.query<{ version: number; name: string }>(
        "SELECT version, name FROM schema_migrations ORDER BY version",
      );
      checkRecorded(recorded.rows, files);
      const done = new Set(recorded.rows.map((r) => r.version));
      const applied: string[] = [];
      for (const file of files) {
        if (done.has(file.version)) continue;
        const sql = await readFile(file.path, "utf8");
        const functionsFirst = FUNCTIONS_FIRST.test(sql.split("\n", 1)[0] ?? "");
        try {
          await client.query("BEGIN");
          if (functionsFirst) for (const f of functions) await client.query(f.sql);
          await client.query(sql);
          await client.query("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", [
            file.version,
            file.name,
          ]);
          await client.query("COMMIT");
        } catch (err) {
          await client.query("ROLLBACK").catch((rollbackErr: unknown) => {
            broken = rollbackErr instanceof Error ? rollbackErr : new Error(String(rollbackErr));
          });
          const reason = err instanceof Error ? err.message : String(err);
          throw new MigrationError(`migration ${file.id} failed: ${reason}`, { cause: err });
        }
        applied.push(file.id);
      }
      if (functions.length > 0) {
        let failed = "";
        try {
          await client.query("BEGIN");
          for (const file of functions) {
            failed = file.name;
            await client.query(file.sql);
          }
          await client.query("COMMIT");
        } catch (err) {
          await client.query("ROLLBACK").catch((rollbackErr: unknown) => {
            broken = rollbackErr instanceof Error ? rollbackErr : new Error(String(rollbackErr));
          });
          const reason = err instanceof Error ? err.message : String(err);
          throw new MigrationError(`SQL functions ${failed} failed: ${reason}`, { cause: err });
        }
      }
      return { applied };
    } finally {
      if (broken === undefined) {
        await client
          .query(`SELECT pg_advisory_unlock(${MIGRATION_LOCK_KEY})`)
          .then(() => client.query("RESET statement_timeout"))
          .catch((err: unknown) => {
            broken = err instanceof Error ? err : new Error(String(err));
          });
      }
    }
  } finally {
    // A client whose rollback or unlock failed may still hold the lock or a transaction:
    // destroy it rather than hand it back to the pool (its session ends, and the lock with it).
    client.release(broken);
  }
}

async function readMigrationFiles(dir: string): Promise<MigrationFile[]> {
  const files: MigrationFile[] = [];
  for (const entry of await readdir(dir)) {
    if (!entry.endsWith(".sql")) continue;
    const match = FILE_NAME.exec(entry);
    if (!match) {
      throw new MigrationError(`migration file ${entry} is not named NNN_name.sql`);
    }
    const [, digits = "", name = ""] = match;
    files.push({ version: Number(digits), id: entry.slice(0, -4), name, path: join(dir, entry) });
  }
  files.sort((a, b) => a.version - b.version);
  for (let i = 1; i < files.length; i++) {
    const prev = files[i - 1];
    const cur = files[i];
    if (prev && cur && prev.version === cur.version) {
      throw new MigrationError(`migrations ${prev.id} and ${cur.id} share version ${cur.version}`);
    }
  }
  return files;
}

/** The `.sql` files of `dir`, in name order (byte order, as `ls` in the C locale). */
async function readFunctionFiles(dir: string): Promise<{ name: string; sql: string }[]> {
  const names = (await readdir(dir)).filter((n) => n.endsWith(".sql")).sort();
  return Promise.all(
    names.map(async (name) => ({ name, sql: await readFile(join(dir, name), "utf8") })),
  );
}

/** Refuses a database that records migrations this code does not have. */
function checkRecorded(
  recorded: readonly { version: number; name: string }[],
  files: readonly MigrationFile[],
): void {
  const byVersion = new Map(files.map((f) => [f.version, f]));
  for (const row of recorded) {
    const file = byVersion.get(row.version);
    if (!file) {
      throw new MigrationError(
        `database has migration ${row.version} (${row.name}) but no such file exists: ` +
          "the database is newer than this code",
      );
    }
    if (file.name !== row.name) {
      throw new MigrationError(
        `database recorded migration ${row.version} as "${row.name}" but the file is ${file.id}`,
      );
    }
  }
}

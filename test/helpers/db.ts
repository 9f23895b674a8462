import { createHash, randomBytes } from "node:crypto";
import { readdir, readFile, rename, writeFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { gunzipSync } from "node:zlib";
import { PGlite } from "@electric-sql/pglite";
import pg from "pg";
import { afterAll, beforeAll, describe } from "vitest";
import {
  openDatabase,
  servePglite,
  type Database,
  type OpenDatabaseOptions,
} from "../../src/adapters/pg/database.js";
import { migrate } from "../../src/adapters/pg/migrate.js";
import { startPgBouncer, type PgBouncer } from "./pgbouncer.js";

export interface TestDatabase {
  /**
   * The URL of the fresh PostgreSQL database (through PgBouncer with TEST_PGBOUNCER=1);
   * undefined for PGlite.
   */
  url?: string;
  /** With TEST_PGBOUNCER=1: the database's direct URL, the gateway's DATABASE_DIRECT_URL. */
  directUrl?: string;
  db: Database;
  /** Closes the database and, on PostgreSQL, drops it. Idempotent. */
  drop(): Promise<void>;
}

/** The PostgreSQL server tests may create databases on, when there is one. */
export function testDatabaseUrl(): string | undefined {
  return process.env.TEST_DATABASE_URL || undefined;
}

/**
 * TEST_PGBOUNCER=1 (with TEST_DATABASE_URL): every test database is reached through one
 * PgBouncer per test process, in transaction pooling mode (`npm run test:pgbouncer`).
 */
export function testThroughPgBouncer(): boolean {
  return process.env.TEST_PGBOUNCER === "1" && testDatabaseUrl() !== undefined;
}

let bouncer: Promise<PgBouncer> | undefined;

function sharedPgBouncer(serverUrl: string): Promise<PgBouncer> {
  return (bouncer ??= startPgBouncer(serverUrl).then((started) => {
    process.once("exit", () => started.kill());
    return started;
  }));
}

/** `describe` that runs only against a real PostgreSQL (TEST_DATABASE_URL set). */
export const describeIfPostgres = describe.skipIf(!process.env.TEST_DATABASE_URL);

/**
 * A fresh, empty database: a new `gw_test_<hex>` database on TEST_DATABASE_URL's server when
 * that is set, else an in-memory PGlite. Migrated unless `migrate: false`. `timeouts` are the
 * pool's on PostgreSQL (see `openDatabase`); PGlite has none.
 */
export async function createTestDatabase(
  opts: { migrate?: boolean; timeouts?: OpenDatabaseOptions["timeouts"] } = {},
): Promise<TestDatabase> {
  const serverUrl = testDatabaseUrl();
  if (serverUrl === undefined && opts.migrate !== false) {
    // PGlite, migrated: from a snapshot of a database these migrations made (one per set of
    // migration and function files), when there is one.
    const migrated = await createMigratedPglite();
    if (migrated !== undefined) return migrated;
  }
  const test =
    serverUrl === undefined ? await createPglite() : await createPostgres(serverUrl, opts.timeouts);
  if (opts.migrate !== false) {
    try {
      await migrate(test.db.session);
    } catch (err) {
      await test.drop().catch(() => {});
      throw err;
    }
  }
  return test;
}

/**
 * A fresh database ({@link createTestDatabase}) for the tests of the enclosing `describe` (or of
 * the file, called at its top level): created before them, dropped after them. Hooks registered
 * after this call run after the creation and before the drop (vitest runs `afterAll` hooks in
 * reverse order), so they may seed it or close what they opened on it.
 *
 * The returned object reads the database once created (`test.db.pool` in a test or a later
 * hook, as with a variable the hooks set); read before, it throws.
 */
export function useTestDatabase(
  opts: Parameters<typeof createTestDatabase>[0] = {},
): Omit<TestDatabase, "drop"> {
  let test: TestDatabase | undefined;
  beforeAll(async () => {
    test = await createTestDatabase(opts);
  });
  afterAll(async () => {
    await test?.drop();
  });
  const created = (): TestDatabase => {
    if (test === undefined) throw new Error("useTestDatabase: the database is not created yet");
    return test;
  };
  return {
    get url() {
      return created().url;
    },
    get directUrl() {
      return created().directUrl;
    },
    get db() {
      return created().db;
    },
  };
}

async function createPostgres(
  serverUrl: string,
  timeouts: OpenDatabaseOptions["timeouts"],
): Promise<TestDatabase> {
  const name = `gw_test_${randomBytes(6).toString("hex")}`;
  await withAdminClient(serverUrl, (c) => c.query(`CREATE DATABASE ${name}`));
  const direct = new URL(serverUrl);
  direct.pathname = `/${name}`;
  const directUrl = direct.toString();
  let url = directUrl;
  let db: Database;
  try {
    if (testThroughPgBouncer()) {
      url = (await sharedPgBouncer(serverUrl)).url(name);
      // The gateway cannot send statement_timeout through the pooler: an operator sets it as
      // the role's or database's default (docs/operations.md); the helper does the latter.
      if (timeouts !== undefined) {
        await withAdminClient(serverUrl, (c) =>
          c.query(`ALTER DATABASE ${name} SET statement_timeout = ${timeouts.statementMs}`),
        );
      }
    }
    db = await openDatabase({
      url,
      ...(url === directUrl ? {} : { directUrl }),
      ...(timeouts === undefined ? {} : { timeouts }),
    });
  } catch (err) {
    await withAdminClient(serverUrl, (c) =>
      c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`),
    );
    throw err;
  }
  return {
    url,
    ...(url === directUrl ? {} : { directUrl }),
    db,
    drop: once(async () => {
      await db.close();
      await withAdminClient(serverUrl, (c) =>
        c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`),
      );
    }),
  };
}

async function withAdminClient(url: string, fn: (c: pg.Client) => Promise<unknown>): Promise<void> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    await fn(client);
  } finally {
    await client.end();
  }
}

async function createPglite(): Promise<TestDatabase> {
  const template = await pgliteTemplate();
  let pglite: PGlite | undefined;
  if (template) {
    // A damaged cache file must not fail the tests: fall back to a fresh initdb.
    pglite = await PGlite.create({ loadDataDir: template }).catch(() => undefined);
  }
  const db = await servePglite(pglite ?? (await PGlite.create()));
  return { db, drop: once(() => db.close()) };
}

/**
 * A PGlite migrated by this checkout's migrations, loaded from a snapshot of one (about 1.2 s of
 * migrations saved per database: most suites make several; issue 36, `npm test`'s time). The
 * snapshot is named by the PGlite version and a hash of every migration and function file, so a
 * changed file makes a new one. Its deployment id (migration 027: one per database) is made
 * anew, as migrating would. Undefined when no snapshot can be had: the caller migrates.
 */
async function createMigratedPglite(): Promise<TestDatabase | undefined> {
  const template = await migratedTemplate();
  if (template === undefined) return undefined;
  const pglite = await PGlite.create({ loadDataDir: template }).catch(() => undefined);
  if (pglite === undefined) return undefined;
  const db = await servePglite(pglite);
  try {
    await db.pool.query(
      "UPDATE gateway_deployment SET id = 'dep_' || replace(gen_random_uuid()::text, '-', '')",
    );
  } catch (error) {
    await db.close();
    throw error;
  }
  return { db, drop: once(() => db.close()) };
}

let migratedPromise: Promise<Blob | undefined> | undefined;

function migratedTemplate(): Promise<Blob | undefined> {
  return (migratedPromise ??= loadOrCreateMigrated().catch(() => undefined));
}

async function loadOrCreateMigrated(): Promise<Blob | undefined> {
  const version = pgliteVersion();
  if (version === undefined) return undefined;
  const hash = createHash("sha256");
  for (const dir of ["migrations", "functions"]) {
    const folder = fileURLToPath(new URL(`../../src/adapters/pg/${dir}/`, import.meta.url));
    for (const name of (await readdir(folder)).sort()) {
      hash
        .update(`${dir}/${name}\0`)
        .update(await readFile(join(folder, name)))
        .update("\0");
    }
  }
  const path = join(
    tmpdir(),
    `gateway-test-pglite-${version}-migrated-${hash.digest("hex").slice(0, 16)}.tgz`,
  );
  return cachedSnapshot(path, async () => {
    const fresh = await pgliteTemplate();
    const pglite =
      fresh === undefined ? await PGlite.create() : await PGlite.create({ loadDataDir: fresh });
    const db = await servePglite(pglite);
    try {
      await migrate(db.session);
      return Buffer.from(await (await pglite.dumpDataDir("gzip")).arrayBuffer());
    } finally {
      await db.close();
    }
  });
}

// Creating a PGlite runs initdb (3-5 s); starting from a snapshot of a fresh data directory
// takes under one. The snapshot is cached on disk (per PGlite version) so that every vitest
// worker process, not just the first, starts fast.
let templatePromise: Promise<Blob | undefined> | undefined;

function pgliteTemplate(): Promise<Blob | undefined> {
  return (templatePromise ??= loadOrCreateTemplate().catch(() => undefined));
}

async function loadOrCreateTemplate(): Promise<Blob | undefined> {
  const version = pgliteVersion();
  if (version === undefined) return undefined;
  return cachedSnapshot(join(tmpdir(), `gateway-test-pglite-${version}.tgz`), async () => {
    const fresh = await PGlite.create();
    try {
      return Buffer.from(await (await fresh.dumpDataDir("gzip")).arrayBuffer());
    } finally {
      await fresh.close();
    }
  });
}

/** A data directory snapshot cached at `path` (gzipped tar), made by `make` when missing. */
async function cachedSnapshot(path: string, make: () => Promise<Buffer>): Promise<Blob> {
  try {
    // Unzipped here, not by PGlite, so that a damaged file (gzip has a checksum) is a cache
    // miss rather than an error thrown inside PGlite.
    return new Blob([gunzipSync(await readFile(path))], { type: "application/x-tar" });
  } catch {
    // not cached yet, or damaged
  }
  const dump = await make();
  // Write then rename, so a concurrent worker never reads half a file.
  const partial = `${path}.${process.pid}.${randomBytes(4).toString("hex")}`;
  await writeFile(partial, dump);
  await rename(partial, path);
  return new Blob([gunzipSync(dump)], { type: "application/x-tar" });
}

function pgliteVersion(): string | undefined {
  try {
    const require = createRequire(import.meta.url);
    let dir = dirname(require.resolve("@electric-sql/pglite"));
    for (let i = 0; i < 5; i++) {
      try {
        const pkg = require(join(dir, "package.json")) as { name?: string; version?: string };
        if (pkg.name === "@electric-sql/pglite" && pkg.version) return pkg.version;
      } catch {
        // keep walking up
      }
      dir = dirname(dir);
    }
  } catch {
    // not resolvable: no cache
  }
  return undefined;
}

function once(fn: () => Promise<void>): () => Promise<void> {
  let done: Promise<void> | undefined;
  return () => (done ??= fn());
}

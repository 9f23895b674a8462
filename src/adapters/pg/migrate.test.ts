import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import {
  createTestDatabase,
  describeIfPostgres,
  testDatabaseUrl,
  type TestDatabase,
} from "../../../test/helpers/db.js";
import { openDatabase } from "./database.js";
import { migrate, MigrationError } from "./migrate.js";

const tempDirs: string[] = [];
const databases: TestDatabase[] = [];

async function migrationsDir(files: Record<string, string>): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "gw-migrations-"));
  tempDirs.push(dir);
  for (const [name, sql] of Object.entries(files)) await writeFile(join(dir, name), sql);
  return dir;
}

async function freshDatabase(): Promise<TestDatabase> {
  const test = await createTestDatabase({ migrate: false });
  databases.push(test);
  return test;
}

async function recorded(test: TestDatabase): Promise<{ version: number; name: string }[]> {
  const { rows } = await test.db.pool.query<{ version: number; name: string }>(
    "SELECT version, name FROM schema_migrations ORDER BY version",
  );
  return rows;
}

async function tableExists(test: TestDatabase, table: string): Promise<boolean> {
  const { rows } = await test.db.pool.query<{ exists: boolean }>(
    "SELECT to_regclass($1) IS NOT NULL AS exists",
    [table],
  );
  return rows[0]?.exists === true;
}

afterEach(async () => {
  await Promise.all(databases.splice(0).map((d) => d.drop()));
});

afterAll(async () => {
  await Promise.all(tempDirs.map((d) => rm(d, { recursive: true, force: true })));
});

describe("migrate", () => {
  it("applies the project's migrations once, then nothing", async () => {
    const test = await freshDatabase();
    const first = await migrate(test.db.pool);
    expect(first.applied).toContain("001_api_keys");
    expect(await tableExists(test, "api_keys")).toBe(true);
    expect(await recorded(test)).toContainEqual({ version: 1, name: "api_keys" });

    expect(await migrate(test.db.pool)).toEqual({ applied: [] });
  });

  it("applies files in numeric, not lexical, order", async () => {
    const dir = await migrationsDir({
      "10_second.sql": "ALTER TABLE t ADD COLUMN b int;",
      "2_first.sql": "CREATE TABLE t (a int);",
      "README.md": "not a migration",
    });
    const test = await freshDatabase();
    expect(await migrate(test.db.pool, dir)).toEqual({ applied: ["2_first", "10_second"] });
    expect(await recorded(test)).toEqual([
      { version: 2, name: "first" },
      { version: 10, name: "second" },
    ]);
  });

  it("rolls a failing migration back entirely and does not record it", async () => {
    const good = {
      "001_a.sql": "CREATE TABLE a (x int);",
      "002_b.sql": "CREATE TABLE b (x int);\nINSERT INTO b VALUES (1);",
    };
    const dir = await migrationsDir({
      ...good,
      "002_b.sql": "CREATE TABLE b (x int);\nINSERT INTO b VALUES (1);\nSELECT * FROM missing;",
    });
    const test = await freshDatabase();

    const err = await migrate(test.db.pool, dir).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(MigrationError);
    expect((err as Error).message).toMatch(/002_b.*missing/);
    expect(await tableExists(test, "a")).toBe(true);
    expect(await tableExists(test, "b")).toBe(false);
    expect(await recorded(test)).toEqual([{ version: 1, name: "a" }]);

    // Fixed file: the next run picks up where the failed one stopped.
    await writeFile(join(dir, "002_b.sql"), good["002_b.sql"]);
    expect(await migrate(test.db.pool, dir)).toEqual({ applied: ["002_b"] });
    const { rows } = await test.db.pool.query("SELECT x FROM b");
    expect(rows).toEqual([{ x: 1 }]);
  });

  it("refuses a database that has a migration this code does not know", async () => {
    const test = await freshDatabase();
    await migrate(test.db.pool, await migrationsDir({ "1_a.sql": "", "2_b.sql": "" }));
    const older = await migrationsDir({ "1_a.sql": "" });
    await expect(migrate(test.db.pool, older)).rejects.toThrow(/newer than this code/);
    const renamed = await migrationsDir({ "1_a.sql": "", "2_c.sql": "" });
    await expect(migrate(test.db.pool, renamed)).rejects.toThrow(/recorded migration 2 as "b"/);
    // The lock was released: a valid run still goes through.
    const newer = await migrationsDir({ "1_a.sql": "", "2_b.sql": "", "3_c.sql": "" });
    expect(await migrate(test.db.pool, newer)).toEqual({ applied: ["3_c"] });
  });

  it("refuses misnamed and duplicate migration files", async () => {
    const test = await freshDatabase();
    await expect(
      migrate(test.db.pool, await migrationsDir({ "create_things.sql": "" })),
    ).rejects.toThrow(/not named NNN_name.sql/);
    await expect(
      migrate(test.db.pool, await migrationsDir({ "1_a.sql": "", "001_b.sql": "" })),
    ).rejects.toThrow(/share version 1/);
  });

  it("serialises concurrent runs on one pool", async () => {
    const dir = await migrationsDir({ "1_a.sql": "CREATE TABLE a (x int);" });
    const test = await freshDatabase();
    const results = await Promise.all([migrate(test.db.pool, dir), migrate(test.db.pool, dir)]);
    expect(results.flatMap((r) => r.applied)).toEqual(["1_a"]);
  });
});

describeIfPostgres("migrate on PostgreSQL", () => {
  it("applies each migration exactly once when several processes start together", async () => {
    // Not idempotent on purpose: a second application would fail on CREATE TABLE.
    const dir = await migrationsDir({
      "1_a.sql": "CREATE TABLE a (x int); SELECT pg_sleep(0.2);",
      "2_b.sql": "CREATE TABLE b (x int); INSERT INTO b VALUES (1);",
    });
    const test = await freshDatabase();
    expect(test.url).toBeDefined();
    expect(testDatabaseUrl()).toBeDefined();
    // Separate pools stand for separate processes: each has its own sessions.
    const others = await Promise.all([1, 2, 3].map(() => openDatabase({ url: test.url })));
    try {
      const pools = [test.db.pool, ...others.map((o) => o.pool)];
      const results = await Promise.all(pools.map((pool) => migrate(pool, dir)));
      expect(results.flatMap((r) => r.applied).sort()).toEqual(["1_a", "2_b"]);
      expect(await recorded(test)).toEqual([
        { version: 1, name: "a" },
        { version: 2, name: "b" },
      ]);
      const { rows } = await test.db.pool.query("SELECT count(*) AS n FROM b");
      expect(rows).toEqual([{ n: "1" }]);
    } finally {
      await Promise.all(others.map((o) => o.close()));
    }
  });
});

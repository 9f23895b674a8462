import { execFileSync } from "node:child_process";
import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import {
  createTestDatabase,
  describeIfPostgres,
  testDatabaseUrl,
  type TestDatabase,
} from "../../../test/helpers/db.js";
import { availableCredits } from "../../domain/permit-balance.js";
import { openDatabase } from "./database.js";
import { migrate, MigrationError } from "./migrate.js";
import { deploymentId } from "./permit-authorizations.js";

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

  it("gives each database its own deployment id, kept across migrations (issue 28: a payer's signature names it)", async () => {
    const a = await freshDatabase();
    const b = await freshDatabase();
    await migrate(a.db.pool);
    await migrate(b.db.pool);
    const idA = await deploymentId(a.db.pool);
    expect(idA).toMatch(/^dep_[0-9a-f]{32}$/);
    expect(await deploymentId(b.db.pool)).not.toBe(idA);
    await migrate(a.db.pool);
    expect(await deploymentId(a.db.pool)).toBe(idA);
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

// The commit before the SQL functions moved out of the migrations: its migrations, applied in
// order, are the old layout (each function as its last migration defined it).
const OLD_LAYOUT = "4dd06d1";
const REPO = fileURLToPath(new URL("../../../", import.meta.url));
const PG_DIR = fileURLToPath(new URL("./", import.meta.url));

function oldLayoutAvailable(): boolean {
  try {
    execFileSync("git", ["cat-file", "-e", `${OLD_LAYOUT}^{commit}`], {
      cwd: REPO,
      stdio: "ignore",
    });
    return true;
  } catch {
    return false;
  }
}

/** The old layout's migrations 1..`upTo`, extracted from git into a temp dir. */
async function oldMigrations(upTo: number): Promise<string> {
  const prefix = "src/adapters/pg/migrations/";
  const names = execFileSync("git", ["ls-tree", "--name-only", `${OLD_LAYOUT}:${prefix}`], {
    cwd: REPO,
    encoding: "utf8",
  })
    .split("\n")
    .filter((n) => n.endsWith(".sql") && Number(n.slice(0, 3)) <= upTo);
  const files: Record<string, string> = {};
  for (const name of names) {
    files[name] = execFileSync("git", ["show", `${OLD_LAYOUT}:${prefix}${name}`], {
      cwd: REPO,
      encoding: "utf8",
    });
  }
  return migrationsDir(files);
}

/** Every gw_* function of the database: its signature and pg_get_functiondef. */
async function functionDefs(test: TestDatabase): Promise<Record<string, string>> {
  const { rows } = await test.db.pool.query<{ sig: string; def: string }>(
    `SELECT p.oid::regprocedure::text AS sig, pg_get_functiondef(p.oid) AS def
     FROM pg_proc p
     WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'gw\\_%'
     ORDER BY 1`,
  );
  return Object.fromEntries(rows.map((r) => [r.sig, r.def]));
}

const CURRENT_FUNCTIONS = [
  "gw_authority_signal()",
  "gw_batch_reserve(jsonb)",
  "gw_close_batch(jsonb)",
  "gw_close_leased_batch(jsonb)",
  "gw_close_request(text,text,numeric,numeric,numeric,text,text,text,bigint,bigint,numeric,numeric,jsonb,jsonb)",
  "gw_lease_offer(text,text,integer,integer,integer)",
  "gw_lease_permit(text,text,numeric,numeric,numeric,numeric)",
  "gw_permit_available(numeric,numeric,numeric,numeric,numeric)",
  "gw_rate_lease(text,integer,integer,double precision,double precision)",
  "gw_rate_streams(text,text,integer,integer,double precision)",
  "gw_release_holder(text,bigint)",
  "gw_reserve(text,text,text,text,text,text,text,text,boolean,numeric,numeric,numeric,numeric,numeric,integer,bigint,jsonb,text,boolean,bigint)",
  "gw_return_offer_lease(text,text,integer)",
  "gw_return_permit_lease(text,text,numeric)",
  "gw_void_reservation(text,text,text,text,text,text,text,text,boolean,numeric,numeric,text,bigint)",
];

/** The availability rule (functions/ledger.sql), which the old layout wrote out where used. */
const HELPER = "gw_permit_available(numeric,numeric,numeric,numeric,numeric)";

/**
 * Functions newer than the old layout (migration 020, functions/rate-limits.sql; migration 029,
 * functions/authority-signals.sql).
 */
const NEWER = [
  "gw_authority_signal()",
  "gw_rate_lease(text,integer,integer,double precision,double precision)",
  "gw_rate_streams(text,text,integer,integer,double precision)",
];

/**
 * Functions redefined since the old layout, by their current signature and the old layout's
 * (migration 026: the close writes the provider's claim and the gateway's count; migration 030:
 * the reservation records its authorization and holds a capped one's cap, migration 039 its
 * period's too; migration 031: the
 * leased close is set-based and HOT, and a dead holder's open records are closed before its
 * leases go back): compared by name, their definitions are the current files' own.
 */
const CHANGED: Readonly<Record<string, string>> = {
  "gw_reserve(text,text,text,text,text,text,text,text,boolean,numeric,numeric,numeric,numeric,numeric,integer,bigint,jsonb,text,boolean,bigint)":
    "gw_reserve(text,text,text,text,text,text,text,text,boolean,numeric,numeric,numeric,numeric,numeric,integer,bigint,jsonb)",
  "gw_batch_reserve(jsonb)": "gw_reserve_batch(jsonb)",
  "gw_close_batch(jsonb)": "gw_close_batch(jsonb)",
  "gw_close_leased_batch(jsonb)": "gw_close_leased_batch(jsonb)",
  "gw_release_holder(text,bigint)": "gw_release_holder(text,bigint)",
  "gw_close_request(text,text,numeric,numeric,numeric,text,text,text,bigint,bigint,numeric,numeric,jsonb,jsonb)":
    "gw_close_request(text,text,numeric,numeric,numeric,text,text,text,bigint,bigint,numeric,numeric)",
};

/**
 * The old layout's definitions as the current files reproduce them: equal, but for the
 * availability rule written out, which now calls the helper (each rewrite must match exactly
 * as often as listed, or the test fails).
 */
const REWRITES: { fn: string; from: string; to: string; times: number }[] = [
  // gw_reserve and gw_batch_reserve had theirs too, before migration 030 redefined them.
  {
    fn: "gw_lease_permit(",
    from: "IF p_deposit - GREATEST(0, p_chain_settled) < p_need THEN",
    to: "IF gw_permit_available(p_deposit, p_chain_settled, 0, 0, 0) < p_need THEN",
    times: 1,
  },
];

function expectedFromOldLayout(old: Record<string, string>): Record<string, string> {
  const expected = { ...old };
  for (const { fn, from, to, times } of REWRITES) {
    const sig = Object.keys(expected).find((s) => s.startsWith(fn));
    const def = expected[sig ?? ""] ?? "";
    expect({ fn, from, times: def.split(from).length - 1 }).toEqual({ fn, from, times });
    expected[sig!] = def.split(from).join(to);
  }
  // gw_reserve_batch is gw_batch_reserve now (one definition starts with "gw_reserve").
  for (const [sig, def] of Object.entries(expected)) {
    if (!sig.startsWith("gw_reserve_batch(")) continue;
    delete expected[sig];
    expected[sig.replace("gw_reserve_batch", "gw_batch_reserve")] = def.replaceAll(
      "gw_reserve_batch",
      "gw_batch_reserve",
    );
  }
  return Object.fromEntries(Object.entries(expected).sort(([a], [b]) => a.localeCompare(b)));
}

describe("SQL functions", () => {
  it("defines each function in exactly one file under src/adapters/pg, none in a migration", async () => {
    const definedIn = new Map<string, string[]>();
    for (const sub of ["functions", "migrations"]) {
      for (const name of await readdir(join(PG_DIR, sub))) {
        if (!name.endsWith(".sql")) continue;
        const sql = await readFile(join(PG_DIR, sub, name), "utf8");
        for (const m of sql.matchAll(/CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+(\w+)/gi)) {
          const fn = m[1]!.toLowerCase();
          definedIn.set(fn, [...(definedIn.get(fn) ?? []), `${sub}/${name}`]);
        }
      }
    }
    const names = CURRENT_FUNCTIONS.map((sig) => sig.slice(0, sig.indexOf("(")));
    expect([...definedIn.keys()].filter((n) => n.startsWith("gw_")).sort()).toEqual(names);
    for (const [fn, files] of definedIn) {
      expect({ fn, files }).toEqual({ fn, files: [files[0]] });
      expect(files[0]).toMatch(/^functions\//);
    }
  });

  it("re-applies the current definitions on every start", async () => {
    const test = await freshDatabase();
    await migrate(test.db.pool);
    const fresh = await functionDefs(test);
    expect(Object.keys(fresh)).toEqual(CURRENT_FUNCTIONS);
    // A definition changed behind the gateway's back (or left by an older release) is replaced.
    await test.db.pool.query(
      "CREATE OR REPLACE FUNCTION gw_release_holder(p_holder text, p_orphaned_before bigint) " +
        "RETURNS integer LANGUAGE sql AS 'SELECT 42'",
    );
    expect(await migrate(test.db.pool)).toEqual({ applied: [] });
    expect(await functionDefs(test)).toEqual(fresh);
  });

  it("rolls a failing functions file back whole, after the migrations committed", async () => {
    const functions = await migrationsDir({
      "a.sql": "CREATE OR REPLACE FUNCTION gw_a() RETURNS int LANGUAGE sql AS 'SELECT 1';",
      "b.sql":
        "CREATE OR REPLACE FUNCTION gw_b() RETURNS int LANGUAGE sql AS 'SELECT * FROM nope';",
    });
    const dir = await migrationsDir({ "1_a.sql": "CREATE TABLE a (x int);" });
    const test = await freshDatabase();
    const err = await migrate(test.db.pool, dir, functions).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(MigrationError);
    expect((err as Error).message).toMatch(/SQL functions b\.sql failed: .*nope/);
    expect(await recorded(test)).toEqual([{ version: 1, name: "a" }]);
    expect(await functionDefs(test)).toEqual({});
    // The lock was released and the session is usable: the fixed file goes through.
    await writeFile(
      join(functions, "b.sql"),
      "CREATE FUNCTION gw_b() RETURNS int LANGUAGE sql AS 'SELECT 2';",
    );
    expect(await migrate(test.db.pool, dir, functions)).toEqual({ applied: [] });
    expect(Object.keys(await functionDefs(test))).toEqual(["gw_a()", "gw_b()"]);
  });

  it("applies the functions first in the transaction of a migration that asks for them (a trigger names its function)", async () => {
    const functions = await migrationsDir({
      "t.sql":
        "CREATE OR REPLACE FUNCTION gw_t() RETURNS trigger LANGUAGE plpgsql AS " +
        "$$ BEGIN NEW.x := NEW.x + 1; RETURN NEW; END $$;",
    });
    const trigger = "CREATE TRIGGER t BEFORE INSERT ON a FOR EACH ROW EXECUTE FUNCTION gw_t();";
    // Without the marker, a fresh database has no function yet when the trigger is made.
    const plain = await freshDatabase();
    const refused = await migrate(
      plain.db.pool,
      await migrationsDir({ "1_a.sql": "CREATE TABLE a (x int);", "2_t.sql": trigger }),
      functions,
    ).catch((e: unknown) => e);
    expect((refused as Error).message).toMatch(/migration 2_t failed: .*gw_t/);

    const test = await freshDatabase();
    const dir = await migrationsDir({
      "1_a.sql": "CREATE TABLE a (x int);",
      "2_t.sql": `-- migrate: functions first\n${trigger}`,
    });
    expect(await migrate(test.db.pool, dir, functions)).toEqual({ applied: ["1_a", "2_t"] });
    await test.db.pool.query("INSERT INTO a VALUES (1)");
    const { rows } = await test.db.pool.query("SELECT x FROM a");
    expect(rows).toEqual([{ x: 2 }]);
    expect(Object.keys(await functionDefs(test))).toEqual(["gw_t()"]);
  });

  it("gw_permit_available is the availability rule, and the planner inlines it", async () => {
    const test = await freshDatabase();
    await migrate(test.db.pool);
    // deposit, chain settled, charged, settled, reserved -> available, as availableCredits.
    const cases: [bigint, bigint, bigint, bigint, bigint][] = [
      [100n, 30n, 20n, 10n, 5n], // settled on chain beyond ours: 100 - (20 + 20) - 5 = 55
      [100n, 5n, 20n, 10n, 5n], // chain behind our record: 100 - 20 - 5 = 75
      [100n, 0n, 0n, 0n, 0n], // a fresh permit: its deposit
      [10n ** 30n, 3n, 2n * 10n ** 29n, 10n, 7n], // beyond 64 bits
      [50n, 80n, 0n, 0n, 0n], // the chain settled more than the deposit: negative, not clamped
    ];
    for (const [deposit, chainSettled, charged, settled, reserved] of cases) {
      const { rows } = await test.db.pool.query<{ available: string }>(
        "SELECT gw_permit_available($1, $2, $3, $4, $5)::text AS available",
        [deposit, chainSettled, charged, settled, reserved].map(String),
      );
      const expected = availableCredits({ charged, settled, reserved }, deposit, chainSettled);
      expect(rows[0]?.available).toBe(expected.toString());
    }
    expect(
      (await test.db.pool.query("SELECT gw_permit_available(100, 30, 20, 10, 5) AS a")).rows,
    ).toEqual([{ a: "55" }]);
    // Inlined: the plan holds the expression, not a call (a call would cost a function
    // invocation per row and hide the expression from the planner).
    const plan = await test.db.pool.query<{ "QUERY PLAN": string }>(
      `EXPLAIN (VERBOSE, COSTS OFF) UPDATE permit_ledgers SET reserved = reserved + 1
       WHERE permit_id = 'p' AND gw_permit_available(100, 30, charged, settled, reserved) >= 1`,
    );
    const text = plan.rows.map((r) => r["QUERY PLAN"]).join("\n");
    expect(text).toMatch(/GREATEST/);
    expect(text).not.toMatch(/gw_permit_available/);
  });

  it("gw_reserve's admission UPDATEs and gw_lease_permit's v_available write out exactly the helper's body", async () => {
    const sql = await readFile(join(PG_DIR, "functions", "ledger.sql"), "utf8");
    const body = /FUNCTION gw_permit_available\([^)]*\)[^$]*\$\$\s*SELECT (.*?)\s*\$\$/s.exec(
      sql,
    )?.[1];
    expect(body).toBe(
      "p_deposit - (p_charged + GREATEST(0, p_chain_settled - p_settled)) - p_reserved",
    );
    const writtenOut = body!
      .replace("p_charged", "p.charged")
      .replace("p_settled", "p.settled")
      .replace("p_reserved", "p.reserved");
    const reserve = sql.slice(
      sql.search(/FUNCTION gw_reserve\(/),
      sql.search(/FUNCTION gw_close_request\(/),
    );
    expect(reserve.split(`AND ${writtenOut}\n`).length - 1).toBe(2);
    expect(reserve.split("GREATEST").length - 1).toBe(2);
    const leases = await readFile(join(PG_DIR, "functions", "leases.sql"), "utf8");
    const inLease = body!
      .replace("p_charged", "l.charged")
      .replace("p_settled", "l.settled")
      .replace("p_reserved", "l.reserved");
    expect(leases.split(`v_available := ${inLease};\n`).length - 1).toBe(1);
    expect(leases.split("GREATEST").length - 1).toBe(1);
  });

  describe.skipIf(!oldLayoutAvailable())(`against the old layout (commit ${OLD_LAYOUT})`, () => {
    it("a fresh database ends with the old layout's functions, as listed rewritten", async () => {
      const old = await freshDatabase();
      await migrate(old.db.pool, await oldMigrations(999), undefined);
      const oldDefs = await functionDefs(old);
      expect(Object.keys(oldDefs).sort()).toEqual(
        CURRENT_FUNCTIONS.filter((f) => f !== HELPER && !NEWER.includes(f))
          .map((f) => CHANGED[f] ?? f.replace("gw_batch_reserve", "gw_reserve_batch"))
          .sort(),
      );

      const fresh = await freshDatabase();
      await migrate(fresh.db.pool);
      const freshDefs = await functionDefs(fresh);
      const newer = Object.fromEntries(
        [...NEWER, ...Object.keys(CHANGED)].map((f) => [f, freshDefs[f]]),
      );
      const unchanged = Object.fromEntries(
        Object.entries(oldDefs).filter(([sig]) => !Object.values(CHANGED).includes(sig)),
      );
      expect(freshDefs).toEqual({
        ...expectedFromOldLayout(unchanged),
        [HELPER]: freshDefs[HELPER],
        ...newer,
      });
    });

    it("a database of any past version, migrated by this code, ends with the fresh functions", async () => {
      const fresh = await freshDatabase();
      await migrate(fresh.db.pool);
      const freshDefs = await functionDefs(fresh);
      const current = (await readdir(join(PG_DIR, "migrations")))
        .filter((f) => f.endsWith(".sql"))
        .map((f) => Number.parseInt(f, 10));
      // Before any function, with each generation of them, before and after 018's signature change.
      for (const version of [4, 5, 7, 10, 16, 17, 18, 19]) {
        const test = await freshDatabase();
        await migrate(test.db.pool, await oldMigrations(version), undefined);
        const { applied } = await migrate(test.db.pool);
        // Every migration numbered after `version`, counted from the directory.
        expect(applied.length).toBe(current.filter((n) => n > version).length);
        expect({ version, defs: await functionDefs(test) }).toEqual({ version, defs: freshDefs });
        await test.drop();
      }
      // Nine databases, each migrated through every migration: about 60 s on PGlite under
      // load, more with each migration added. The time is the work's, not a bound.
    }, 240_000);
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

import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import {
  createTestDatabase,
  describeIfPostgres,
  testDatabaseUrl,
  useTestDatabase,
} from "../../../test/helpers/db.js";
import { DatabaseOpenError, openDatabase, redactDatabaseUrl } from "./database.js";

describe("redactDatabaseUrl", () => {
  it("hides passwords and keeps the rest", () => {
    expect(redactDatabaseUrl("postgres://app:s3cr%40t@db.example:5432/gw")).toBe(
      "postgres://app:***@db.example:5432/gw",
    );
    expect(redactDatabaseUrl("postgres://db/gw?user=app&password=hunter2")).toBe(
      "postgres://db/gw?user=app&password=***",
    );
    expect(redactDatabaseUrl("postgres://app@db/gw")).toBe("postgres://app@db/gw");
    expect(redactDatabaseUrl("not a url :hunter2@")).toBe("[unparseable database url]");
  });
});

describe("openDatabase on PostgreSQL: a bad URL", () => {
  it("fails at open, and the error does not contain the password", async () => {
    // Nothing listens on port 1.
    const url = "postgres://app:hunter2-secret@127.0.0.1:1/gw";
    const err = await openDatabase({ url }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DatabaseOpenError);
    const text = [
      String(err),
      (err as Error).stack,
      JSON.stringify(err),
      String((err as Error).cause),
      (err as Error & { cause?: Error }).cause?.stack,
    ].join("\n");
    expect((err as Error).message).toContain("postgres://app:***@127.0.0.1:1/gw");
    expect(text).not.toContain("hunter2");
  });

  it("does not leak the password of an unparseable URL", async () => {
    const err = await openDatabase({ url: "postgres://app:hunter2@[bad/gw" }).catch(
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(DatabaseOpenError);
    const cause = (err as Error & { cause?: unknown }).cause;
    const text = [String(err), JSON.stringify(err), String(cause), JSON.stringify(cause)];
    expect(text.join("\n")).not.toContain("hunter2");
  });
});

describe("openDatabase", () => {
  const test = useTestDatabase({ migrate: false });

  it("reports its kind", () => {
    expect(test.db.kind).toBe(testDatabaseUrl() === undefined ? "pglite" : "postgres");
  });

  it("leaves int8 and numeric as strings, so no precision is lost", async () => {
    const { rows } = await test.db.pool.query(
      "SELECT 9223372036854775807::int8 AS big, 12345678901234567890.123456789::numeric AS dec, count(*) AS n FROM (VALUES (1)) v",
    );
    expect(rows).toEqual([
      { big: "9223372036854775807", dec: "12345678901234567890.123456789", n: "1" },
    ]);
  });

  it("keeps working after failed queries", async () => {
    // pg-pool destroys the client after an error; the replacement must connect cleanly.
    for (let i = 0; i < 20; i++) {
      await expect(test.db.pool.query("SELECT 1/0")).rejects.toThrow(/division by zero/);
      const { rows } = await test.db.pool.query("SELECT $1::int AS i", [i]);
      expect(rows).toEqual([{ i }]);
    }
  });

  it("rolls back a transaction whose client was destroyed", async () => {
    await test.db.pool.query("CREATE TABLE IF NOT EXISTS rollback_probe (x int)");
    const client = await test.db.pool.connect();
    await client.query("BEGIN");
    await client.query("INSERT INTO rollback_probe VALUES (1)");
    client.release(new Error("abandon"));
    const { rows } = await test.db.pool.query("SELECT count(*) AS n FROM rollback_probe");
    expect(rows).toEqual([{ n: "0" }]);
  });
});

describeIfPostgres("openDatabase on PostgreSQL: a connection lost while checked out", () => {
  const test = useTestDatabase({ migrate: false });

  it("is logged and fails its holder's next query; it does not stop the process", async () => {
    // pg-pool listens for 'error' only on idle clients: without the gateway's own listener the
    // server ending a checked-out client's connection is an uncaught exception (a CI run saw
    // one when the database fault test killed every backend).
    const logged: { obj: object; msg?: string }[] = [];
    const record = (obj: object, msg?: string) => logged.push({ obj, msg });
    const db = await openDatabase({ url: test.url!, logger: { info: record, warn: record } });
    try {
      const client = await db.pool.connect();
      const { rows } = await client.query<{ pid: number }>("SELECT pg_backend_pid() AS pid");
      const ended = new Promise((resolve) => client.once("end", resolve));
      await db.pool.query("SELECT pg_terminate_backend($1)", [rows[0]!.pid]);
      await ended;
      expect(logged.map((l) => l.msg)).toContain("database connection in use failed");
      await expect(client.query("SELECT 1")).rejects.toThrow();
      client.release(true);
      const again = await db.pool.query<{ one: number }>("SELECT 1 AS one");
      expect(again.rows).toEqual([{ one: 1 }]);
    } finally {
      await db.close();
    }
  });
});

describe("openDatabase with embedded PGlite", () => {
  const dirs: string[] = [];
  afterAll(async () => {
    await Promise.all(dirs.map((d) => rm(d, { recursive: true, force: true })));
  });

  it("persists to dataDir, creating it, and closes idempotently", async () => {
    const parent = await mkdtemp(join(tmpdir(), "gw-pglite-"));
    dirs.push(parent);
    const dataDir = join(parent, "nested", "data");
    const logged: { obj: object; msg?: string }[] = [];
    const logger = { info: (obj: object, msg?: string) => logged.push({ obj, msg }) };

    const first = await openDatabase({ dataDir, logger });
    expect(first.kind).toBe("pglite");
    await first.pool.query("CREATE TABLE kept (x int); INSERT INTO kept VALUES (7)");
    await first.close();
    await first.close();
    expect(logged).toContainEqual({
      obj: { kind: "pglite", dataDir },
      msg: "database started",
    });

    const second = await openDatabase({ dataDir });
    try {
      const { rows } = await second.pool.query("SELECT x FROM kept");
      expect(rows).toEqual([{ x: 7 }]);
    } finally {
      await second.close();
    }
  });
});

describeIfPostgres("openDatabase on PostgreSQL", () => {
  it("opens a pool on the URL and closes idempotently", async () => {
    const db = await openDatabase({ url: testDatabaseUrl() });
    expect(db.kind).toBe("postgres");
    expect((await db.pool.query("SELECT 1 AS one")).rows).toEqual([{ one: 1 }]);
    await db.close();
    await db.close();
  });
});

describeIfPostgres("openDatabase on PostgreSQL with timeouts", () => {
  it("cancels a statement that runs longer than the statement timeout", async () => {
    const test = await createTestDatabase({ migrate: false });
    const db = await openDatabase({
      url: test.url!,
      timeouts: { statementMs: 200, queryMs: 5000, connectMs: 2000 },
    });
    try {
      await expect(db.pool.query("SELECT pg_sleep(2)")).rejects.toThrow(/statement timeout/);
      const { rows } = await db.pool.query<{ one: number }>("SELECT 1 AS one");
      expect(rows[0]?.one).toBe(1);
    } finally {
      await db.close();
      await test.drop();
    }
  });
});

/**
 * The gateway behind PgBouncer in transaction pooling mode (issue 21): what the pooler refuses
 * or silently breaks, and the direct connection that carries what needs a session. The money
 * suites themselves run through the pooler with `npm run test:pgbouncer`.
 */
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { once } from "node:events";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { setTimeout as sleep } from "node:timers/promises";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openDatabase, type Database, type DatabaseLogger } from "../src/adapters/pg/database.js";
import { createPgLeaseSignals, type PgLeaseSignals } from "../src/adapters/pg/lease-signals.js";
import { migrate } from "../src/adapters/pg/migrate.js";
import { pgbouncerSkipReason, startPgBouncer, type PgBouncer } from "./helpers/pgbouncer.js";
import { eventually } from "./helpers/stack.js";

const skip = pgbouncerSkipReason();
if (skip !== undefined) console.warn(`test/pgbouncer.test.ts skipped: ${skip}`);

const timeouts = { statementMs: 300, queryMs: 5_000, connectMs: 5_000 };

describe.skipIf(skip !== undefined)("behind PgBouncer (transaction pooling)", () => {
  const serverUrl = process.env.TEST_DATABASE_URL!;
  const name = `gw_test_${randomBytes(6).toString("hex")}`;
  // Without a statement_timeout default (a default set later would reach only the pooler's new
  // server connections, so each case has its own database).
  const bare = `gw_test_${randomBytes(6).toString("hex")}`;
  let bouncer: PgBouncer;
  let pooledUrl: string;
  const opened: Database[] = [];
  const signals: PgLeaseSignals[] = [];

  const admin = async (sql: string) => {
    const client = new pg.Client({ connectionString: serverUrl });
    await client.connect();
    try {
      await client.query(sql);
    } finally {
      await client.end();
    }
  };
  const open = async (logger?: DatabaseLogger, database = name) => {
    const direct = new URL(serverUrl);
    direct.pathname = `/${database}`;
    const db = await openDatabase({
      url: bouncer.url(database),
      directUrl: direct.toString(),
      timeouts,
      ...(logger === undefined ? {} : { logger }),
    });
    opened.push(db);
    return db;
  };

  beforeAll(async () => {
    await admin(`CREATE DATABASE ${name}`);
    // What the operator does (docs/operations.md): the timeout as the role's or database's
    // default, since it cannot be sent through the pooler.
    await admin(`ALTER DATABASE ${name} SET statement_timeout = ${timeouts.statementMs}`);
    await admin(`CREATE DATABASE ${bare}`);
    bouncer = await startPgBouncer(serverUrl);
    pooledUrl = bouncer.url(name);
  });

  afterAll(async () => {
    for (const s of signals) await s.close();
    for (const db of opened) await db.close();
    await bouncer?.stop();
    await admin(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await admin(`DROP DATABASE IF EXISTS ${bare} WITH (FORCE)`);
  });

  it("opens with the statement timeout as the database's default, never as a startup parameter", async () => {
    // What the gateway did before: statement_timeout in the startup packet, which PgBouncer
    // refuses outright.
    await expect(openDatabase({ url: pooledUrl, timeouts })).rejects.toThrow(
      "unsupported startup parameter: statement_timeout",
    );

    // Told that the URL is a pooler (a direct URL beside it), it opens; where no default is
    // set, it says so at start.
    const warnings: { obj: object; msg: string | undefined }[] = [];
    const logger: DatabaseLogger = {
      info: () => undefined,
      warn: (obj, msg) => void warnings.push({ obj, msg }),
    };
    await open(logger, bare);
    expect(warnings).toHaveLength(1);
    expect(warnings[0]!.obj).toEqual({ statementTimeoutMs: 0, expectedMs: 300 });
    expect(warnings[0]!.msg).toContain("ALTER ROLE <user> SET statement_timeout = 300");

    // With the default set, it holds through the pooler: no warning, and a slow statement is
    // cancelled by the server.
    warnings.length = 0;
    const db = await open(logger);
    expect(warnings).toEqual([]);
    const { rows } = await db.pool.query<{ app: string }>(
      "SELECT current_setting('application_name') AS app",
    );
    expect(rows[0]!.app).toBe("model-market-gateway");
    await expect(db.pool.query("SELECT pg_sleep(2)")).rejects.toMatchObject({ code: "57014" });
  });

  it("migrates on the direct connection: concurrent starts apply each migration once", async () => {
    const [a, b] = [await open(), await open()];
    expect(a.session).not.toBe(a.pool);
    const results = await Promise.all([migrate(a.session), migrate(b.session)]);
    const applied = results.flatMap((r) => r.applied);
    const { rows } = await a.pool.query<{ n: string }>(
      "SELECT count(*) AS n FROM schema_migrations",
    );
    expect(applied.length).toBe(Number(rows[0]!.n));
    expect(new Set(applied).size).toBe(applied.length);
    expect(Number(rows[0]!.n)).toBeGreaterThan(10);
    // The session lock is given back: nothing holds an advisory lock afterwards.
    const locks = await a.session.query<{ n: string }>(
      "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory'",
    );
    expect(locks.rows[0]!.n).toBe("0");
  });

  it("recalls leases over LISTEN on the direct connection, NOTIFY through the pooler", async () => {
    const [a, b] = [await open(), await open()];
    const holder = createPgLeaseSignals(b, { instanceId: "b", waitMs: 10_000 });
    const asker = createPgLeaseSignals(a, { instanceId: "a", waitMs: 10_000 });
    signals.push(holder, asker);
    await Promise.all([holder.ready(), asker.ready()]);
    const heard: string[] = [];
    holder.onRecall((key) => {
      heard.push(key);
      void holder.answer(key);
    });
    const started = Date.now();
    await asker.recall("permit:0xabc");
    expect(heard).toEqual(["permit:0xabc"]);
    // Answered, not timed out (10 s).
    expect(Date.now() - started).toBeLessThan(3_000);

    // What a LISTEN through the pooler does: the server connection goes back to PgBouncer's
    // pool after the statement, and the notifications never reach the listener.
    const deaf = createPgLeaseSignals({ pool: b.pool, session: b.pool }, { instanceId: "c" });
    signals.push(deaf);
    await deaf.ready();
    const missed: string[] = [];
    deaf.onRecall((key) => missed.push(key));
    const quick = createPgLeaseSignals(a, { instanceId: "d", waitMs: 1_000 });
    signals.push(quick);
    await quick.ready();
    heard.length = 0;
    await quick.recall("permit:0xdef");
    await sleep(200);
    expect(heard).toEqual(["permit:0xdef"]); // the direct listener hears it
    expect(missed).toEqual([]); // the pooled one does not
  });

  it("a test process ended by a signal leaves no PgBouncer running", async () => {
    // A vitest worker ended with a signal fires no `exit` event: its PgBouncer used to stay.
    const dir = await mkdtemp(join(tmpdir(), "gw-bouncer-owner-"));
    const script = join(dir, "owner.mts");
    const helper = pathToFileURL(join(import.meta.dirname, "helpers", "pgbouncer.ts")).href;
    await writeFile(
      script,
      `import { startPgBouncer } from ${JSON.stringify(helper)};\n` +
        `const b = await startPgBouncer(process.env.OWNER_URL!);\n` +
        `console.log(b.port);\nsetInterval(() => {}, 1000);\n`,
    );
    const owner = spawn(process.execPath, ["--import", "tsx", script], {
      env: { ...process.env, OWNER_URL: serverUrl },
      stdio: ["ignore", "pipe", "inherit"],
    });
    try {
      const [line] = (await Promise.race([
        once(owner.stdout!, "data"),
        once(owner, "exit").then(([code]) => {
          throw new Error(`the owner process exited with ${String(code)} before its PgBouncer ran`);
        }),
      ])) as [Buffer];
      const port = Number(line.toString().trim());
      expect(await accepts(port)).toBe(true);
      owner.kill("SIGKILL");
      await eventually(async () => !(await accepts(port)), 10_000, 50);
    } finally {
      owner.kill("SIGKILL");
      await rm(dir, { recursive: true, force: true });
    }
  });
});

/** Whether something accepts TCP connections on 127.0.0.1:`port`. */
function accepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(port, "127.0.0.1");
    socket.once("connect", () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => resolve(false));
  });
}

import { mkdir } from "node:fs/promises";
import { BaseError } from "../../domain/base-error.js";
import { resolve as resolvePath } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import type { PGlite } from "@electric-sql/pglite";
import type { PGLiteSocketServer } from "@electric-sql/pglite-socket";
import pg from "pg";

// No global type parsers are installed on purpose: `pg` already returns int8 (count(*), sums)
// and numeric as strings, and money in this project is bigint or decimal strings, so a parser
// that turned them into JS numbers would silently lose precision.

/** The minimal logger `openDatabase` needs; a pino logger fits. */
export interface DatabaseLogger {
  info(obj: object, msg?: string): void;
  warn?(obj: object, msg?: string): void;
}

export interface OpenDatabaseOptions {
  /** A PostgreSQL connection string. Without it an embedded PGlite is used. */
  url?: string;
  /**
   * PostgreSQL only: a connection string that reaches the server directly, when `url` goes
   * through a pooler in transaction mode (PgBouncer). What needs a session of its own uses it
   * ({@link Database.session}: migrations' advisory lock, LISTEN), and the pool then sends no
   * startup parameter the pooler refuses (`statement_timeout`). Same as `url` when absent.
   */
  directUrl?: string;
  /** Where the embedded PGlite keeps its files; in memory when absent. Ignored with `url`. */
  dataDir?: string;
  logger?: DatabaseLogger;
  /**
   * PostgreSQL only: the server's `statement_timeout` (set per connection at startup; behind a
   * pooler, the role's or database's default, which is checked, see `directUrl`), the
   * client's `query_timeout`, and the wait for a pooled connection (`connectionTimeoutMillis`;
   * 10 s without this). Keep `queryMs` above `statementMs`, so that the server cancels a slow
   * statement and the connection survives; the client's timeout is for a server that cannot
   * answer at all. The embedded PGlite ignores them (see {@link servePglite}).
   */
  timeouts?: { statementMs: number; queryMs: number; connectMs: number };
}

/**
 * One database, whatever backs it: adapters only ever see `pool`, so the same queries run on a
 * real PostgreSQL and on the embedded PGlite.
 */
export interface Database {
  pool: pg.Pool;
  /**
   * For what holds a session across transactions (a session advisory lock, LISTEN): a pool on
   * the direct URL when `pool` goes through a transaction pooler, else `pool` itself. Ordinary
   * queries and transactions use `pool`.
   */
  session: pg.Pool;
  kind: "postgres" | "pglite";
  /** Ends the pool and, for PGlite, the socket server and the database. Idempotent. */
  close(): Promise<void>;
}

/** Opening the database failed; the message never contains a password. */
export class DatabaseOpenError extends BaseError {
  override readonly name = "DatabaseOpenError";
  readonly reason = "database_unavailable";
}

/**
 * Opens the database: a `pg.Pool` on `url`, checked with `SELECT 1` so that a wrong URL fails
 * here rather than on the first request; or, without `url`, an embedded PGlite served over a
 * local socket so that the same `pg` code talks to it.
 */
export async function openDatabase(opts: OpenDatabaseOptions = {}): Promise<Database> {
  if (opts.url !== undefined) {
    const direct = opts.directUrl === opts.url ? undefined : opts.directUrl;
    return openPostgres(opts.url, direct, opts.logger, opts.timeouts);
  }
  let dataDir: string | undefined;
  if (opts.dataDir !== undefined) {
    dataDir = resolvePath(opts.dataDir);
    await mkdir(dataDir, { recursive: true });
  }
  // Loaded only for the embedded database: a gateway on PostgreSQL never needs it.
  const { PGlite } = await import("@electric-sql/pglite");
  const pglite = await PGlite.create(dataDir === undefined ? {} : { dataDir });
  return servePglite(pglite, { logger: opts.logger, label: dataDir ?? "memory" });
}

async function openPostgres(
  url: string,
  directUrl: string | undefined,
  logger: DatabaseLogger | undefined,
  timeouts: OpenDatabaseOptions["timeouts"],
): Promise<Database> {
  const pooled = directUrl !== undefined;
  const pool = await openPool(url, logger, {
    max: 10,
    // Also bounds the wait for a free client when all ten are busy: fail rather than hang.
    connectionTimeoutMillis: timeouts?.connectMs ?? 10_000,
    // A transaction pooler refuses unknown startup parameters ("unsupported startup parameter:
    // statement_timeout"), and a session SET would leak to whoever gets the server connection
    // next: behind it the timeout is the role's (or database's) default, checked below.
    ...(timeouts === undefined ? {} : { query_timeout: timeouts.queryMs }),
    ...(timeouts === undefined || pooled ? {} : { statement_timeout: timeouts.statementMs }),
    idleTimeoutMillis: 30_000,
  });
  if (!pooled) {
    logger?.info({ kind: "postgres", url: redactDatabaseUrl(url) }, "database connected");
    return { pool, session: pool, kind: "postgres", close: once(() => pool.end()) };
  }
  let session: pg.Pool;
  try {
    // Migrations (one client, for the run) and the lease-recall listener (one, for the life of
    // the process): two is enough, and an idle one is let go soon.
    session = await openPool(directUrl, logger, {
      max: 2,
      connectionTimeoutMillis: timeouts?.connectMs ?? 10_000,
      idleTimeoutMillis: 10_000,
    });
  } catch (err) {
    await pool.end().catch(() => {});
    throw err;
  }
  const close = once(async () => {
    await Promise.all([pool.end(), session.end()]);
  });
  if (timeouts !== undefined) {
    try {
      await checkStatementTimeout(pool, timeouts.statementMs, logger);
    } catch (err) {
      await close().catch(() => {});
      throw new DatabaseOpenError(
        `cannot read statement_timeout through ${redactDatabaseUrl(url)}: ${scrub(err, passwordOf(url))}`,
        { cause: sanitizeCause(err, passwordOf(url)) },
      );
    }
  }
  logger?.info(
    { kind: "postgres", url: redactDatabaseUrl(url), directUrl: redactDatabaseUrl(directUrl) },
    "database connected through a transaction pooler",
  );
  return { pool, session, kind: "postgres", close };
}

/** A pg.Pool on `url`, checked with `SELECT 1`; errors name the URL without its password. */
async function openPool(
  url: string,
  logger: DatabaseLogger | undefined,
  config: pg.PoolConfig,
): Promise<pg.Pool> {
  const safeUrl = redactDatabaseUrl(url);
  const password = passwordOf(url);
  let pool: pg.Pool;
  try {
    pool = new pg.Pool({
      connectionString: url,
      ...config,
      application_name: "model-market-gateway",
    });
  } catch (err) {
    throw new DatabaseOpenError(`invalid database url ${safeUrl}: ${scrub(err, password)}`, {
      cause: sanitizeCause(err, password),
    });
  }
  guardClients(pool, logger, password);
  try {
    await pool.query("SELECT 1");
  } catch (err) {
    await pool.end().catch(() => {});
    throw new DatabaseOpenError(`cannot connect to ${safeUrl}: ${scrub(err, password)}`, {
      cause: sanitizeCause(err, password),
    });
  }
  return pool;
}

/**
 * Behind a transaction pooler the gateway cannot set `statement_timeout` itself: it warns when
 * the server's default for its role and database is not the configured one, so that an
 * operator who forgot `ALTER ROLE ... SET statement_timeout` learns of it at start.
 */
async function checkStatementTimeout(
  pool: pg.Pool,
  statementMs: number,
  logger: DatabaseLogger | undefined,
): Promise<void> {
  const { rows } = await pool.query<{ ms: string }>(
    "SELECT setting AS ms FROM pg_settings WHERE name = 'statement_timeout'",
  );
  const actualMs = Number(rows[0]?.ms);
  if (actualMs === statementMs) return;
  const entry = { statementTimeoutMs: actualMs, expectedMs: statementMs };
  const msg =
    "statement_timeout through the pooler is not DB_STATEMENT_TIMEOUT_MS: set it as the " +
    `role's default (ALTER ROLE <user> SET statement_timeout = ${statementMs})`;
  if (logger?.warn) logger.warn(entry, msg);
  else logger?.info(entry, msg);
}

/**
 * Serves an already created PGlite over a local TCP socket and returns a Database that owns it
 * (closing the Database closes `pglite`). Exported so tests can start PGlite from a snapshot.
 *
 * PGlite is a single-connection database. The socket server can multiplex several clients, but
 * that gives wrong results, so both the server and the pool allow exactly one connection.
 */
export async function servePglite(
  pglite: PGlite,
  opts: { logger?: DatabaseLogger | undefined; label?: string } = {},
): Promise<Database> {
  const { PGLiteSocketServer } = await import("@electric-sql/pglite-socket");
  const server = new PGLiteSocketServer({
    db: pglite,
    host: "127.0.0.1",
    port: 0,
    maxConnections: 1,
  });
  let pool: pg.Pool | undefined;
  const close = once(async () => {
    try {
      await pool?.end();
    } finally {
      try {
        await server.stop();
      } finally {
        await pglite.close();
      }
    }
  });
  try {
    // start() resolves once listening and records the port the OS picked for port 0;
    // getServerConn() then reports it as "127.0.0.1:<port>".
    await server.start();
    const port = Number(server.getServerConn().split(":").pop());
    if (!Number.isInteger(port) || port <= 0) {
      throw new Error(`PGlite socket server reported no port (${server.getServerConn()})`);
    }
    pool = new pg.Pool({
      host: "127.0.0.1",
      port,
      user: "postgres",
      database: "postgres",
      max: 1,
      // Never drop the one idle connection: reconnecting is where the race below lives.
      idleTimeoutMillis: 0,
      // No statement, query or connection timeouts (openDatabase's `timeouts` are PostgreSQL
      // only). PGlite is one connection in this process, so nothing else can hold a lock a
      // query waits for, and a query is only ever slow because it is working. Every query waits
      // for the one connection behind all the others, whatever holds it (a migration run, the
      // indexer's transaction over a block's events): a connectionTimeoutMillis would have to be
      // larger than the longest such legitimate wait, which nothing bounds, so there is none. A
      // client-side query_timeout would drop the one connection while PGlite is still running
      // the query, and the replacement would wait for it anyway. What stays bounded is admission:
      // the ledger batcher refuses a write still queued after LEDGER_QUEUE_WAIT_MS.
      Client: clientWaitingForFreeSlot(server),
    });
    guardClients(pool, opts.logger, undefined);
    await pool.query("SELECT 1");
    opts.logger?.info({ kind: "pglite", dataDir: opts.label ?? "memory" }, "database started");
    return { pool, session: pool, kind: "pglite", close };
  } catch (err) {
    await close().catch(() => {});
    throw new DatabaseOpenError(`cannot start embedded PGlite: ${scrub(err, undefined)}`, {
      cause: err,
    });
  }
}

/**
 * A pg.Client that, before connecting, waits until the PGlite socket server has let go of the
 * previous connection. pg-pool destroys a client whenever a query through `pool.query` fails
 * (it calls `release(err)`), and it opens the replacement at once; the server only notices the
 * old socket closing on a later tick, so with `maxConnections: 1` it would reject the new one
 * and the next query would fail with "Connection terminated unexpectedly".
 */
function clientWaitingForFreeSlot(server: PGLiteSocketServer): new () => pg.Client {
  const waitForFreeSlot = async (): Promise<void> => {
    const deadline = Date.now() + 5_000;
    while (server.getStats().activeConnections > 0 && Date.now() < deadline) {
      await sleep(1);
    }
  };
  return class PgliteSocketClient extends pg.Client {
    override connect(): Promise<pg.Client>;
    override connect(callback: ((err: Error) => void) | ((err: null, c: pg.Client) => void)): void;
    override connect(
      callback?: ((err: Error) => void) | ((err: null, c: pg.Client) => void),
    ): Promise<pg.Client> | void {
      if (callback === undefined) return waitForFreeSlot().then(() => super.connect());
      void waitForFreeSlot().then(() => super.connect(callback));
    }
  };
}

/**
 * The URL with its password (in the userinfo or a `password` parameter) replaced by `***`,
 * fit for logs and error messages.
 */
export function redactDatabaseUrl(url: string): string {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return "[unparseable database url]";
  }
  if (parsed.password !== "") parsed.password = "***";
  for (const key of ["password", "sslpassword"]) {
    if (parsed.searchParams.has(key)) parsed.searchParams.set(key, "***");
  }
  return parsed.toString();
}

function passwordOf(url: string): string | undefined {
  try {
    const parsed = new URL(url);
    const password = parsed.password || parsed.searchParams.get("password") || undefined;
    return password === undefined ? undefined : safeDecode(password);
  } catch {
    return undefined;
  }
}

function safeDecode(s: string): string {
  try {
    return decodeURIComponent(s);
  } catch {
    return s;
  }
}

/** The error's message with the password (raw or URL-encoded) cut out. */
function scrub(err: unknown, password: string | undefined): string {
  const message = err instanceof Error ? err.message : String(err);
  return scrubText(message, password);
}

function scrubText(text: string, password: string | undefined): string {
  if (password === undefined || password === "") return text;
  let out = text;
  for (const secret of new Set([password, encodeURIComponent(password)])) {
    out = out.split(secret).join("***");
  }
  return out;
}

/**
 * Keeps the original error as `cause` unless anything in it mentions the password (Node's
 * ERR_INVALID_URL, for one, carries the whole input URL), in which case a scrubbed copy is kept.
 */
function sanitizeCause(err: unknown, password: string | undefined): unknown {
  if (password === undefined || password === "" || !(err instanceof Error)) return err;
  const leaks = [err.message, err.stack ?? "", ...Object.values(err).map(String)].some(
    (v) => v.includes(password) || v.includes(encodeURIComponent(password)),
  );
  if (!leaks) return err;
  const copy = new Error(scrubText(err.message, password));
  copy.name = err.name;
  const code = (err as { code?: unknown }).code;
  if (code !== undefined) Object.assign(copy, { code });
  return copy;
}

/**
 * Listens for every client's connection failing, idle or checked out; without a listener an
 * 'error' event is an uncaught exception that stops the process. pg-pool itself listens only
 * while a client is idle (it drops such a client, and re-emits the error on the pool, which is
 * why the pool gets a listener too; this one logs). A client that is checked out (inside a
 * transaction, between two of its queries) and loses its connection to a server restart or
 * `pg_terminate_backend` would otherwise stop the gateway. With the listener the holder learns
 * of it from its next query, which rejects, and it releases the client as broken.
 */
function guardClients(
  pool: pg.Pool,
  logger: DatabaseLogger | undefined,
  password: string | undefined,
): void {
  pool.on("error", () => {});
  pool.on("connect", (client) => {
    client.on("error", (err) => {
      const entry = { err: { name: err.name, message: scrub(err, password) } };
      if (logger?.warn) logger.warn(entry, "database connection in use failed");
      else logger?.info(entry, "database connection in use failed");
    });
  });
}

function once(fn: () => Promise<void>): () => Promise<void> {
  let done: Promise<void> | undefined;
  return () => (done ??= fn());
}

import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, rmSync } from "node:fs";
import { chown, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import pg from "pg";

/** Debian's `pgbouncer` package installs it here; PGBOUNCER_BIN names another. */
export function pgbouncerBinary(): string | undefined {
  const candidates = [process.env.PGBOUNCER_BIN, "/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"];
  return candidates.find((path) => path !== undefined && path !== "" && existsSync(path));
}

/** Why a PgBouncer suite skips, or undefined when it can run. */
export function pgbouncerSkipReason(): string | undefined {
  if (!process.env.TEST_DATABASE_URL) return "no PostgreSQL (TEST_DATABASE_URL is not set)";
  if (pgbouncerBinary() === undefined) {
    return "pgbouncer is not installed (apt-get install pgbouncer, or set PGBOUNCER_BIN)";
  }
  return undefined;
}

export interface PgBouncer {
  readonly port: number;
  /** The pooler's URL for `database` on the server (same user, no password: trust). */
  url(database: string): string;
  /** Stops the process and removes its directory. Idempotent. */
  stop(): Promise<void>;
  /** The same without waiting, for a process `exit` handler. */
  kill(): void;
}

/**
 * Starts PgBouncer in transaction pooling mode on a free port, in front of `serverUrl`'s server
 * (every database on it, through the `*` fallback entry). Its ini, userlist, log and pid file
 * live in a temporary directory. Authentication is `trust`, matching the local server's; the
 * userlist names the one user, as PgBouncer requires even then. PgBouncer refuses to run as
 * root: as root it is started with `-u postgres` (or PGBOUNCER_USER).
 */
export async function startPgBouncer(serverUrl: string): Promise<PgBouncer> {
  const binary = pgbouncerBinary();
  if (binary === undefined) throw new Error(pgbouncerSkipReason());
  const server = new URL(serverUrl);
  const user = decodeURIComponent(server.username || "postgres");
  const dir = await mkdtemp(join(tmpdir(), "gw-pgbouncer-"));
  const runAs = process.getuid?.() === 0 ? (process.env.PGBOUNCER_USER ?? "postgres") : undefined;
  let lastError: unknown;
  // The free port is found by binding port 0 and letting it go: another process may take it in
  // between, so a start that does not come up is tried again on a new port.
  for (let attempt = 0; attempt < 3; attempt++) {
    const port = await freePort();
    const ini = join(dir, "pgbouncer.ini");
    await writeFile(
      ini,
      [
        "[databases]",
        `* = host=${server.hostname} port=${server.port || "5432"}`,
        "[pgbouncer]",
        "listen_addr = 127.0.0.1",
        `listen_port = ${port}`,
        "unix_socket_dir =",
        "auth_type = trust",
        `auth_file = ${join(dir, "userlist.txt")}`,
        "pool_mode = transaction",
        // A gateway's pool is 10 clients; some suites run two or three processes on one
        // database, and the server is shared: 20 server connections per database at most, let
        // go after 5 idle seconds.
        "max_client_conn = 400",
        "default_pool_size = 20",
        "server_idle_timeout = 5",
        `logfile = ${join(dir, "pgbouncer.log")}`,
        `pidfile = ${join(dir, "pgbouncer.pid")}`,
        "",
      ].join("\n"),
    );
    await writeFile(join(dir, "userlist.txt"), `"${user}" ""\n`);
    if (runAs !== undefined) await chownAll(dir, runAs);
    const child = spawn(
      "sh",
      ["-c", watchdog, "sh", binary, ...(runAs === undefined ? [] : ["-u", runAs]), ini],
      { stdio: ["pipe", "ignore", "pipe"] },
    );
    let stderr = "";
    child.stderr?.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    const url = (database: string) => {
      const u = new URL(serverUrl);
      u.hostname = "127.0.0.1";
      u.port = String(port);
      u.pathname = `/${database}`;
      return u.toString();
    };
    try {
      await waitUntilServing(child, url(server.pathname.slice(1) || "postgres"));
    } catch (error) {
      child.stdin?.destroy();
      child.kill("SIGKILL");
      const log = await readFile(join(dir, "pgbouncer.log"), "utf8").catch(() => "");
      lastError = new Error(`pgbouncer did not start: ${String(error)}\n${stderr}\n${log}`);
      continue;
    }
    let stopped: Promise<void> | undefined;
    const running = () => child.exitCode === null && child.signalCode === null;
    const stop = () =>
      (stopped ??= (async () => {
        if (running()) {
          const exited = new Promise((resolve) => child.once("exit", resolve));
          child.stdin?.end(); // the watchdog's SIGTERM: immediate shutdown (SIGINT would wait)
          await exited;
        }
        await rm(dir, { recursive: true, force: true });
      })());
    const kill = () => {
      child.stdin?.destroy();
      rmSync(dir, { recursive: true, force: true });
    };
    return { port, url, stop, kill };
  }
  await rm(dir, { recursive: true, force: true });
  throw lastError;
}

/**
 * PgBouncer runs under this shell, which stops it (SIGTERM) once the test process's end of the
 * shell's stdin closes: at `stop()`, and however the test process ends (a vitest worker ended
 * with a signal fires no `exit` event, and left its PgBouncer running). The shell exits with
 * PgBouncer. Its stdin is kept as fd 3: a background list's stdin is /dev/null.
 */
const watchdog =
  'exec 3<&0; "$@" </dev/null & pid=$!; (cat <&3 >/dev/null; kill "$pid" 2>/dev/null) & wait "$pid"';

async function waitUntilServing(child: ChildProcess, url: string): Promise<void> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`exited with ${child.exitCode}`);
    const client = new pg.Client({ connectionString: url });
    client.on("error", () => undefined);
    try {
      await client.connect();
      await client.query("SELECT 1");
      await client.end();
      return;
    } catch (error) {
      await client.end().catch(() => undefined);
      if (Date.now() > deadline) throw error;
      await sleep(50);
    }
  }
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      const port = typeof address === "object" && address !== null ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}

async function chownAll(dir: string, user: string): Promise<void> {
  const { execFileSync } = await import("node:child_process");
  const uid = Number(execFileSync("id", ["-u", user]).toString().trim());
  const gid = Number(execFileSync("id", ["-g", user]).toString().trim());
  await chown(dir, uid, gid);
  for (const file of ["pgbouncer.ini", "userlist.txt"]) await chown(join(dir, file), uid, gid);
}

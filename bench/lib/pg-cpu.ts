import { execFileSync } from "node:child_process";
import { readFile } from "node:fs/promises";
import pg from "pg";

/**
 * PostgreSQL's CPU time for the bench database, read from the kernel: the server runs on this
 * machine (as another user), and `/proc/<pid>/stat` is world-readable, so the runner can add up
 * `utime + stime` of the backends serving the bench database without any extension or server
 * setting.
 *
 * A snapshot lists the backends of the database (`pg_stat_activity.datname`) and reads each one's
 * CPU ticks. The CPU between two snapshots is, per backend (a pid together with its start time,
 * so a reused pid is a new backend):
 * - present in both: after - before;
 * - present only at the end (connected during the window): all of its CPU, counted from zero;
 * - present only at the start (disconnected during the window): nothing, as its last ticks are
 *   gone with it. The snapshot reports how many there were, so a figure that lost some says so.
 *
 * The gateway's pool keeps its connections open under load, so the last case is rare. The shared
 * server processes (WAL writer, checkpointer, background writer) also work for the bench, but
 * they serve every database of the server (other work on the machine included), so they are
 * reported beside the figure (`backgroundMs`), not in it.
 */

export interface BackendTicks {
  readonly pid: number;
  /** Process start time (clock ticks after boot): tells a reused pid from the backend it was. */
  readonly start: number;
  /** utime + stime, clock ticks. */
  readonly ticks: number;
}

export interface PgCpuSnapshot {
  readonly at: bigint;
  readonly backends: readonly BackendTicks[];
  readonly background: readonly BackendTicks[];
}

export interface PgCpuFigures {
  /** CPU ms of the bench database's backends over the window. */
  readonly cpuMs: number;
  /** The same over the window's wall time, in cores. */
  readonly cores: number;
  readonly backendsAtStart: number;
  readonly backendsAtEnd: number;
  /** Backends that connected during the window (counted from zero). */
  readonly appeared: number;
  /** Backends that disconnected during the window (their CPU in it is lost). */
  readonly vanished: number;
  /** CPU ms of the server's shared background processes (all databases), not in `cpuMs`. */
  readonly backgroundMs: number;
}

export interface PgCpuProbe {
  /** Why CPU cannot be read (e.g. `/proc/<pid>/stat` not readable); undefined when it can. */
  readonly unavailable: string | undefined;
  readonly clockTicksPerSecond: number;
  /** Set when CLK_TCK could not be read and 100 is assumed. */
  readonly note: string | undefined;
  snapshot(): Promise<PgCpuSnapshot | undefined>;
  between(before: PgCpuSnapshot, after: PgCpuSnapshot): PgCpuFigures;
  /** Size of the bench database, bytes. */
  databaseBytes(): Promise<number>;
  close(): Promise<void>;
}

function clockTicks(): { value: number; note?: string } {
  try {
    const out = execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8", timeout: 5_000 }).trim();
    const value = Number(out);
    if (Number.isInteger(value) && value > 0) return { value };
    return { value: 100, note: `getconf CLK_TCK printed "${out}"; assuming 100` };
  } catch (error) {
    return {
      value: 100,
      note: `getconf CLK_TCK failed (${(error as Error).message}); assuming 100`,
    };
  }
}

/** utime + stime and start time of a process, or undefined when it is gone. */
async function readTicks(pid: number): Promise<BackendTicks | undefined> {
  let text: string;
  try {
    text = await readFile(`/proc/${pid}/stat`, "utf8");
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw error;
  }
  // The command name (field 2) is in parentheses and may contain spaces: split after it.
  const fields = text.slice(text.lastIndexOf(")") + 2).split(" ");
  // fields[0] is field 3 (state); utime is field 14, stime 15, starttime 22.
  const utime = Number(fields[11]);
  const stime = Number(fields[12]);
  const start = Number(fields[19]);
  if (!Number.isFinite(utime) || !Number.isFinite(stime) || !Number.isFinite(start)) {
    throw new Error(`/proc/${pid}/stat could not be parsed`);
  }
  return { pid, start, ticks: utime + stime };
}

/**
 * A probe of the bench database `database` on the server of `serverUrl`. Its own connection goes
 * to `serverUrl`'s database, never to the bench database, so it does not count itself.
 */
export async function createPgCpuProbe(serverUrl: string, database: string): Promise<PgCpuProbe> {
  const client = new pg.Client({ connectionString: serverUrl, connectionTimeoutMillis: 10_000 });
  await client.connect();
  const ticks = clockTicks();
  let unavailable: string | undefined;
  if (process.platform !== "linux") {
    unavailable = `no /proc on ${process.platform}`;
  } else {
    try {
      const { rows } = await client.query<{ pid: number }>("SELECT pg_backend_pid() AS pid");
      const self = await readTicks(rows[0]!.pid);
      if (!self) {
        unavailable =
          "the probe's own backend is not in this machine's /proc (is PostgreSQL on another host or in a container?)";
      }
    } catch (error) {
      unavailable = `/proc/<pid>/stat of a PostgreSQL backend is not readable: ${(error as Error).message}`;
    }
  }

  const list = async (): Promise<{ pid: number; bench: boolean }[]> => {
    const { rows } = await client.query<{ pid: number; bench: boolean }>(
      `SELECT pid, datname IS NOT NULL AS bench FROM pg_stat_activity
        WHERE datname = $1
           OR (datname IS NULL AND backend_type IN ('walwriter', 'checkpointer', 'background writer'))`,
      [database],
    );
    return rows;
  };

  return {
    unavailable,
    clockTicksPerSecond: ticks.value,
    note: ticks.note,
    async snapshot() {
      if (unavailable !== undefined) return undefined;
      const rows = await list();
      const at = process.hrtime.bigint();
      const read = await Promise.all(rows.map(async (r) => ({ r, t: await readTicks(r.pid) })));
      return {
        at,
        backends: read.filter((x) => x.r.bench && x.t).map((x) => x.t!),
        background: read.filter((x) => !x.r.bench && x.t).map((x) => x.t!),
      };
    },
    between(before, after) {
      const sum = (from: readonly BackendTicks[], to: readonly BackendTicks[]) => {
        const earlier = new Map(from.map((b) => [`${b.pid}/${b.start}`, b.ticks]));
        let total = 0;
        let appeared = 0;
        for (const b of to) {
          const was = earlier.get(`${b.pid}/${b.start}`);
          if (was === undefined) appeared++;
          total += b.ticks - (was ?? 0);
        }
        const later = new Set(to.map((b) => `${b.pid}/${b.start}`));
        const vanished = from.filter((b) => !later.has(`${b.pid}/${b.start}`)).length;
        return { ms: (total * 1000) / ticks.value, appeared, vanished };
      };
      const bench = sum(before.backends, after.backends);
      const wallMs = Number(after.at - before.at) / 1e6;
      return {
        cpuMs: bench.ms,
        cores: wallMs > 0 ? bench.ms / wallMs : 0,
        backendsAtStart: before.backends.length,
        backendsAtEnd: after.backends.length,
        appeared: bench.appeared,
        vanished: bench.vanished,
        backgroundMs: sum(before.background, after.background).ms,
      };
    },
    async databaseBytes() {
      const { rows } = await client.query<{ bytes: string }>(
        "SELECT pg_database_size($1)::text AS bytes",
        [database],
      );
      return Number(rows[0]!.bytes);
    },
    close: () => client.end(),
  };
}

import { load, type LoadResult, type Target } from "./measure.js";
import type { PgCpuFigures, PgCpuProbe, PgCpuSnapshot } from "./pg-cpu.js";
import type { ChildHandle } from "./processes.js";

/**
 * The sustained phase: one autocannon run of JSON requests at a fixed number of connections for
 * `seconds`, on the database the earlier phases already wrote to (never a fresh one), cut into
 * windows of `windowSeconds` by the runner's own clock. At each window's end the 2xx answers so
 * far are counted (autocannon's `response` event), and PostgreSQL's and the gateway's CPU read,
 * so each window has its req/s and its CPU per request. autocannon runs one second past the last
 * window so the load is still on when it closes; answers after it are not counted.
 */

export interface SustainedWindow {
  readonly index: number;
  /** Start and end of the window, seconds from the start of the phase. */
  readonly fromSeconds: number;
  readonly toSeconds: number;
  readonly ok: number;
  readonly non2xx: number;
  /** 2xx answers per second in the window. */
  readonly requestsPerSecond: number;
  readonly gatewayCpuMsPerRequest?: number;
  readonly postgres?: PgCpuFigures;
  /** PostgreSQL backends' CPU ms / 2xx answers in the window. */
  readonly postgresMsPerRequest?: number;
  /** Shorter than `windowSeconds` (BENCH_SUSTAINED_SECONDS not a multiple of it). */
  readonly partial: boolean;
}

export interface SustainedFigures {
  readonly connections: number;
  readonly seconds: number;
  readonly windowSeconds: number;
  readonly windows: SustainedWindow[];
  /** autocannon's figures for the whole run (one second longer than the windows). */
  readonly load: LoadResult;
  /** 2xx answers per second over all windows. */
  readonly requestsPerSecond: number;
  /** Size of the bench database before and after the phase, bytes. */
  readonly databaseBytes: { before: number; after: number };
  /** Why PostgreSQL's CPU was not measured, if it was not. */
  readonly postgresUnavailable?: string;
}

interface Mark {
  readonly at: bigint;
  readonly ok: number;
  readonly non2xx: number;
  readonly gatewayCpuUs?: number;
  readonly pg?: PgCpuSnapshot;
}

export async function sustainedLoad(
  target: Target,
  gateway: ChildHandle,
  probe: PgCpuProbe,
  opts: {
    connections: number;
    seconds: number;
    windowSeconds: number;
    log: (m: string) => void;
    /** Another request than the JSON chat's (`load`'s `request`): the agent's, say. */
    request?: { path: string; body: string | (() => string) };
  },
): Promise<SustainedFigures> {
  let ok = 0;
  let non2xx = 0;
  let pgError: string | undefined;
  const mark = async (): Promise<Mark> => {
    // The counts first (synchronously, at the tick), then the CPU readings.
    const at = process.hrtime.bigint();
    const counts = { ok, non2xx };
    const [stats, pg] = await Promise.all([
      gateway.stats().catch(() => undefined),
      probe.snapshot().catch((error: unknown) => {
        pgError ??= `reading PostgreSQL's CPU failed: ${(error as Error).message}`;
        return undefined;
      }),
    ]);
    return {
      at,
      ...counts,
      ...(stats ? { gatewayCpuUs: stats.cpu.user + stats.cpu.system } : {}),
      ...(pg ? { pg } : {}),
    };
  };

  const bytesBefore = await probe.databaseBytes();
  const ends: number[] = [];
  for (let t = opts.windowSeconds; t < opts.seconds; t += opts.windowSeconds) ends.push(t);
  ends.push(opts.seconds);

  const marks: Mark[] = [];
  const startMark = await mark();
  marks.push(startMark);
  const started = startMark.at;
  const running = load(target, "json", {
    connections: opts.connections,
    seconds: opts.seconds + 1,
    ...(opts.request ? { request: opts.request } : {}),
    onResponse: (status) => {
      if (status >= 200 && status <= 299) ok++;
      else non2xx++;
    },
  });
  // A rejected load must not go unhandled while the windows are being waited for.
  running.catch(() => undefined);
  for (const end of ends) {
    const waitMs = Number(started + BigInt(Math.round(end * 1e9)) - process.hrtime.bigint()) / 1e6;
    if (waitMs > 0) await new Promise((r) => setTimeout(r, waitMs));
    const m = await mark();
    marks.push(m);
    const prev = marks[marks.length - 2]!;
    const seconds = Number(m.at - prev.at) / 1e9;
    opts.log(
      `  window ${marks.length - 1}: ${((m.ok - prev.ok) / seconds).toFixed(0)} req/s` +
        (m.non2xx > prev.non2xx ? `, ${m.non2xx - prev.non2xx} non-2xx` : ""),
    );
  }
  const result = await running;
  const bytesAfter = await probe.databaseBytes();

  const windows: SustainedWindow[] = [];
  for (let i = 1; i < marks.length; i++) {
    const a = marks[i - 1]!;
    const b = marks[i]!;
    const seconds = Number(b.at - a.at) / 1e9;
    const count = b.ok - a.ok;
    const pg = a.pg && b.pg ? probe.between(a.pg, b.pg) : undefined;
    windows.push({
      index: i,
      fromSeconds: Number(a.at - started) / 1e9,
      toSeconds: Number(b.at - started) / 1e9,
      ok: count,
      non2xx: b.non2xx - a.non2xx,
      requestsPerSecond: count / seconds,
      ...(a.gatewayCpuUs !== undefined && b.gatewayCpuUs !== undefined && count > 0
        ? { gatewayCpuMsPerRequest: (b.gatewayCpuUs - a.gatewayCpuUs) / 1000 / count }
        : {}),
      ...(pg ? { postgres: pg } : {}),
      ...(pg && count > 0 ? { postgresMsPerRequest: pg.cpuMs / count } : {}),
      partial: seconds < opts.windowSeconds - 0.5,
    });
  }
  const last = marks[marks.length - 1]!;
  return {
    connections: opts.connections,
    seconds: opts.seconds,
    windowSeconds: opts.windowSeconds,
    windows,
    load: result,
    requestsPerSecond: (last.ok - startMark.ok) / (Number(last.at - started) / 1e9),
    databaseBytes: { before: bytesBefore, after: bytesAfter },
    ...((probe.unavailable ?? pgError) === undefined
      ? {}
      : { postgresUnavailable: probe.unavailable ?? pgError }),
  };
}

import http from "node:http";
import { setTimeout as sleep } from "node:timers/promises";
import {
  chatPath,
  checkStream,
  describeErrorBody,
  percentiles,
  slowStreamBody,
  type Percentiles,
  type Target,
} from "./measure.js";
import type { ChildHandle } from "./processes.js";

/**
 * Many slow streams at once: `streams` streaming requests the fake upstream answers slowly
 * (20 chunks over `SLOW_STREAM_MS`), all started within `spreadMs`, each on its own connection
 * (plain `node:http`, an agent without keep-alive and with room for every stream). Measures the
 * time to each stream's first body byte, checks every stream in full (200, 20 content chunks,
 * `[DONE]`), and samples the target process's memory over IPC every `sampleMs` from just before
 * the first request until the last stream has ended, keeping the peak.
 */

export interface MemorySample {
  readonly rssBytes: number;
  readonly heapUsedBytes: number;
  readonly heapTotalBytes: number;
  readonly externalBytes: number;
  readonly arrayBuffersBytes: number;
}

export interface BurstResult {
  readonly streams: number;
  /** Time from the first request's start to the last one's, ms. */
  readonly startSpreadMs: number;
  /** Streams answered 200 with 20 content chunks and `[DONE]`. */
  readonly complete: number;
  readonly statusCodes: Record<string, number>;
  /** 200 answers whose stream was cut or malformed. */
  readonly incomplete: number;
  /** Connection errors and timeouts. */
  readonly errors: number;
  /** Up to five samples of what went wrong. */
  readonly errorSamples: string[];
  /** Request start to first body byte, 200 answers only. */
  readonly firstByteMs?: Percentiles;
  /** Request start to the end of the stream, complete streams only. */
  readonly totalMs?: Percentiles;
  readonly wallSeconds: number;
  /** The target process's memory: before the burst, at its RSS peak during it, after it. */
  readonly memory: {
    readonly before: MemorySample;
    readonly peak: MemorySample;
    readonly after?: MemorySample;
    readonly samples: number;
    /** Stats requests that failed (the target did not answer within 5 s). */
    readonly missedSamples: number;
  };
  /** The target process's CPU over the burst, ms. */
  readonly cpuMs: number;
}

export function memoryOf(stats: Awaited<ReturnType<ChildHandle["stats"]>>): MemorySample {
  return {
    rssBytes: stats.rssBytes,
    heapUsedBytes: stats.memory.heapUsed,
    heapTotalBytes: stats.memory.heapTotal,
    externalBytes: stats.memory.external,
    arrayBuffersBytes: stats.memory.arrayBuffers,
  };
}

export async function slowStreamBurst(
  target: Target,
  child: ChildHandle,
  opts: {
    streams: number;
    spreadMs: number;
    timeoutMs: number;
    sampleMs?: number;
    /**
     * Send the target SIGUSR2 (a heap snapshot, when it runs with --heapsnapshot-signal) just
     * before the burst and this many ms into it.
     */
    snapshotAfterMs?: number;
  },
): Promise<BurstResult> {
  const sampleMs = opts.sampleMs ?? 100;
  const body = slowStreamBody();
  const url = new URL(chatPath, target.url);
  const headers = { ...target.headers, "content-length": String(Buffer.byteLength(body)) };
  const agent = new http.Agent({ keepAlive: false, maxSockets: opts.streams + 16 });

  const statusCodes: Record<string, number> = {};
  const errorSamples: string[] = [];
  const firstByte: number[] = [];
  const total: number[] = [];
  let complete = 0;
  let incomplete = 0;
  let errors = 0;
  const note = (sample: string): void => {
    if (errorSamples.length < 5) errorSamples.push(sample);
  };

  // One snapshot before the burst (the stats call below answers once it is written), one
  // during it: their difference over the streams is what a stream holds.
  if (opts.snapshotAfterMs !== undefined) process.kill(child.pid, "SIGUSR2");
  const first = await child.stats();
  const snapshot =
    opts.snapshotAfterMs === undefined
      ? undefined
      : setTimeout(() => process.kill(child.pid, "SIGUSR2"), opts.snapshotAfterMs);
  const before = memoryOf(first);
  let peak = before;
  let samples = 1;
  let missedSamples = 0;
  let sampling = true;
  const sampler = (async () => {
    while (sampling) {
      await sleep(sampleMs);
      try {
        const s = memoryOf(await child.stats());
        samples++;
        if (s.rssBytes > peak.rssBytes) peak = s;
      } catch {
        missedSamples++;
      }
    }
  })();

  const one = (): Promise<void> =>
    new Promise<void>((resolve) => {
      const start = process.hrtime.bigint();
      const ms = (): number => Number(process.hrtime.bigint() - start) / 1e6;
      let settled = false;
      const done = (): void => {
        if (settled) return;
        settled = true;
        resolve();
      };
      const req = http.request(url, { method: "POST", agent, headers });
      const timer = setTimeout(
        () => req.destroy(new Error(`not complete within ${opts.timeoutMs} ms`)),
        opts.timeoutMs,
      );
      req.on("error", (error) => {
        clearTimeout(timer);
        if (settled) return;
        errors++;
        note(error.message);
        done();
      });
      req.on("response", (res) => {
        const status = res.statusCode ?? 0;
        statusCodes[String(status)] = (statusCodes[String(status)] ?? 0) + 1;
        const chunks: Buffer[] = [];
        let firstAt: number | undefined;
        res.on("data", (chunk: Buffer) => {
          firstAt ??= ms();
          chunks.push(chunk);
        });
        res.on("error", () => undefined);
        res.on("close", () => {
          clearTimeout(timer);
          if (settled) return;
          const text = Buffer.concat(chunks).toString("utf8");
          if (status < 200 || status > 299) {
            const { code, message } = describeErrorBody(text);
            note(`HTTP ${status}${code === undefined ? "" : ` ${code}`}: ${message}`);
            return done();
          }
          if (firstAt !== undefined) firstByte.push(firstAt);
          const problem = res.complete ? checkStream(text) : "the stream was cut";
          if (typeof problem === "string") {
            incomplete++;
            note(`HTTP ${status}: ${problem}`);
          } else {
            complete++;
            total.push(ms());
          }
          done();
        });
      });
      req.end(body);
    });

  // Start the streams evenly over spreadMs (a few at every timer tick).
  const startedAt = process.hrtime.bigint();
  const running: Promise<void>[] = [];
  let lastStart = 0;
  while (running.length < opts.streams) {
    const elapsed = Number(process.hrtime.bigint() - startedAt) / 1e6;
    const due = Math.min(opts.streams, Math.floor((elapsed / opts.spreadMs) * opts.streams) + 1);
    while (running.length < due) running.push(one());
    lastStart = Number(process.hrtime.bigint() - startedAt) / 1e6;
    if (running.length < opts.streams) await sleep(5);
  }
  await Promise.all(running);
  const wallSeconds = Number(process.hrtime.bigint() - startedAt) / 1e9;
  sampling = false;
  clearTimeout(snapshot);
  await sampler;
  agent.destroy();
  let after: MemorySample | undefined;
  let cpuMs = 0;
  try {
    const last = await child.stats();
    after = memoryOf(last);
    if (after.rssBytes > peak.rssBytes) peak = after;
    cpuMs = (last.cpu.user + last.cpu.system - first.cpu.user - first.cpu.system) / 1000;
  } catch {
    missedSamples++;
  }
  const firstByteMs = percentiles(firstByte);
  const totalMs = percentiles(total);
  return {
    streams: opts.streams,
    startSpreadMs: lastStart,
    complete,
    statusCodes,
    incomplete,
    errors,
    errorSamples,
    ...(firstByteMs ? { firstByteMs } : {}),
    ...(totalMs ? { totalMs } : {}),
    wallSeconds,
    memory: { before, peak, ...(after ? { after } : {}), samples, missedSamples },
    cpuMs,
  };
}

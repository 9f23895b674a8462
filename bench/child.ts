/**
 * What every benchmark child process (fake upstream, reverse proxy, gateway) shares with the
 * runner: one JSON line on stdout once it listens, and an IPC channel on which the runner asks
 * for `process.cpuUsage()` (so it can compute CPU time per request) and which, when it
 * disconnects (the runner died), makes the child exit: no benchmark process outlives its run.
 */

/** Content chunks of every streamed completion of the fake upstream. */
export const STREAM_CONTENT_CHUNKS = 20;

/**
 * The `"user"` of a streaming request the fake upstream answers slowly: its chunks spread over
 * `SLOW_STREAM_MS` instead of written at once (the slow-streams phase of `npm run bench`).
 */
export const SLOW_STREAM_USER = "bench-slow-stream";

/** The line a child prints on stdout once it is ready. */
export interface ReadyLine {
  readonly ready: true;
  readonly role: string;
  readonly url: string;
  readonly pid: number;
}

/** A request on the IPC channel. */
export interface StatsRequest {
  /** "gc": a full collection first, when the child runs with --expose-gc. */
  readonly type: "stats" | "gc";
  readonly id: number;
}

/** The answer: CPU time in microseconds since the process started, and memory. */
export interface StatsReply {
  readonly type: "stats";
  readonly id: number;
  readonly cpu: NodeJS.CpuUsage;
  readonly rssBytes: number;
  /** `process.memoryUsage()`: V8 heap, external memory and array buffers (bytes). */
  readonly memory: NodeJS.MemoryUsage;
}

export function announceReady(role: string, url: string): void {
  const line: ReadyLine = { ready: true, role, url, pid: process.pid };
  process.stdout.write(`${JSON.stringify(line)}\n`);
}

/**
 * Answers stats requests, and stops the child on SIGTERM/SIGINT or when the runner goes away.
 * `close` is given 4 s before the process exits anyway (the runner SIGKILLs after 8 s).
 */
export function serveControl(close: () => Promise<void>): void {
  let stopping = false;
  const stop = (code: number): void => {
    if (stopping) return;
    stopping = true;
    const force = setTimeout(() => {
      process.stderr.write("close did not finish within 4 s: exiting anyway\n");
      process.exit(code);
    }, 4_000);
    force.unref();
    close().then(
      () => process.exit(code),
      (error: unknown) => {
        process.stderr.write(`close failed: ${String(error)}\n`);
        process.exit(1);
      },
    );
  };
  process.on("message", (message: unknown) => {
    const request = message as Partial<StatsRequest> | null;
    // `{type: "gc"}` (bench:agent, memory at rest): a full collection first when the process
    // runs with --expose-gc, then the stats as usual.
    if (request?.type === "gc") (globalThis as { gc?: () => void }).gc?.();
    if ((request?.type !== "stats" && request?.type !== "gc") || typeof request.id !== "number")
      return;
    const reply: StatsReply = {
      type: "stats",
      id: request.id,
      cpu: process.cpuUsage(),
      rssBytes: process.memoryUsage.rss(),
      memory: process.memoryUsage(),
    };
    process.send?.(reply);
  });
  process.on("disconnect", () => stop(0));
  process.on("SIGTERM", () => stop(0));
  process.on("SIGINT", () => stop(0));
}

/** Reads a required URL-ish environment variable or exits with status 2. */
export function requiredEnv(name: string): string {
  const value = process.env[name];
  if (value === undefined || value === "") {
    process.stderr.write(`${name} is required\n`);
    process.exit(2);
  }
  return value;
}

import { spawn, type ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";
import type { ReadyLine, StatsReply, StatsRequest } from "../child.js";

/**
 * Starting and stopping the benchmark's child processes. Each one is `node FILE` with an IPC
 * channel: a `.js` file (the gateway's production build, dist/bench/gateway.js) as it is, a `.ts`
 * file (the harness's fake upstream and proxy) through `--import tsx`; it prints one ready line (JSON) on stdout. Every child is killed by its
 * PID: SIGTERM, then SIGKILL after a grace period; and synchronously with SIGKILL if the runner
 * exits without stopping it.
 */

export interface ChildHandle {
  readonly role: string;
  readonly url: string;
  readonly pid: number;
  /**
   * CPU time (µs) and RSS of the child, asked over IPC; `gc`: after a full collection, when the
   * child runs with --expose-gc (else as without).
   */
  stats(gc?: boolean): Promise<StatsReply>;
  /** The last few KiB the child wrote on stderr (and stdout past its ready line). */
  output(): string;
  /** SIGTERM, SIGKILL after `graceMs`; resolves once it has exited. Idempotent. */
  stop(graceMs?: number): Promise<void>;
  /** How the child ended: exit code or signal; undefined while it runs. */
  exitStatus(): string | undefined;
}

const live = new Set<ChildProcess>();

/** SIGKILLs every child still running; for the runner's `exit` handler. */
export function killAllChildrenSync(): void {
  for (const child of live) {
    if (child.pid !== undefined && child.exitCode === null && child.signalCode === null) {
      try {
        process.kill(child.pid, "SIGKILL");
      } catch {
        // already gone
      }
    }
  }
  live.clear();
}

const outputLimit = 16 * 1024;

export async function startChild(
  role: string,
  file: string,
  env: NodeJS.ProcessEnv,
  readyTimeoutMs: number,
  nodeArgs: readonly string[] = [],
): Promise<ChildHandle> {
  const path = fileURLToPath(new URL(`../${file}`, import.meta.url));
  const loader = file.endsWith(".ts") ? ["--import", "tsx"] : [];
  const child = spawn(process.execPath, [...nodeArgs, ...loader, path], {
    env,
    stdio: ["ignore", "pipe", "pipe", "ipc"],
  });
  live.add(child);
  let tail = "";
  const keep = (chunk: Buffer): void => {
    tail = (tail + chunk.toString("utf8")).slice(-outputLimit);
  };
  child.stderr?.on("data", keep);
  let exitStatus: string | undefined;
  const exited = new Promise<void>((resolve) => {
    child.once("exit", (code, signal) => {
      exitStatus = signal === null ? `code ${code}` : `signal ${signal}`;
      live.delete(child);
      resolve();
    });
  });

  const ready = await new Promise<ReadyLine>((resolve, reject) => {
    let buffered = "";
    const fail = (reason: string): void => {
      cleanup();
      if (child.pid !== undefined && child.exitCode === null) child.kill("SIGKILL");
      reject(new Error(`${role} ${reason}\n--- ${role} output ---\n${tail.trim()}`));
    };
    const onData = (chunk: Buffer): void => {
      buffered += chunk.toString("utf8");
      let newline: number;
      while ((newline = buffered.indexOf("\n")) >= 0) {
        const line = buffered.slice(0, newline).trim();
        buffered = buffered.slice(newline + 1);
        try {
          const parsed = JSON.parse(line) as Partial<ReadyLine>;
          if (parsed.ready === true && typeof parsed.url === "string") {
            cleanup();
            child.stdout?.on("data", keep);
            return resolve(parsed as ReadyLine);
          }
        } catch {
          // not the ready line
        }
        keep(Buffer.from(`${line}\n`));
      }
    };
    const onExit = (code: number | null, signal: NodeJS.Signals | null): void =>
      fail(`exited before it was ready (code ${code}, signal ${signal})`);
    const onError = (error: Error): void => fail(`could not be started: ${error.message}`);
    const timer = setTimeout(
      () => fail(`was not ready after ${readyTimeoutMs / 1000} s`),
      readyTimeoutMs,
    );
    const cleanup = (): void => {
      clearTimeout(timer);
      child.stdout?.off("data", onData);
      child.off("exit", onExit);
      child.off("error", onError);
    };
    child.stdout?.on("data", onData);
    child.once("exit", onExit);
    child.once("error", onError);
  });
  const pid = child.pid;
  if (pid === undefined) throw new Error(`${role} started without a pid`);

  let nextId = 0;
  const stats = (gc = false): Promise<StatsReply> =>
    new Promise<StatsReply>((resolve, reject) => {
      const id = ++nextId;
      const onMessage = (message: unknown): void => {
        const reply = message as Partial<StatsReply> | null;
        if (reply?.type === "stats" && reply.id === id) {
          done();
          resolve(reply as StatsReply);
        }
      };
      const timer = setTimeout(() => {
        done();
        reject(new Error(`${role} did not answer a stats request within 5 s`));
      }, 5_000);
      const done = (): void => {
        clearTimeout(timer);
        child.off("message", onMessage);
      };
      child.on("message", onMessage);
      const request: StatsRequest = { type: gc ? "gc" : "stats", id };
      child.send(request, (error) => {
        if (error) {
          done();
          reject(error);
        }
      });
    });

  let stopping: Promise<void> | undefined;
  const stop = (graceMs = 8_000): Promise<void> => {
    stopping ??= (async () => {
      if (child.exitCode === null && child.signalCode === null) {
        try {
          process.kill(pid, "SIGTERM");
        } catch {
          // already gone
        }
        const timer = setTimeout(() => {
          try {
            process.kill(pid, "SIGKILL");
          } catch {
            // already gone
          }
        }, graceMs);
        await exited;
        clearTimeout(timer);
      }
      live.delete(child);
    })();
    return stopping;
  };

  return {
    role,
    url: ready.url,
    pid,
    stats,
    output: () => tail,
    stop,
    exitStatus: () => exitStatus,
  };
}

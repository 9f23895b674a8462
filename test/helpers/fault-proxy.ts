import { connect, createServer, type AddressInfo, type Server, type Socket } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";

/**
 * A TCP fault-injection proxy for tests (issue 13): listens on 127.0.0.1 (port 0) and forwards
 * every connection to `target` (a PostgreSQL server, or any TCP service) byte for byte, until a
 * test turns it bad. Loopback only; it understands nothing of the protocol it carries.
 *
 * Modes (one at a time; each call replaces the previous mode):
 * - `pass()`: bytes flow both ways. Connections held by `blackhole()` resume where they stopped
 *   (a held new connection only now reaches the target).
 * - `down()`: the open connections are reset (both sides), and every new one is reset as soon
 *   as it is accepted: a crashed server or a dropped route.
 * - `blackhole()`: connections stay open but nothing is forwarded either way, and new ones are
 *   accepted and held without reaching the target: a hung server (or a silent network). Nothing
 *   is dropped: what was sent meanwhile flows once `pass()` (or `delay()`) is called.
 * - `delay(ms)`: every chunk is forwarded `ms` after it arrived, in order: a slow network.
 *
 * `kill()` resets the open connections once and keeps the mode (new ones are served as before):
 * a server that terminated its backends. `stats()` counts what happened; `close()` stops.
 */
export interface FaultProxy {
  readonly host: "127.0.0.1";
  readonly port: number;
  /** The current mode. */
  readonly mode: FaultMode;
  pass(): void;
  down(): void;
  blackhole(): void;
  delay(ms: number): void;
  /** Resets every open connection (both sides); returns how many. */
  kill(): number;
  /** `url` (e.g. a DATABASE_URL) with its host and port replaced by the proxy's. */
  url(url: string): string;
  stats(): FaultProxyStats;
  /** Resets every connection and stops listening. Idempotent. */
  close(): Promise<void>;
}

export type FaultMode = "pass" | "down" | "blackhole" | "delay";

export interface FaultProxyStats {
  /** Connections accepted, whatever became of them. */
  readonly accepted: number;
  /** Connections open now (held ones included). */
  readonly open: number;
  /** Connections reset at accept by `down()`. */
  readonly refused: number;
  /** Open connections reset by `down()` or `kill()`. */
  readonly killed: number;
  /** Connections accepted while `blackhole()` held them. */
  readonly held: number;
  /** Chunks forwarded late by `delay()`. */
  readonly delayed: number;
  /** Faults injected: refused + killed + held + delayed. */
  readonly faults: number;
}

/** One direction of a connection. */
interface Pipe {
  /** Where the bytes come from and go to; undefined while not connected. */
  readonly source: () => Socket | undefined;
  readonly sink: () => Socket | undefined;
  /** Chunks not forwarded yet (held, delayed, or behind those), with when they arrived. */
  readonly queue: { chunk: Buffer; at: number }[];
  /** The source has ended: end the sink once the queue is through. */
  ended: boolean;
  draining: boolean;
}

interface Link {
  readonly client: Socket;
  /** The connection to the target; undefined while held by `blackhole()`. */
  upstream: Socket | undefined;
  readonly toTarget: Pipe;
  readonly toClient: Pipe;
}

/** Starts a proxy to `target`, in `pass` mode. */
export async function startFaultProxy(target: { host: string; port: number }): Promise<FaultProxy> {
  let mode: FaultMode = "pass";
  let delayMs = 0;
  const links = new Set<Link>();
  const counts = { accepted: 0, refused: 0, killed: 0, held: 0, delayed: 0 };

  const reset = (socket: Socket | undefined) => {
    if (socket !== undefined && !socket.destroyed) socket.resetAndDestroy();
  };
  /** Resets both sides of a link; false if it was already gone. */
  const drop = (link: Link): boolean => {
    if (!links.delete(link)) return false;
    reset(link.client);
    reset(link.upstream);
    return true;
  };

  /** Whether the mode lets no byte through (read through a call: it changes across awaits). */
  const stopped = (): boolean => mode === "blackhole" || mode === "down";

  /** Forwards what the mode lets through, in order, until the queue is empty or held. */
  const drain = async (pipe: Pipe): Promise<void> => {
    if (pipe.draining) return;
    pipe.draining = true;
    try {
      for (;;) {
        if (stopped()) return;
        const sink = pipe.sink();
        if (sink === undefined || sink.destroyed) return; // `reach` drains once connected
        const next = pipe.queue[0];
        if (next === undefined) {
          if (pipe.ended) sink.end();
          return;
        }
        if (mode === "delay") {
          const wait = next.at + delayMs - Date.now();
          if (wait > 0) {
            counts.delayed++;
            await sleep(wait);
            continue; // the mode may have changed meanwhile
          }
        }
        pipe.queue.shift();
        if (!sink.write(next.chunk)) {
          // Backpressure: stop reading the source until the sink has room.
          const source = pipe.source();
          source?.pause();
          await new Promise<void>((resolve) => {
            sink.once("drain", resolve);
            sink.once("close", resolve);
          });
          if (!stopped()) source?.resume();
        }
      }
    } finally {
      pipe.draining = false;
    }
  };

  /** Queues what `socket` sends on `pipe`, and its end. */
  const feed = (socket: Socket, pipe: Pipe, link: Link) => {
    socket.on("data", (chunk: Buffer) => {
      pipe.queue.push({ chunk, at: Date.now() });
      void drain(pipe);
    });
    socket.on("end", () => {
      pipe.ended = true;
      void drain(pipe);
    });
    socket.on("error", () => drop(link));
    socket.on("close", () => {
      // Gone without an end (reset): the other side is reset too.
      if (!pipe.ended) drop(link);
      else if (link.client.destroyed && (link.upstream?.destroyed ?? true)) links.delete(link);
    });
  };

  /** Opens the connection to the target and starts forwarding both ways. */
  const reach = (link: Link) => {
    const upstream = connect({ port: target.port, host: target.host, allowHalfOpen: true });
    link.upstream = upstream;
    upstream.once("connect", () => void drain(link.toTarget));
    feed(upstream, link.toClient, link);
  };

  const server: Server = createServer({ allowHalfOpen: true }, (client) => {
    counts.accepted++;
    client.on("error", () => undefined);
    if (mode === "down") {
      counts.refused++;
      reset(client);
      return;
    }
    const link: Link = {
      client,
      upstream: undefined,
      toTarget: {
        source: () => client,
        sink: () => (link.upstream?.connecting === false ? link.upstream : undefined),
        queue: [],
        ended: false,
        draining: false,
      },
      toClient: {
        source: () => link.upstream,
        sink: () => client,
        queue: [],
        ended: false,
        draining: false,
      },
    };
    links.add(link);
    feed(client, link.toTarget, link);
    if (mode === "blackhole") {
      counts.held++;
      client.pause();
      return;
    }
    reach(link);
  });

  /** Moves held and queued bytes again after a mode change. */
  const flow = () => {
    for (const link of links) {
      if (link.upstream === undefined) reach(link);
      link.client.resume();
      link.upstream?.resume();
      void drain(link.toTarget);
      void drain(link.toClient);
    }
  };

  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      server.off("error", reject);
      resolve();
    });
  });
  const { port } = server.address() as AddressInfo;
  let closing: Promise<void> | undefined;

  const killAll = (): number => {
    let n = 0;
    for (const link of [...links]) if (drop(link)) n++;
    counts.killed += n;
    return n;
  };

  return {
    host: "127.0.0.1",
    port,
    get mode() {
      return mode;
    },
    pass() {
      mode = "pass";
      flow();
    },
    down() {
      mode = "down";
      killAll();
    },
    blackhole() {
      mode = "blackhole";
      for (const link of links) {
        link.client.pause();
        link.upstream?.pause();
      }
    },
    delay(ms) {
      if (!Number.isFinite(ms) || ms < 0) throw new Error(`delay must be >= 0 ms, got ${ms}`);
      mode = "delay";
      delayMs = ms;
      flow();
    },
    kill: killAll,
    url(url) {
      const parsed = new URL(url);
      parsed.hostname = "127.0.0.1";
      parsed.port = String(port);
      return parsed.toString();
    },
    stats() {
      return {
        ...counts,
        open: links.size,
        faults: counts.refused + counts.killed + counts.held + counts.delayed,
      };
    },
    close() {
      closing ??= new Promise<void>((resolve) => {
        for (const link of [...links]) drop(link);
        server.close(() => resolve());
      });
      return closing;
    },
  };
}

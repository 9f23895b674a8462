import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo, Socket } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";

/**
 * A JSON-RPC fault proxy for tests (issue 13): an HTTP server on loopback (port 0) in front of
 * a node (anvil), whose answers a test turns bad on demand. Single calls and batches (JSON
 * arrays, what the gateway's viem transport sends) are both understood.
 *
 * Modes (one at a time; each call replaces the previous mode):
 * - `pass()`: every request is forwarded as is.
 * - `down()`: every connection is destroyed at once, open keep-alive ones included (the client
 *   sees a reset, as from a crashed node or a dropped route). Nothing is forwarded.
 * - `slow(ms, methods?)`: requests are forwarded at once, and the node's answer is held `ms`
 *   before it is written (only for requests holding a call of `methods`, when given): reads and
 *   writes take effect on the node, the client learns of them late (or, past its timeout, not
 *   at all: a transaction sent is then on chain although its sender saw a failure).
 * - `errors({ kind, methods })`: the calls of `methods` (all methods when absent) are not
 *   forwarded; `kind: "http"` answers the whole request HTTP 500 if it holds one of them,
 *   `kind: "rpc"` answers each of them with a JSON-RPC error object (code -32603), and
 *   forwards the other calls of a batch.
 *
 * Counters: `calls(method)` counts the calls received (forwarded or not), `forwarded(method)`
 * the calls the node saw; without a method, all of them.
 */
export interface RpcProxy {
  /** `http://127.0.0.1:<port>`: the RPC_URL to give the gateway. */
  readonly url: string;
  pass(): void;
  down(): void;
  slow(ms: number, methods?: readonly string[]): void;
  errors(options?: { kind?: "http" | "rpc"; methods?: readonly string[] }): void;
  calls(method?: string): number;
  forwarded(method?: string): number;
  close(): Promise<void>;
}

type Mode =
  | { readonly name: "pass" }
  | { readonly name: "down" }
  | {
      readonly name: "slow";
      readonly ms: number;
      readonly methods: ReadonlySet<string> | undefined;
    }
  | {
      readonly name: "errors";
      readonly kind: "http" | "rpc";
      readonly methods: ReadonlySet<string> | undefined;
    };

interface RpcCall {
  readonly jsonrpc?: string;
  readonly id?: unknown;
  readonly method?: unknown;
}

/** The error object `errors({ kind: "rpc" })` answers. */
export const injectedRpcError = { code: -32603, message: "rpc-proxy: injected fault" } as const;

/** Starts a proxy in front of `target` (the node's JSON-RPC URL), in `pass` mode. */
export async function startRpcProxy(target: string): Promise<RpcProxy> {
  let mode: Mode = { name: "pass" };
  const received = new Map<string, number>();
  const sent = new Map<string, number>();
  const sockets = new Set<Socket>();

  const count = (counter: Map<string, number>, calls: readonly RpcCall[]) => {
    for (const call of calls) {
      const method = typeof call.method === "string" ? call.method : "?";
      counter.set(method, (counter.get(method) ?? 0) + 1);
    }
  };
  const total = (counter: Map<string, number>, method?: string) =>
    method === undefined
      ? [...counter.values()].reduce((a, b) => a + b, 0)
      : (counter.get(method) ?? 0);

  /** Sends `calls` to the node (as a batch if `batch`), returns its answers in call order. */
  const forward = async (calls: readonly RpcCall[], batch: boolean): Promise<unknown[]> => {
    count(sent, calls);
    const res = await fetch(target, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(batch ? calls : calls[0]),
    });
    const answer = (await res.json()) as unknown;
    return Array.isArray(answer) ? answer : [answer];
  };

  const reply = (res: ServerResponse, status: number, body: unknown) => {
    if (res.destroyed) return;
    const payload = JSON.stringify(body);
    res.writeHead(status, {
      "content-type": "application/json",
      "content-length": Buffer.byteLength(payload),
    });
    res.end(payload);
  };

  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const current = mode;
    if (current.name === "down") {
      req.socket.destroy();
      return;
    }
    let parsed: unknown;
    try {
      parsed = JSON.parse(Buffer.concat(chunks).toString("utf8"));
    } catch {
      reply(res, 400, {
        jsonrpc: "2.0",
        id: null,
        error: { code: -32700, message: "parse error" },
      });
      return;
    }
    const batch = Array.isArray(parsed);
    const calls = (batch ? parsed : [parsed]) as RpcCall[];
    count(received, calls);

    const hit = (methods: ReadonlySet<string> | undefined) => (call: RpcCall) =>
      methods === undefined || (typeof call.method === "string" && methods.has(call.method));
    if (current.name === "errors") {
      const hitCall = hit(current.methods);
      if (calls.some(hitCall)) {
        if (current.kind === "http") {
          reply(res, 500, { error: "rpc-proxy: injected HTTP 500" });
          return;
        }
        const others = calls.filter((c) => !hitCall(c));
        const answers = others.length > 0 ? await forward(others, true) : [];
        const byId = new Map(answers.map((a) => [(a as RpcCall).id, a]));
        const merged = calls.map((c) =>
          hitCall(c)
            ? { jsonrpc: "2.0", id: c.id ?? null, error: injectedRpcError }
            : (byId.get(c.id) ?? {
                jsonrpc: "2.0",
                id: c.id ?? null,
                error: { code: -32603, message: "rpc-proxy: no answer" },
              }),
        );
        reply(res, 200, batch ? merged : merged[0]);
        return;
      }
    }
    const answers = await forward(calls, batch);
    if (current.name === "slow" && calls.some(hit(current.methods))) await sleep(current.ms);
    reply(res, 200, batch ? answers : answers[0]);
  };

  const server: Server = createServer((req, res) => {
    handle(req, res).catch(() => {
      if (!res.headersSent) reply(res, 502, { error: "rpc-proxy: the node did not answer" });
      else res.destroy();
    });
  });
  server.on("connection", (socket) => {
    if (mode.name === "down") {
      socket.destroy();
      return;
    }
    sockets.add(socket);
    socket.once("close", () => sockets.delete(socket));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;

  return {
    url: `http://127.0.0.1:${port}`,
    pass() {
      mode = { name: "pass" };
    },
    down() {
      mode = { name: "down" };
      for (const socket of sockets) socket.destroy();
    },
    slow(ms, methods) {
      mode = { name: "slow", ms, methods: methods === undefined ? undefined : new Set(methods) };
    },
    errors(options = {}) {
      mode = {
        name: "errors",
        kind: options.kind ?? "rpc",
        methods: options.methods === undefined ? undefined : new Set(options.methods),
      };
    },
    calls: (method) => total(received, method),
    forwarded: (method) => total(sent, method),
    async close() {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import http from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import type { Hex } from "viem";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { InferenceService } from "../../gen/gateway/v1/inference_pb.js";
import { marketAbi } from "../../gen/contracts/artifacts.js";
import { demoMetadata } from "../../src/dev/demo-market.js";
import type { DevManifest } from "../../src/dev/sandbox.js";
import { describeIfPostgres } from "../helpers/db.js";
import type { FakeUpstream } from "../helpers/fake-upstream.js";
import { auditChildLogs } from "../helpers/log-audit.js";
import { openPermit } from "../helpers/market.js";
import {
  gatewayCli,
  serveProcess,
  stopProcess,
  type GatewayProcess,
} from "../helpers/processes.js";
import { authed, eventually, json, startChatStack, type TestStack } from "../helpers/stack.js";
import { sseData } from "../helpers/sse.js";

/**
 * Graceful shutdown (issue 12, item 5), on real processes: SIGTERM turns readiness to 503
 * first, stops the background work (no probe after the shutdown line), lets streams finish for
 * SHUTDOWN_GRACE_MS, ends the rest with one `shutting_down` event, closes every record, and
 * exits; with no traffic within 2 s, `npm start`'s anvil included.
 */

/** Resolves with the exit code and the time the process exited. */
function exited(child: ChildProcess): Promise<{ code: number | null; at: number }> {
  return new Promise((resolve) => {
    if (child.exitCode !== null) resolve({ code: child.exitCode, at: Date.now() });
    else child.once("exit", (code) => resolve({ code, at: Date.now() }));
  });
}

/** Calls `onLine(entry)` for every JSON log line the child writes from now on. */
function watchLogs(child: ChildProcess, onLine: (entry: { msg?: string }) => void): void {
  createInterface({ input: child.stdout! }).on("line", (line) => {
    try {
      onLine(JSON.parse(line) as { msg?: string });
    } catch {
      // not a log line
    }
  });
}

/** Probes the fake upstream had received when the child logged its shutdown line. */
function probesAtShutdownLine(child: ChildProcess, fake: FakeUpstream): Promise<number> {
  return new Promise((resolve) =>
    watchLogs(child, (entry) => {
      if (entry.msg === "SIGTERM: shutting down") resolve(fake.calls("/v1/models"));
    }),
  );
}

/** GET over one kept-alive connection (the agent holds a single socket). */
function getOn(
  agent: http.Agent,
  url: string,
): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: string }> {
  return new Promise((resolve, reject) => {
    http
      .get(url, { agent }, (res) => {
        let body = "";
        res.setEncoding("utf8");
        res.on("data", (chunk: string) => (body += chunk));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
        res.on("error", reject);
      })
      .on("error", reject);
  });
}

describeIfPostgres("graceful shutdown of gateway serve", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let chatOffer: Hex;
  let child: GatewayProcess | undefined;

  beforeAll(async () => {
    ({ stack, fake, chatOffer } = await startChatStack({}, { chunks: 100 }));
    // Room for 20 streams at once on the one offer (the demo offers take 8).
    const wallet = stack.clients.wallet(stack.roles.operator.privateKey);
    const hash = await wallet.writeContract({
      address: stack.demo.market,
      abi: marketAbi,
      functionName: "setOfferMetadata",
      args: [chatOffer, { ...demoMetadata("eu-test", "cpu"), maxConcurrency: 64 }],
      chain: null,
      account: wallet.account!,
    } as Parameters<typeof wallet.writeContract>[0]);
    await stack.clients.publicClient.waitForTransactionReceipt({ hash });
  }, 60_000);
  afterAll(async () => {
    await stopProcess(child);
    await fake?.stop();
    await stack?.close();
  });

  it("SIGTERM during 20 long streams: /ready 503 at once, each stream whole or ended by a shutting_down event, every record closed, exit before grace + 2 s, no probe after the shutdown line", async () => {
    const graceMs = 3000;
    const deposit = 10n ** 24n;
    const permitId = await openPermit(stack, { deposit });
    child = await serveProcess(stack, {
      SHUTDOWN_GRACE_MS: String(graceMs),
      PROBE_INTERVAL_MS: "50",
      PERMIT_CACHE_MS: "60000",
    });
    const base = child.url;
    const probesAtLine = probesAtShutdownLine(child.child, fake);
    const exit = exited(child.child);
    // The prober is running (it probes every 50 ms).
    const probesBefore = fake.calls("/v1/models");
    await eventually(async () => fake.calls("/v1/models") > probesBefore + 1);

    // One kept-alive connection for readiness, open before the signal.
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    expect((await getOn(agent, `${base}/ready`)).status).toBe(200);
    // And one for an API request.
    const apiAgent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    expect((await getOn(apiAgent, `${base}/health`)).status).toBe(200);

    // 100 ms between chunks: 10 short streams (~1 s) finish within the grace, 10 long ones (~10 s) do not.
    fake.setOptions({ delayMs: 100 });
    const streams = Array.from({ length: 20 }, async (_, i) => {
      const res = await fetch(`${base}/v1/chat/completions`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${stack.apiKey}`,
          "content-type": "application/json",
          "x-gateway-permit": permitId,
        },
        body: JSON.stringify({
          model: "demo-chat",
          messages: [{ role: "user", content: `stream ${i}` }],
          stream: true,
          max_tokens: i % 2 === 0 ? 10 : 100,
        }),
      });
      expect(res.status).toBe(200);
      const requestId = res.headers.get("x-gateway-request-id")!;
      const reader = res.body!.getReader();
      const first = await reader.read(); // the stream has begun
      let text = Buffer.from(first.value ?? new Uint8Array()).toString("utf8");
      const rest = (async () => {
        const decoder = new TextDecoder();
        for (;;) {
          const { done, value } = await reader.read();
          if (done) break;
          text += decoder.decode(value, { stream: true });
        }
        return { requestId, events: sseData(text) };
      })();
      return { rest };
    });
    const begun = await Promise.all(streams);

    const signalledAt = Date.now();
    child.child.kill("SIGTERM");
    // Readiness says so at once, while the streams drain (the kept-alive connection is still open).
    let ready: Awaited<ReturnType<typeof getOn>> | undefined;
    await eventually(
      async () => {
        ready = await getOn(agent, `${base}/ready`);
        return ready.status === 503;
      },
      2000,
      20,
    );
    const readyAt = Date.now();
    expect(ready?.headers.connection).toBe("close");
    expect(JSON.parse(ready!.body)).toEqual({ status: "shutting_down" });
    // A new request on a kept-alive connection is refused, and that connection closes; a new
    // connection is not accepted at all.
    const refused = await getOn(apiAgent, `${base}/v1/models`);
    expect(refused.status).toBe(503);
    expect(refused.headers.connection).toBe("close");
    expect(JSON.parse(refused.body)).toMatchObject({
      error: { code: "shutting_down", type: "service_unavailable" },
    });
    await expect(fetch(`${base}/health`)).rejects.toThrow();
    const done = await Promise.all(begun.map((s) => s.rest));
    const { code, at } = await exit;
    agent.destroy();
    apiAgent.destroy();

    expect(readyAt - signalledAt).toBeLessThan(graceMs);
    expect(code).toBe(0);
    expect(at - signalledAt).toBeLessThan(graceMs + 2000);
    let whole = 0;
    let cut = 0;
    for (const { events } of done) {
      const last = events.at(-1);
      if (last === "[DONE]") whole++;
      else {
        // One error event, last, and no [DONE].
        expect(JSON.parse(last!)).toMatchObject({
          error: { code: "shutting_down", type: "service_unavailable" },
        });
        expect(events).not.toContain("[DONE]");
        expect(events.filter((e) => e.includes('"error"'))).toHaveLength(1);
        cut++;
      }
    }
    expect(whole).toBeGreaterThan(0);
    expect(cut).toBeGreaterThan(0);
    // Every record is closed, as another gateway (the stack's) reads it from the database: the
    // whole streams completed, the cut ones cancelled by the shutdown (charged what they got).
    for (const { requestId, events } of done) {
      const record = await json(await authed(stack, `/v1/requests/${requestId}`));
      if (events.at(-1) === "[DONE]") expect(record.status).toBe("completed");
      else {
        expect(record.status).toBe("cancelled");
        expect(record.error).toMatch(/shutdown/);
        expect(BigInt(record.credits_charged)).toBeGreaterThan(0n);
      }
    }
    // No probe started after the shutdown line (one may have been on its way).
    expect(fake.calls("/v1/models") - (await probesAtLine)).toBeLessThanOrEqual(1);
  }, 60_000);

  it("a gRPC stream still open when the grace ends is cut, and its record is closed before the process exits", async () => {
    const graceMs = 1000;
    const permitId = await openPermit(stack, { deposit: 10n ** 24n });
    child = await serveProcess(stack, { SHUTDOWN_GRACE_MS: String(graceMs) });
    const exit = exited(child.child);
    fake.setOptions({ delayMs: 100 });
    const client = createClient(InferenceService, createGrpcTransport({ baseUrl: child.url }));
    const call = client.streamChatCompletion(
      {
        body: new TextEncoder().encode(
          JSON.stringify({
            model: "demo-chat",
            messages: [{ role: "user", content: "grpc" }],
            stream: true,
            max_tokens: 100,
          }),
        ),
        permitId,
      },
      { headers: { authorization: `Bearer ${stack.apiKey}` } },
    );
    const responses = call[Symbol.asyncIterator]();
    const first = await responses.next();
    expect(first.value?.event.case).toBe("started");
    const requestId = first.value!.event.value!.requestId as string;
    await responses.next(); // a chunk: the stream is under way

    const signalledAt = Date.now();
    child.child.kill("SIGTERM");
    let completed = false;
    const ended = (async () => {
      for (;;) {
        const next = await responses.next();
        if (next.done) return;
        if (next.value.event.case === "completed") completed = true;
      }
    })();
    await expect(ended).rejects.toThrow();
    const { code, at } = await exit;
    expect(completed).toBe(false);
    expect(code).toBe(0);
    expect(at - signalledAt).toBeLessThan(graceMs + 2000);
    // Closed by the process itself before it exited (not by another's orphan rule a minute on).
    const record = await json(await authed(stack, `/v1/requests/${requestId}`));
    expect(record.status).toBe("cancelled");
  }, 60_000);

  it("a JSON request still in flight when the grace ends is answered 503 shutting_down, its record closed", async () => {
    const graceMs = 1000;
    const permitId = await openPermit(stack, { deposit: 10n ** 24n });
    child = await serveProcess(stack, { SHUTDOWN_GRACE_MS: String(graceMs) });
    const exit = exited(child.child);
    const served = fake.calls("/v1/chat/completions");
    fake.setOptions({ delayMs: 10_000 });
    const answer = fetch(`${child.url}/v1/chat/completions`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${stack.apiKey}`,
        "content-type": "application/json",
        "x-gateway-permit": permitId,
      },
      body: JSON.stringify({ model: "demo-chat", messages: [{ role: "user", content: "json" }] }),
    });
    await eventually(async () => fake.calls("/v1/chat/completions") > served);
    const signalledAt = Date.now();
    child.child.kill("SIGTERM");
    const res = await answer;
    expect(res.status).toBe(503);
    expect(await json(res)).toMatchObject({
      error: { code: "shutting_down", type: "service_unavailable" },
    });
    const { code, at } = await exit;
    expect(code).toBe(0);
    expect(at - signalledAt).toBeLessThan(graceMs + 2000);
    const { rows } = await stack.database.db.pool.query<{ status: string; error: string }>(
      "SELECT status, error FROM inference_requests WHERE permit_id = $1",
      [permitId.toLowerCase()],
    );
    expect(rows).toEqual([{ status: "cancelled", error: "cut by the gateway's shutdown" }]);
  }, 60_000);

  it("an idle gateway serve exits 0 within 2 s of SIGTERM, and probes nothing after the shutdown line", async () => {
    child = await serveProcess(stack, { PROBE_INTERVAL_MS: "50" });
    const probesAtLine = probesAtShutdownLine(child.child, fake);
    const exit = exited(child.child);
    const probesBefore = fake.calls("/v1/models");
    await eventually(async () => fake.calls("/v1/models") > probesBefore + 1);
    // A kept-alive connection, idle when the signal comes, does not hold the shutdown up.
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    expect((await getOn(agent, `${child.url}/health`)).status).toBe(200);

    const signalledAt = Date.now();
    child.child.kill("SIGTERM");
    const { code, at } = await exit;
    agent.destroy();
    expect(code).toBe(0);
    expect(at - signalledAt).toBeLessThan(2000);
    expect(fake.calls("/v1/models") - (await probesAtLine)).toBeLessThanOrEqual(1);
  }, 60_000);

  it("a probe under way when SIGTERM arrives does not hold the exit up", async () => {
    fake.setOptions({ modelsDelayMs: 60_000 });
    try {
      const probes = fake.calls("/v1/models");
      child = await serveProcess(stack, { PROBE_INTERVAL_MS: "50" });
      const exit = exited(child.child);
      // The first probe hangs at the provider.
      await eventually(async () => fake.calls("/v1/models") > probes);
      const signalledAt = Date.now();
      child.child.kill("SIGTERM");
      const { code, at } = await exit;
      expect(code).toBe(0);
      expect(at - signalledAt).toBeLessThan(2000);
    } finally {
      fake.setOptions({ modelsDelayMs: 0 });
    }
  }, 60_000);
});

describe("graceful shutdown of npm start (gateway dev)", () => {
  const started: { dev: ChildProcess; stateDir: string }[] = [];
  /** Processes a failed test may have left behind (its npm's descendants). */
  const strays: number[] = [];
  afterAll(() => {
    for (const pid of strays) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // already gone
      }
    }
    for (const { dev, stateDir } of started) {
      if (dev.exitCode === null && dev.signalCode === null) dev.kill("SIGKILL");
      rmSync(stateDir, { recursive: true, force: true });
    }
  });

  const alive = (pid: number): boolean => {
    try {
      process.kill(pid, 0);
      return true;
    } catch {
      return false;
    }
  };

  /** `npm start` as it runs it, on a free port and a fresh state dir. */
  const startDev = () => {
    const stateDir = mkdtempSync(join(tmpdir(), "gateway-dev-shutdown-"));
    const dev = spawn(process.execPath, [...gatewayCli, "dev"], {
      env: { PATH: process.env.PATH, PORT: "0", GATEWAY_STATE_DIR: stateDir, LOG_LEVEL: "info" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    started.push({ dev, stateDir });
    auditChildLogs(dev, "gateway dev");
    return { dev, stateDir, exit: exited(dev) };
  };

  /** The child processes of `pid`: anvil. */
  const childrenOf = (pid: number) =>
    execFileSync("ps", ["-o", "pid=,args=", "--ppid", String(pid)], { encoding: "utf8" })
      .trim()
      .split("\n")
      .map((line) => line.trim())
      .filter((line) => line !== "")
      .map((line) => ({ pid: Number(line.split(/\s+/)[0]), args: line }));

  it("exits 0 within 2 s of SIGTERM and leaves no anvil or other child process running", async () => {
    const { dev, stateDir, exit } = startDev();
    const manifestPath = join(stateDir, "dev.json");
    await eventually(async () => existsSync(manifestPath) || dev.exitCode !== null, 60_000, 100);
    expect(dev.exitCode).toBeNull();
    const manifest = JSON.parse(readFileSync(manifestPath, "utf8")) as DevManifest;
    expect((await fetch(`${manifest.baseUrl}/health`)).status).toBe(200);
    const children = childrenOf(dev.pid!);
    const anvil = children.find((c) => c.args.includes("anvil"));
    expect(anvil).toBeDefined();

    const signalledAt = Date.now();
    dev.kill("SIGTERM");
    const { code, at } = await exit;
    expect(code).toBe(0);
    expect(at - signalledAt).toBeLessThan(2000);
    // anvil was stopped before the exit; nothing else it started is left either.
    expect(alive(anvil!.pid)).toBe(false);
    await eventually(async () => children.every((c) => !alive(c.pid)), 2000);
    await expect(fetch(manifest.rpcUrl, { method: "POST" })).rejects.toThrow();
  }, 90_000);

  it("a SIGTERM while it is still starting stops it too, anvil included", async () => {
    const { dev, exit } = startDev();
    // anvil runs and the market is being seeded: the sandbox is not ready yet.
    await new Promise<void>((resolve) =>
      watchLogs(dev, (entry) => {
        if (entry.msg === "demo market deployed") resolve();
      }),
    );
    const anvil = childrenOf(dev.pid!).find((c) => c.args.includes("anvil"));
    expect(anvil).toBeDefined();
    dev.kill("SIGTERM");
    const { code } = await exit;
    expect(code).toBe(0);
    expect(alive(anvil!.pid)).toBe(false);
  }, 90_000);

  /** Every process below `root` (children, their children, ...), read from one `ps` table. */
  const descendantsOf = (root: number) => {
    const table = execFileSync("ps", ["-e", "-o", "pid=,ppid=,args="], { encoding: "utf8" })
      .trim()
      .split("\n")
      .map((line) => line.trim().split(/\s+/))
      .map(([pid, ppid, ...args]) => ({
        pid: Number(pid),
        ppid: Number(ppid),
        args: args.join(" "),
      }));
    const found: { pid: number; args: string }[] = [];
    const walk = (parent: number): void => {
      for (const row of table.filter((r) => r.ppid === parent)) {
        found.push({ pid: row.pid, args: row.args });
        walk(row.pid);
      }
    };
    walk(root);
    return found;
  };

  // Issue 19, item 10: `npm run` starts a script through `sh`, which does not pass a signal on;
  // a supervisor that signals only npm's PID left the gateway and anvil running.
  for (const signal of ["SIGTERM", "SIGINT"] as const) {
    it(`npm start stops everything it started when only npm's PID gets ${signal}`, async () => {
      const stateDir = mkdtempSync(join(tmpdir(), "gateway-npm-start-"));
      const npm = spawn("npm", ["start", "--silent"], {
        env: { PATH: process.env.PATH, PORT: "0", GATEWAY_STATE_DIR: stateDir, LOG_LEVEL: "info" },
        stdio: ["ignore", "pipe", "pipe"],
      });
      started.push({ dev: npm, stateDir });
      auditChildLogs(npm, "npm start");
      const exit = exited(npm);
      const manifestPath = join(stateDir, "dev.json");
      await eventually(async () => existsSync(manifestPath) || npm.exitCode !== null, 60_000, 100);
      expect(npm.exitCode).toBeNull();
      const manifest = JSON.parse(readFileSync(manifestPath, "utf8")) as DevManifest;
      expect((await fetch(`${manifest.baseUrl}/health`)).status).toBe(200);
      const below = descendantsOf(npm.pid!);
      strays.push(...below.map((p) => p.pid));
      expect(below.some((p) => p.args.includes("anvil"))).toBe(true);
      // npm's script runs the build, through `exec`: no shell and no loader (tsx and its esbuild
      // service) between npm and the gateway.
      const commands = below.map((p) => p.args);
      expect(commands).toHaveLength(2);
      expect(commands).toContain("node dist/src/cli/main.js dev");
      expect(commands.filter((c) => c.includes("anvil"))).toHaveLength(1);

      npm.kill(signal);
      await exit;
      // Nothing npm started is left: not the gateway, not anvil.
      await eventually(async () => below.every((p) => !alive(p.pid)), 20_000, 100);
      await expect(fetch(manifest.rpcUrl, { method: "POST" })).rejects.toThrow();
      await expect(fetch(`${manifest.baseUrl}/health`)).rejects.toThrow();
    }, 120_000);
  }
});

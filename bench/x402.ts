import { readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { decodePaymentRequiredHeader, encodePaymentSignatureHeader } from "@x402/core/http";
import { UptoEvmScheme } from "@x402/evm/upto/client";
import type pg from "pg";
import { privateKeyToAccount } from "viem/accounts";
import { startSandbox } from "../src/dev/sandbox.js";
import { createLogger } from "../src/runtime/logger.js";
import { intSetting } from "./lib/settings.js";

/**
 * `npm run bench:x402`: what one x402-paid JSON chat request costs beside a permit's
 * (issue 37), on `npm start`'s own stack (anvil with Permit2 and the upto proxy, the gateway
 * in this process over its in-memory PGlite, the demo provider): per request, the wall time,
 * this process's CPU (gateway, database and client; the client's work is the same for both, and
 * the payments are signed before the measured window), anvil's CPU (the payment's simulation),
 * and the database statements the gateway sends. Sequential requests, after a warm-up; the
 * settlement worker is stopped, so nothing settles in the window. See bench/README.md.
 */

const requests = intSetting("BENCH_X402_REQUESTS", 200, 10, 100_000);
const warmup = intSetting("BENCH_X402_WARMUP", 20, 0, 10_000);

/** Clock ticks of a process (utime + stime), from /proc. */
function ticksOf(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return Number(fields[11]) + Number(fields[12]);
}
/** Linux's USER_HZ. */
const ticksPerSecond = 100;

/**
 * Counts the statements sent to the database through `pool`: its own queries and those of the
 * clients it hands out (transactions), whichever way they are checked out.
 */
function countStatements(pool: pg.Pool): { count: number } {
  const counted = { count: 0 };
  const wrapped = new WeakSet<object>();
  const wrap = (client: pg.PoolClient): pg.PoolClient => {
    if (wrapped.has(client)) return client;
    wrapped.add(client);
    const query = client.query.bind(client) as (...args: unknown[]) => unknown;
    (client as unknown as { query: (...args: unknown[]) => unknown }).query = (...args) => {
      counted.count++;
      return query(...args);
    };
    return client;
  };
  // pg's Pool.query checks a client out with a callback, and counts as the client's query.
  pool.on("connect", (client) => wrap(client as pg.PoolClient));
  pool.on("acquire", (client) => wrap(client as pg.PoolClient));
  return counted;
}

interface Figures {
  readonly wallMedianMs: number;
  readonly wallP90Ms: number;
  readonly cpuMsPerRequest: number;
  readonly anvilCpuMsPerRequest: number;
  readonly statementsPerRequest: number;
}

function progress(message: string): void {
  process.stderr.write(`[bench:x402] ${message}\n`);
}

async function main(): Promise<void> {
  const stateDir = await mkdtemp(join(tmpdir(), "bench-x402-"));
  const logger = createLogger("warn");
  const sandbox = await startSandbox({ stateDir, port: 0, logger });
  progress("sandbox up");
  try {
    await sandbox.worker.stop();
    const m = sandbox.manifest;
    const url = `${m.baseUrl}/v1/chat/completions`;
    const body = JSON.stringify({
      model: m.models[0]!.id,
      messages: [{ role: "user", content: "hello from the bench" }],
      max_tokens: 64,
    });
    const json = { "content-type": "application/json" };
    const permitHeaders = {
      ...json,
      authorization: `Bearer ${m.apiKey}`,
      "x-gateway-permit": m.permitId,
    };
    const priced = await fetch(url, { method: "POST", headers: json, body });
    const asked = decodePaymentRequiredHeader(priced.headers.get("payment-required")!).accepts[0]!;
    const scheme = new UptoEvmScheme(privateKeyToAccount(m.payer.privateKey));
    const sign = async () =>
      encodePaymentSignatureHeader({
        x402Version: 2,
        accepted: asked,
        payload: (await scheme.createPaymentPayload(2, asked)).payload,
      });
    const statements = countStatements(sandbox.gateway.db.pool);

    async function measure(headersFor: (i: number) => Record<string, string>): Promise<Figures> {
      const walls: number[] = [];
      const cpu = process.cpuUsage();
      const anvil = ticksOf(sandbox.anvil.pid);
      const sent = statements.count;
      for (let i = 0; i < requests; i++) {
        const started = performance.now();
        const res = await fetch(url, { method: "POST", headers: headersFor(i), body });
        await res.arrayBuffer();
        if (res.status !== 200) throw new Error(`request ${i}: HTTP ${res.status}`);
        walls.push(performance.now() - started);
      }
      const used = process.cpuUsage(cpu);
      walls.sort((a, b) => a - b);
      return {
        wallMedianMs: walls[Math.floor(walls.length / 2)]!,
        wallP90Ms: walls[Math.floor(walls.length * 0.9)]!,
        cpuMsPerRequest: (used.user + used.system) / 1000 / requests,
        anvilCpuMsPerRequest:
          ((ticksOf(sandbox.anvil.pid) - anvil) * 1000) / ticksPerSecond / requests,
        statementsPerRequest: (statements.count - sent) / requests,
      };
    }

    // Warm-up of both paths, then the measured windows, the payments signed beforehand.
    const warm = await Promise.all(Array.from({ length: warmup }, sign));
    for (const h of warm) {
      await (
        await fetch(url, { method: "POST", headers: { ...json, "payment-signature": h }, body })
      ).arrayBuffer();
      await (await fetch(url, { method: "POST", headers: permitHeaders, body })).arrayBuffer();
    }
    progress("warmed up");
    const payments = await Promise.all(Array.from({ length: requests }, sign));
    const permit = await measure(() => permitHeaders);
    const paid = await measure((i) => ({ ...json, "payment-signature": payments[i]! }));
    const row = (name: string, f: Figures) =>
      `| ${name} | ${f.wallMedianMs.toFixed(2)} | ${f.wallP90Ms.toFixed(2)} | ${f.cpuMsPerRequest.toFixed(2)} | ${f.anvilCpuMsPerRequest.toFixed(2)} | ${f.statementsPerRequest.toFixed(2)} |`;
    console.log(
      [
        `x402-paid JSON chat beside a permit's: ${requests} sequential requests each, after ${warmup} warm-up`,
        "",
        "| request | wall median ms | wall p90 ms | CPU ms / request (this process) | anvil CPU ms / request | statements / request |",
        "| --- | --- | --- | --- | --- | --- |",
        row("permit (API key)", permit),
        row("x402 upto", paid),
      ].join("\n"),
    );
  } finally {
    await sandbox.close();
    await rm(stateDir, { recursive: true, force: true });
  }
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});

import { readFileSync } from "node:fs";
import { decodePaymentRequiredHeader, encodePaymentSignatureHeader } from "@x402/core/http";
import { UptoEvmScheme } from "@x402/evm/upto/client";
import { privateKeyToAccount } from "viem/accounts";
import type { AnvilInstance } from "../../src/adapters/chain/anvil.js";
import { approvePermit2, placeX402OnAnvil } from "../../src/dev/x402-placement.js";
import type { PgCpuProbe } from "./pg-cpu.js";
import { startChild, type ChildHandle } from "./processes.js";
import { requestBody } from "./measure.js";
import type { BenchMarket } from "./setup.js";

/**
 * The x402 phase of `npm run bench` (issue 37): one x402-paid JSON chat request beside a
 * permit's, on a gateway process of its own (x402 on, the settlement key set, the same database
 * and offers as the measured gateway, which stays idle), sequential requests in alternating
 * rounds so that a slow moment of the machine lands on both. Per request: the wall time, the
 * gateway's CPU (the payment's checks and signature recovery included), PostgreSQL's CPU (the
 * bench database's backends) and anvil's CPU (the payment's simulation). Nothing settles in the
 * window: no settlement worker runs, and the payments are signed before it.
 */

export interface X402PathFigures {
  readonly requests: number;
  readonly wallMedianMs: number;
  readonly wallP90Ms: number;
  readonly gatewayCpuMsPerRequest: number;
  /** Undefined when the probe cannot read PostgreSQL's CPU. */
  readonly postgresCpuMsPerRequest: number | undefined;
  readonly anvilCpuMsPerRequest: number;
}

export interface X402Figures {
  readonly permit: X402PathFigures;
  readonly x402: X402PathFigures;
}

/** Clock ticks of a process (utime + stime), from /proc. */
function ticksOf(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return Number(fields[11]) + Number(fields[12]);
}

interface Totals {
  walls: number[];
  gatewayMs: number;
  postgresMs: number | undefined;
  anvilTicks: number;
}

export async function x402Phase(options: {
  readonly market: BenchMarket;
  readonly anvil: AnvilInstance;
  readonly gatewayEnv: NodeJS.ProcessEnv;
  readonly apiKey: string;
  readonly probe: PgCpuProbe;
  /** Requests per path (split into rounds). */
  readonly requests: number;
  readonly log: (message: string) => void;
  readonly clockTicksPerSecond: number;
}): Promise<X402Figures> {
  const { market, anvil, probe, log } = options;
  await placeX402OnAnvil(market.clients, anvil.rpcUrl);
  const token = market.demo.models[0]!.creditToken;
  await approvePermit2(market.clients, market.roles.payer.privateKey, token);
  let gateway: ChildHandle | undefined;
  try {
    gateway = await startChild(
      "gateway-x402",
      "../dist/bench/gateway.js",
      {
        ...options.gatewayEnv,
        X402_ENABLED: "true",
        SETTLEMENT_PRIVATE_KEY: market.roles.settlement.privateKey,
        // No closing permit is settled while it is measured.
        SETTLEMENT_CLOSE_CHECK_MS: "3600000",
      },
      90_000,
    );
    const url = `${gateway.url}/v1/chat/completions`;
    const body = requestBody("json");
    const json = { "content-type": "application/json" };
    const permitHeaders = {
      ...json,
      authorization: `Bearer ${options.apiKey}`,
      "x-gateway-permit": market.permitId,
    };
    const priced = await fetch(url, { method: "POST", headers: json, body });
    await priced.arrayBuffer();
    if (priced.status !== 402)
      throw new Error(`x402: the unpaid request answered ${priced.status}`);
    const asked = decodePaymentRequiredHeader(priced.headers.get("payment-required")!).accepts[0]!;
    const scheme = new UptoEvmScheme(privateKeyToAccount(market.roles.payer.privateKey));
    const sign = async (): Promise<string> =>
      encodePaymentSignatureHeader({
        x402Version: 2,
        accepted: asked,
        payload: (await scheme.createPaymentPayload(2, asked)).payload,
      });
    const rounds = 4;
    const perRound = Math.ceil(options.requests / rounds);
    const warmup = 20;
    // Every payment signed before any measured window (the client's work, not the gateway's).
    const payments = await Promise.all(
      Array.from({ length: warmup + rounds * perRound }, () => sign()),
    );
    let next = 0;
    const send = async (headers: Record<string, string>): Promise<number> => {
      const started = performance.now();
      const res = await fetch(url, { method: "POST", headers, body });
      await res.arrayBuffer();
      if (res.status !== 200) throw new Error(`x402 phase: HTTP ${res.status}`);
      return performance.now() - started;
    };
    const paidHeaders = () => ({ ...json, "payment-signature": payments[next++]! });
    for (let i = 0; i < warmup; i++) {
      await send(permitHeaders);
      await send(paidHeaders());
    }
    const totals: Record<"permit" | "x402", Totals> = {
      permit: { walls: [], gatewayMs: 0, postgresMs: 0, anvilTicks: 0 },
      x402: { walls: [], gatewayMs: 0, postgresMs: 0, anvilTicks: 0 },
    };
    const child = gateway;
    const window = async (into: Totals, headers: () => Record<string, string>) => {
      const [before, pgBefore] = await Promise.all([child.stats(), probe.snapshot()]);
      const anvilBefore = ticksOf(anvil.pid);
      for (let i = 0; i < perRound; i++) into.walls.push(await send(headers()));
      const [after, pgAfter] = await Promise.all([child.stats(), probe.snapshot()]);
      into.anvilTicks += ticksOf(anvil.pid) - anvilBefore;
      into.gatewayMs +=
        (after.cpu.user + after.cpu.system - before.cpu.user - before.cpu.system) / 1000;
      into.postgresMs =
        into.postgresMs === undefined || pgBefore === undefined || pgAfter === undefined
          ? undefined
          : into.postgresMs + probe.between(pgBefore, pgAfter).cpuMs;
    };
    for (let round = 0; round < rounds; round++) {
      log(`x402: round ${round + 1} of ${rounds}, ${perRound} requests per path`);
      await window(totals.permit, () => permitHeaders);
      await window(totals.x402, paidHeaders);
    }
    const figures = (t: Totals): X402PathFigures => {
      const walls = [...t.walls].sort((a, b) => a - b);
      const n = walls.length;
      return {
        requests: n,
        wallMedianMs: walls[Math.floor(n / 2)]!,
        wallP90Ms: walls[Math.floor(n * 0.9)]!,
        gatewayCpuMsPerRequest: t.gatewayMs / n,
        postgresCpuMsPerRequest: t.postgresMs === undefined ? undefined : t.postgresMs / n,
        anvilCpuMsPerRequest: (t.anvilTicks * 1000) / options.clockTicksPerSecond / n,
      };
    };
    return { permit: figures(totals.permit), x402: figures(totals.x402) };
  } finally {
    await gateway?.stop();
  }
}

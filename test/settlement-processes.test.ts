import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { createInterface } from "node:readline";
import type { Hex } from "viem";
import { afterAll, beforeAll, expect, it } from "vitest";
import { describeIfPostgres } from "./helpers/db.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { openPermit } from "./helpers/market.js";
import { chainPermit, chatOn, settlementKey, settlementRows } from "./helpers/settlement.js";
import { json, startChatStack, type TestStack } from "./helpers/stack.js";

interface GatewayProcess {
  readonly child: ChildProcess;
  readonly url: string;
}

/** `gateway serve` as its own process on the stack's PostgreSQL and anvil; resolves once it listens. */
async function serveProcess(stack: TestStack): Promise<GatewayProcess> {
  const child = spawn(process.execPath, ["--import", "tsx", "src/cli/main.ts", "serve"], {
    env: {
      PATH: process.env.PATH,
      DATABASE_URL: stack.database.url!,
      ENDPOINT_ENCRYPTION_KEY: randomBytes(32).toString("hex"),
      RPC_URL: stack.config.rpcUrl,
      CHAIN_ID: String(stack.config.chainId),
      MARKET_ADDRESS: stack.config.marketAddress,
      START_BLOCK: stack.config.startBlock.toString(),
      CONFIRMATIONS: "0",
      SETTLEMENT_OPERATOR_TOKEN: stack.operatorToken,
      SETTLEMENT_PRIVATE_KEY: settlementKey,
      PROBE_INTERVAL_MS: "600000",
      HOST: "127.0.0.1",
      PORT: "0",
      LOG_LEVEL: "info",
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const lines = createInterface({ input: child.stdout! });
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("gateway process did not start")), 30_000);
    child.once("exit", (code) => reject(new Error(`gateway process exited with ${code}`)));
    lines.on("line", (line) => {
      try {
        const entry = JSON.parse(line) as { msg?: string; url?: string };
        if (entry.msg === "gateway listening" && entry.url !== undefined) {
          clearTimeout(timer);
          resolve(entry.url);
        }
      } catch {
        // not a log line
      }
    });
  });
  return { child, url };
}

async function stop(p: GatewayProcess | undefined): Promise<void> {
  if (p === undefined || p.child.exitCode !== null) return;
  const exited = new Promise((r) => p.child.once("exit", r));
  p.child.kill("SIGTERM");
  const timer = setTimeout(() => p.child.kill("SIGKILL"), 10_000);
  await exited;
  clearTimeout(timer);
}

describeIfPostgres("two gateway processes flushing at once", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let a: GatewayProcess | undefined;
  let b: GatewayProcess | undefined;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack({ PERMIT_CACHE_MS: "0" }));
    [a, b] = await Promise.all([serveProcess(stack), serveProcess(stack)]);
  }, 60_000);
  afterAll(async () => {
    await Promise.all([stop(a), stop(b)]);
    await fake?.stop();
    await stack?.close();
  });

  const flushAt = async (p: GatewayProcess) => {
    const res = await fetch(`${p.url}/settlements/flush`, {
      method: "POST",
      headers: { authorization: `Bearer ${stack.operatorToken}` },
    });
    expect(res.status).toBe(200);
    return json(res);
  };

  it("settles every charge exactly once", async () => {
    const permits: Hex[] = [];
    const ids: string[] = [];
    const totals = new Map<Hex, bigint>();
    for (let p = 0; p < 3; p++) {
      const permitId = await openPermit(stack, { deposit: 10n ** 18n });
      permits.push(permitId);
      for (let i = 0; i < 4; i++) {
        const chat = await chatOn(stack, permitId);
        ids.push(chat.id);
        totals.set(permitId, (totals.get(permitId) ?? 0n) + chat.charged);
      }
    }
    // Three rounds of both processes at once: whoever holds the account's lease settles, the
    // other answers busy at once; neither sends a transaction for a charge the other has.
    let settledRequests = 0;
    let busy = 0;
    for (let round = 0; round < 3; round++) {
      const answers = await Promise.all([flushAt(a!), flushAt(b!)]);
      for (const answer of answers) {
        settledRequests += answer.settled_requests;
        if (answer.busy) busy++;
      }
    }
    // Each charge counted by exactly one flush answer, across both processes.
    expect(settledRequests).toBe(ids.length);
    stack.logger.info({ busy }, "busy answers in the two-process flush test");
    for (const permitId of permits) {
      expect((await chainPermit(stack, permitId)).settled).toBe(totals.get(permitId));
    }
    const rows = await settlementRows(stack, ids);
    expect(rows.map((r) => r.settlement_status)).toEqual(ids.map(() => "settled"));
    // One batch id per transaction on chain, each settled once.
    const { rows: batches } = await stack.database.db.pool.query<{ n: string; settled: string }>(
      "SELECT count(*) AS n, count(*) FILTER (WHERE status = 'settled') AS settled FROM settlement_batches",
    );
    expect(batches[0]!.n).toBe(batches[0]!.settled);
  });
});

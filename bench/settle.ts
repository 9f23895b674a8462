import { randomBytes } from "node:crypto";
import { availableParallelism } from "node:os";
import { performance } from "node:perf_hooks";
import { pino } from "pino";
import {
  encodeFunctionData,
  zeroHash,
  type Address,
  type Hex,
  type TransactionReceipt,
} from "viem";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { startAnvil, type AnvilAccount, type AnvilInstance } from "../src/adapters/chain/anvil.js";
import { creditTokenAbi, marketAbi } from "../gen/contracts/artifacts.js";
import { chainClients, type ChainClients } from "../src/adapters/chain/clients.js";
import { deployCreditToken, deployMarket } from "../src/adapters/chain/deploy.js";
import { createChainSettlement } from "../src/adapters/chain/settlement.js";
import { openDatabase, type Database } from "../src/adapters/pg/database.js";
import { migrate } from "../src/adapters/pg/migrate.js";
import { createPgSettlementStore } from "../src/adapters/pg/settlement.js";
import { demoMetadata, demoTariff, id32 } from "../src/dev/demo-market.js";
import { seededRandom } from "../src/domain/audits/random.js";
import {
  createSettlementFlusher,
  type BatchReport,
  type SettlementChain,
  type SettlementStore,
} from "../src/domain/settlement/index.js";
import { createLogger } from "../src/runtime/logger.js";
import { intSetting } from "./lib/settings.js";
import { createBenchDatabase } from "./lib/setup.js";

/**
 * `npm run bench:settle`: how fast the settlement flusher drains a backlog of charges. anvil
 * with a fresh market (one model, three offers with distinct payouts, N permits), a fresh
 * database holding charged, closed requests as the gateway's close leaves them, and the real
 * flusher (PostgreSQL store, viem chain adapter) run in-process until nothing is pending. Then
 * the chain is checked against the rows: every charge settled exactly once. See bench/README.md.
 */

// ------------------------------------------------------------------ settings

const settings = {
  charges: intSetting("BENCH_SETTLE_CHARGES", 10_000, 1, 1_000_000),
  permits: intSetting("BENCH_SETTLE_PERMITS", 100, 1, 10_000),
  maxBatchGas: BigInt(intSetting("SETTLEMENT_MAX_BATCH_GAS", 12_000_000, 200_000, 1_000_000_000)),
  serverUrl: process.env.BENCH_DATABASE_URL || process.env.TEST_DATABASE_URL || undefined,
};
const offerCount = 3;
/** Rows per INSERT of the requests. */
const insertChunk = 2_500;
/** Gas limit of every setup transaction (each is mined in its own block; anvil's limit is 30M). */
const setupGas = 1_000_000n;
const setupBudgetMs = 180_000;
const budgetMs = setupBudgetMs + 300_000 + settings.charges * 10;

function log(message: string): void {
  process.stderr.write(`[bench:settle] ${message}\n`);
}

const fmt = (n: number | bigint, digits = 0): string =>
  typeof n === "bigint"
    ? n.toLocaleString("en-US")
    : n.toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });

// ------------------------------------------------------------------ the plan

interface PlannedRequest {
  readonly id: Hex;
  readonly permit: number;
  readonly offer: number;
  readonly inputTokens: number;
  readonly outputTokens: number;
  readonly maximum: bigint;
  readonly charged: bigint;
  readonly completedAt: number;
}

/** What `tokens` cost at the demo tariff: the price per million tokens, rounded down. */
const price = (input: number, output: number): bigint =>
  (BigInt(input) * demoTariff.inputPricePerMTok + BigInt(output) * demoTariff.outputPricePerMTok) /
  1_000_000n;

/**
 * The charges: each on a random permit and offer, with 10-2,000 input tokens and 1-1,024 of a
 * 1,024-token output limit, charged at the demo tariff (the reservation, `maximum_credits`, is
 * the price of the full limit, so every charge is positive and within it), completed one second
 * apart, oldest first.
 */
function planRequests(charges: number, permits: number): PlannedRequest[] {
  const rng = seededRandom(20_261_122);
  const maxOutput = 1024;
  const start = Math.floor(Date.now() / 1000) - charges - 60;
  return Array.from({ length: charges }, (_, i) => {
    const inputTokens = 10 + Math.floor(rng() * 1991);
    const outputTokens = 1 + Math.floor(rng() * maxOutput);
    return {
      id: `0x${randomBytes(32).toString("hex")}`,
      permit: Math.floor(rng() * permits),
      offer: Math.floor(rng() * offerCount),
      inputTokens,
      outputTokens,
      maximum: price(inputTokens, maxOutput),
      charged: price(inputTokens, outputTokens),
      completedAt: start + i,
    };
  });
}

// ------------------------------------------------------------------ chain setup

interface Call {
  readonly label: string;
  readonly to: Address;
  readonly data: Hex;
}

/**
 * Sends `calls` from one account with consecutive explicit nonces, signed locally and sent back
 * to back without waiting for receipts (several accounts send in parallel); resolves with the
 * receipts once every one was mined, and throws if any reverted.
 */
async function sendAll(
  clients: ChainClients,
  from: AnvilAccount,
  calls: readonly Call[],
): Promise<TransactionReceipt[]> {
  if (calls.length === 0) return [];
  const { publicClient, chain } = clients;
  const account = privateKeyToAccount(from.privateKey);
  const [nonce, fees] = await Promise.all([
    publicClient.getTransactionCount({ address: account.address, blockTag: "pending" }),
    publicClient.estimateFeesPerGas({ chain: null, type: "eip1559" }),
  ]);
  const signed = await Promise.all(
    calls.map((call, i) =>
      account.signTransaction({
        chainId: chain.id,
        type: "eip1559",
        to: call.to,
        data: call.data,
        nonce: nonce + i,
        gas: setupGas,
        maxFeePerGas: fees.maxFeePerGas * 2n,
        maxPriorityFeePerGas: fees.maxPriorityFeePerGas,
      }),
    ),
  );
  // In nonce order, each after the last was accepted: anvil queues a nonce that arrives before
  // its predecessor, but automine does not always mine the queue once the gap is filled.
  const hashes: Hex[] = [];
  for (const raw of signed) {
    hashes.push(await publicClient.sendRawTransaction({ serializedTransaction: raw }));
  }
  const receipts = await Promise.all(
    hashes.map((hash) =>
      publicClient.waitForTransactionReceipt({ hash, pollingInterval: 25, timeout: 30_000 }),
    ),
  );
  receipts.forEach((receipt, i) => {
    if (receipt.status !== "success") {
      throw new Error(
        `setup transaction "${calls[i]!.label}" (${receipt.transactionHash}) reverted`,
      );
    }
  });
  return receipts;
}

interface BenchChain {
  readonly clients: ChainClients;
  readonly market: Address;
  readonly deployBlock: bigint;
  readonly creditToken: Address;
  readonly modelId: Hex;
  readonly offers: readonly { offerId: Hex; payout: Address }[];
  readonly permits: readonly { permitId: Hex; deposit: bigint }[];
  readonly settlement: AnvilAccount;
  readonly setupTransactions: number;
}

/**
 * The market with anvil account 1 as settlement operator; one model (account 2 its creator and
 * its credit token's owner) with three offers (account 3 their operator, each paying out to a
 * fresh address of its own); and one unpinned permit per entry of `deposits`, opened by account 4.
 */
async function setUpChain(anvil: AnvilInstance, deposits: readonly bigint[]): Promise<BenchChain> {
  const clients = chainClients(anvil.chainId, anvil.rpcUrl, 25);
  const { publicClient } = clients;
  const [deployer, settlement, creator, operator, payer] = anvil.accounts;
  if (!deployer || !settlement || !creator || !operator || !payer) {
    throw new Error("anvil has fewer than 5 accounts");
  }
  const tag = randomBytes(4).toString("hex");

  // Different accounts, so in parallel.
  const [market, creditToken] = await Promise.all([
    deployMarket(clients.wallet(deployer.privateKey), publicClient, {
      settlementOperator: settlement.address,
      closeGracePeriod: 3600n,
    }),
    deployCreditToken(clients.wallet(creator.privateKey), publicClient, {
      name: "bench credits",
      symbol: "BENCH",
      owner: creator.address,
    }),
  ]);
  const deployBlock = await publicClient.getBlockNumber();
  const modelId = id32(`model:bench-settle:${tag}`);
  const total = deposits.reduce((a, b) => a + b, 0n);

  // The model (created, then activated) and the payer's credits; then the offers and permits.
  await Promise.all([
    sendAll(clients, creator, [
      {
        label: "createModel",
        to: market,
        data: encodeFunctionData({
          abi: marketAbi,
          functionName: "createModel",
          args: [modelId, creditToken, "bench/settle", "v1", "chat", id32(`pool:${tag}`), 1n],
        }),
      },
      {
        label: "setModelStatus",
        to: market,
        data: encodeFunctionData({
          abi: marketAbi,
          functionName: "setModelStatus",
          args: [modelId, 1],
        }),
      },
      {
        label: "mint",
        to: creditToken,
        data: encodeFunctionData({
          abi: creditTokenAbi,
          functionName: "mint",
          args: [payer.address, total],
        }),
      },
    ]),
    sendAll(clients, payer, [
      {
        label: "approve",
        to: creditToken,
        data: encodeFunctionData({
          abi: creditTokenAbi,
          functionName: "approve",
          args: [market, total],
        }),
      },
    ]),
  ]);

  const offers = Array.from({ length: offerCount }, (_, i) => ({
    offerId: id32(`offer:bench-settle:${tag}:${i}`),
    payout: privateKeyToAccount(generatePrivateKey()).address,
  }));
  const permits = deposits.map((deposit, i) => ({
    permitId: id32(`permit:bench-settle:${tag}:${i}`),
    deposit,
  }));
  const head = await publicClient.getBlock();
  const expiresAt = head.timestamp + 30n * 24n * 3600n;
  await Promise.all([
    sendAll(
      clients,
      operator,
      offers.map((o, i) => ({
        label: `createOffer ${i}`,
        to: market,
        data: encodeFunctionData({
          abi: marketAbi,
          functionName: "createOffer",
          args: [
            o.offerId,
            modelId,
            operator.address,
            o.payout,
            demoTariff,
            demoMetadata(`region-${i}`, "cpu"),
          ],
        }),
      })),
    ),
    sendAll(
      clients,
      payer,
      permits.map((p, i) => ({
        label: `openPermit ${i}`,
        to: market,
        data: encodeFunctionData({
          abi: marketAbi,
          functionName: "openPermit",
          args: [p.permitId, modelId, zeroHash, p.deposit, expiresAt],
        }),
      })),
    ),
  ]);
  return {
    clients,
    market,
    deployBlock,
    creditToken,
    modelId,
    offers,
    permits,
    settlement,
    setupTransactions: 2 + 3 + 1 + offers.length + permits.length,
  };
}

// ------------------------------------------------------------------ database setup

/**
 * The requests as `gw_close_request` leaves a billed one: completed, billed, charged,
 * settlement `unsettled`; their permits' ledgers (charged = the sum, nothing reserved or
 * settled) and the offers' load rows (nothing in flight). Quotes are not made: settlement never
 * reads them.
 */
async function insertCharges(
  db: Database,
  chain: BenchChain,
  plan: readonly PlannedRequest[],
  sums: readonly bigint[],
): Promise<number> {
  let statements = 0;
  for (let from = 0; from < plan.length; from += insertChunk) {
    const rows = plan.slice(from, from + insertChunk);
    await db.pool.query(
      `INSERT INTO inference_requests (id, api_key_id, instance_id, model, model_id, offer_id,
         permit_id, quote_id, stream, status, input_tokens, output_tokens, maximum_credits,
         credits_charged, billing, usage_source, tariff_version, created_at, completed_at,
         settlement_status)
       SELECT u.id, 'key_bench', 'gw_bench', 'bench-chat', $1, u.offer_id, u.permit_id,
         'q' || substr(u.id, 3), false, 'completed', u.input_tokens, u.output_tokens, u.maximum,
         u.charged, 'billed', 'provider', 1, u.completed_at - 1, u.completed_at, 'unsettled'
       FROM unnest($2::text[], $3::text[], $4::text[], $5::numeric[], $6::numeric[],
         $7::numeric[], $8::numeric[], $9::bigint[])
         AS u(id, offer_id, permit_id, input_tokens, output_tokens, maximum, charged, completed_at)`,
      [
        chain.modelId,
        rows.map((r) => r.id),
        rows.map((r) => chain.offers[r.offer]!.offerId),
        rows.map((r) => chain.permits[r.permit]!.permitId),
        rows.map((r) => String(r.inputTokens)),
        rows.map((r) => String(r.outputTokens)),
        rows.map((r) => r.maximum.toString()),
        rows.map((r) => r.charged.toString()),
        rows.map((r) => String(r.completedAt)),
      ],
    );
    statements++;
  }
  const charged = chain.permits.map((p, i) => ({ permitId: p.permitId, sum: sums[i]! }));
  const used = charged.filter((c) => c.sum > 0n);
  await db.pool.query(
    `INSERT INTO permit_ledgers (permit_id, reserved, charged, settled)
     SELECT u.permit_id, 0, u.charged, 0 FROM unnest($1::text[], $2::numeric[]) AS u(permit_id, charged)`,
    [used.map((c) => c.permitId), used.map((c) => c.sum.toString())],
  );
  await db.pool.query(
    `INSERT INTO offer_loads (offer_id, in_flight) SELECT unnest($1::text[]), 0`,
    [chain.offers.map((o) => o.offerId)],
  );
  await db.pool.query("ANALYZE inference_requests");
  return statements + 2;
}

// ------------------------------------------------------------------ timing of the ports

interface CallStats {
  calls: number;
  ms: number;
}

/** `target` with every method timed into `stats` under `prefix.method`. */
function timed<T extends object>(prefix: string, target: T, stats: Map<string, CallStats>): T {
  const record = (name: string, started: number): void => {
    const entry = stats.get(name) ?? { calls: 0, ms: 0 };
    entry.calls++;
    entry.ms += performance.now() - started;
    stats.set(name, entry);
  };
  return new Proxy(target, {
    get(object, property, receiver) {
      const value: unknown = Reflect.get(object, property, receiver);
      if (typeof value !== "function") return value;
      const name = `${prefix}.${String(property)}`;
      return (...args: unknown[]): unknown => {
        const started = performance.now();
        const result: unknown = (value as (...a: unknown[]) => unknown).apply(object, args);
        if (result instanceof Promise) return result.finally(() => record(name, started));
        record(name, started);
        return result;
      };
    },
  });
}

// ------------------------------------------------------------------ the run

async function main(): Promise<number> {
  const cleanups: { what: string; run: () => Promise<void> }[] = [];
  let cleaning: Promise<void> | undefined;
  const cleanup = (): Promise<void> => {
    cleaning ??= (async () => {
      for (const step of cleanups.reverse()) {
        try {
          await step.run();
        } catch (error) {
          log(`cleanup: ${step.what} failed: ${(error as Error).message}`);
        }
      }
    })();
    return cleaning;
  };
  let aborted: string | undefined;
  const checkAborted = (): void => {
    if (aborted !== undefined) throw new Error(`aborted (${aborted})`);
  };
  const abort = (reason: string, code: number): void => {
    if (aborted !== undefined) return;
    aborted = reason;
    log(`${reason}: stopping anvil and dropping the database`);
    const force = setTimeout(() => process.exit(code), 20_000);
    force.unref();
    void cleanup().finally(() => process.exit(code));
  };
  const watchdog = setTimeout(
    () => abort(`the run exceeded its ${Math.round(budgetMs / 1000)} s budget`, 3),
    budgetMs,
  );
  process.once("SIGINT", () => abort("SIGINT", 130));
  process.once("SIGTERM", () => abort("SIGTERM", 143));

  try {
    // ---------------------------------------------------------------- the plan
    const plan = planRequests(settings.charges, settings.permits);
    const sums = Array.from({ length: settings.permits }, () => 0n);
    const offerSums = Array.from({ length: offerCount }, () => 0n);
    for (const r of plan) {
      sums[r.permit] = sums[r.permit]! + r.charged;
      offerSums[r.offer] = offerSums[r.offer]! + r.charged;
    }
    // Each permit's deposit: its charges and a tenth more (at least one credit unit).
    const deposits = sums.map((s) => s + s / 10n + 1n);
    if (sums.some((s, i) => s > deposits[i]!)) throw new Error("a deposit does not cover its sum");
    const pairs = new Set(plan.map((r) => r.permit * offerCount + r.offer)).size;

    // ---------------------------------------------------------------- database
    const setupStarted = performance.now();
    let db: Database;
    let databaseLabel: string;
    if (settings.serverUrl !== undefined) {
      const server = new URL(settings.serverUrl);
      log(`creating a database on ${server.host}`);
      const bench = await createBenchDatabase(settings.serverUrl);
      cleanups.push({ what: `dropping database ${bench.name}`, run: () => bench.drop() });
      checkAborted();
      db = await openDatabase({ url: bench.url });
      databaseLabel = `PostgreSQL, database ${bench.name} on ${server.host} (dropped at the end)`;
    } else {
      log("starting an embedded PGlite (no BENCH_DATABASE_URL or TEST_DATABASE_URL)");
      db = await openDatabase();
      databaseLabel = "PGlite (embedded, in memory; set BENCH_DATABASE_URL for PostgreSQL)";
    }
    cleanups.push({ what: "closing the database", run: () => db.close() });
    checkAborted();
    await migrate(db.pool);
    const databaseMs = performance.now() - setupStarted;
    log(`database ready and migrated in ${fmt(databaseMs / 1000, 2)} s`);

    // ---------------------------------------------------------------- chain
    log("starting anvil (automine)");
    const anvil = await startAnvil({ chainId: 31337 });
    cleanups.push({ what: "stopping anvil", run: () => anvil.stop() });
    checkAborted();
    log(`deploying the market, 1 model, ${offerCount} offers, ${settings.permits} permits`);
    const chainStarted = performance.now();
    const chain = await setUpChain(anvil, deposits);
    const chainSetupMs = performance.now() - chainStarted;
    log(
      `${chain.setupTransactions} setup transactions in ${fmt(chainSetupMs / 1000, 2)} s; ` +
        `market ${chain.market}`,
    );
    checkAborted();

    log(`inserting ${fmt(settings.charges)} charged requests`);
    const insertStarted = performance.now();
    const statements = await insertCharges(db, chain, plan, sums);
    const insertMs = performance.now() - insertStarted;
    const setupMs = performance.now() - setupStarted;
    checkAborted();

    // ---------------------------------------------------------------- flush
    const stats = new Map<string, CallStats>();
    const store: SettlementStore = timed("store", createPgSettlementStore(db.pool), stats);
    const settlementChain: SettlementChain = timed(
      "chain",
      createChainSettlement({
        client: chain.clients.publicClient,
        chainId: anvil.chainId,
        market: chain.market,
        privateKey: chain.settlement.privateKey,
      }),
      stats,
    );
    const flusher = createSettlementFlusher({
      store,
      chain: settlementChain,
      holder: `bench_${randomBytes(4).toString("hex")}`,
      logger: createLogger("warn", pino.destination(2)),
      clock: () => Math.floor(Date.now() / 1000),
      confirmations: 0,
      maxBatchGas: settings.maxBatchGas,
      replaceAfterBlocks: 3,
      feeBumpPercent: 20,
      feeCap: { maxFeePerGas: 500_000_000_000n, maxPriorityFeePerGas: 50_000_000_000n },
      waitMs: 600_000,
      leaseSeconds: 30,
      pollMs: 50,
    });
    const pending = async (): Promise<number> =>
      Number(
        (
          await db.pool.query<{ n: string }>(
            `SELECT count(*) AS n FROM inference_requests
             WHERE settlement_status IN ('unsettled', 'settling')`,
          )
        ).rows[0]!.n,
      );

    log(`flushing (maxBatchGas ${fmt(settings.maxBatchGas)})`);
    const batches: BatchReport[] = [];
    let flushes = 0;
    const flushStarted = performance.now();
    for (;;) {
      checkAborted();
      const result = await flusher.flush();
      flushes++;
      if (result.busy) throw new Error("the flusher found its lease taken");
      if (result.unsettleable.length > 0) {
        throw new Error(
          `charges marked unsettleable: ${result.unsettleable.map((u) => `${u.permitId}/${u.offerId}: ${u.reason}`).join(", ")}`,
        );
      }
      batches.push(...result.batches);
      const stuck = result.batches.find((b) => b.status !== "settled");
      if (stuck !== undefined) {
        throw new Error(`batch ${stuck.batchId} ended ${stuck.status}: ${stuck.error ?? ""}`);
      }
      if (result.batches.length === 0) break;
      log(
        `flush ${flushes}: ${result.batches.length} batches, ${fmt(result.settledRequests)} requests ` +
          `(${fmt((performance.now() - flushStarted) / 1000, 2)} s)`,
      );
    }
    const flushMs = performance.now() - flushStarted;
    const left = await pending();

    // ---------------------------------------------------------------- verification
    log("verifying against the chain");
    const problems: string[] = [];
    if (left > 0) problems.push(`${left} requests are still unsettled or settling`);
    const statuses = await db.pool.query<{ settlement_status: string; n: string }>(
      "SELECT settlement_status, count(*) AS n FROM inference_requests GROUP BY 1 ORDER BY 1",
    );
    const settledRows = Number(
      statuses.rows.find((r) => r.settlement_status === "settled")?.n ?? "0",
    );
    if (settledRows !== settings.charges) {
      problems.push(
        `${fmt(settledRows)} of ${fmt(settings.charges)} rows settled (` +
          statuses.rows.map((r) => `${r.settlement_status} ${r.n}`).join(", ") +
          ")",
      );
    }

    const { publicClient } = chain.clients;
    const chainPermits = await Promise.all(
      chain.permits.map((p) =>
        publicClient.readContract({
          address: chain.market,
          abi: marketAbi,
          functionName: "getPermit",
          args: [p.permitId],
        }),
      ),
    );
    const ledgers = new Map(
      (
        await db.pool.query<{ permit_id: string; settled: string; charged: string }>(
          "SELECT permit_id, settled, charged FROM permit_ledgers",
        )
      ).rows.map((r) => [r.permit_id, r]),
    );
    let permitMismatches = 0;
    chain.permits.forEach((p, i) => {
      const onChain = chainPermits[i]!.settled;
      const ledger = ledgers.get(p.permitId);
      const ledgerSettled = ledger === undefined ? 0n : BigInt(ledger.settled);
      if (onChain !== sums[i]! || ledgerSettled !== sums[i]!) {
        permitMismatches++;
        if (permitMismatches <= 5) {
          problems.push(
            `permit ${p.permitId}: rows ${sums[i]}, chain settled ${onChain}, ledger settled ${ledgerSettled}`,
          );
        }
      }
    });
    if (permitMismatches > 5) problems.push(`... ${permitMismatches} permits differ in all`);

    const balances = await Promise.all(
      chain.offers.map((o) =>
        publicClient.readContract({
          address: chain.creditToken,
          abi: creditTokenAbi,
          functionName: "balanceOf",
          args: [o.payout],
        }),
      ),
    );
    chain.offers.forEach((o, i) => {
      if (balances[i] !== offerSums[i]) {
        problems.push(
          `offer ${i} payout ${o.payout}: balance ${balances[i]}, rows ${offerSums[i]!}`,
        );
      }
    });

    const batchRows = await db.pool.query<{
      batch_id: string;
      status: string;
      requests: number;
      gas_used: string | null;
    }>("SELECT batch_id, status, requests, gas_used FROM settlement_batches");
    const stored = new Map(batchRows.rows.map((r) => [r.batch_id, r]));
    const settledBatches = batchRows.rows.filter((r) => r.status === "settled");
    const events = await publicClient.getContractEvents({
      address: chain.market,
      abi: marketAbi,
      eventName: "BatchSettled",
      fromBlock: chain.deployBlock,
      toBlock: "latest",
    });
    const eventIds = events.map((e) => e.args.batchId?.toLowerCase());
    if (new Set(eventIds).size !== eventIds.length) {
      problems.push("a batch id appears in more than one BatchSettled event");
    }
    if (events.length !== settledBatches.length) {
      problems.push(
        `${events.length} BatchSettled events, ${settledBatches.length} settled batches stored`,
      );
    }
    if (settledBatches.length !== batches.length || batchRows.rows.length !== batches.length) {
      problems.push(
        `${batches.length} batches reported by flush(), ${batchRows.rows.length} stored ` +
          `(${settledBatches.length} settled)`,
      );
    }
    for (const id of eventIds) {
      if (id === undefined || stored.get(id)?.status !== "settled") {
        problems.push(`BatchSettled for ${id} has no settled batch row`);
      }
    }
    const gasOf = (b: BatchReport): bigint => {
      const row = stored.get(b.batchId);
      const gas = row?.gas_used === null || row === undefined ? undefined : BigInt(row.gas_used);
      if (gas === undefined || gas !== b.gas) {
        problems.push(`batch ${b.batchId}: flush() reports gas ${b.gas}, stored ${gas}`);
      }
      return gas ?? b.gas ?? 0n;
    };
    const chargeEvents = await publicClient.getContractEvents({
      address: chain.market,
      abi: marketAbi,
      eventName: "ChargeSettled",
      fromBlock: chain.deployBlock,
      toBlock: "latest",
    });

    // ---------------------------------------------------------------- report
    const gas = batches.map(gasOf);
    const entries = batches.reduce((n, b) => n + b.charges, 0);
    if (chargeEvents.length !== entries) {
      problems.push(`${chargeEvents.length} ChargeSettled events, ${entries} entries in batches`);
    }
    const totalGas = gas.reduce((a, b) => a + b, 0n);
    const maxGas = gas.reduce((a, b) => (b > a ? b : a), 0n);
    const perBatch = batches.length > 0 ? Number(totalGas) / batches.length : NaN;
    const wallS = flushMs / 1000;
    const lines = [
      "",
      `Settlement benchmark — ${new Date().toISOString()}`,
      `node ${process.version}, ${availableParallelism()} CPUs; database: ${databaseLabel}`,
      `anvil automine, confirmations 0, maxBatchGas ${fmt(settings.maxBatchGas)}; ` +
        `${fmt(settings.permits)} permits x ${offerCount} offers (${fmt(pairs)} pairs charged)`,
      `setup ${fmt(setupMs / 1000, 1)} s (database ${fmt(databaseMs / 1000, 1)} s; ` +
        `chain: ${chain.setupTransactions} transactions in ` +
        `${fmt(chainSetupMs / 1000, 1)} s; rows: ${statements} INSERTs in ${fmt(insertMs / 1000, 2)} s)`,
      "",
      `charges (requests)          ${fmt(settings.charges)}`,
      `aggregated entries          ${fmt(entries)}`,
      `batches                     ${fmt(batches.length)} (in ${flushes} flush() calls)`,
      `wall time                   ${fmt(wallS, 2)} s`,
      `requests/s                  ${fmt(settings.charges / wallS, 0)}`,
      `entries/s                   ${fmt(entries / wallS, 1)}`,
      "",
      "batch  entries  requests       gasUsed  gas/entry",
      ...batches.map(
        (b, i) =>
          `${String(i + 1).padStart(5)}${fmt(b.charges).padStart(9)}${fmt(b.requests).padStart(10)}` +
          `${fmt(gas[i]!).padStart(14)}${fmt(Number(gas[i]!) / b.charges).padStart(11)}`,
      ),
      "",
      `gas per batch               mean ${fmt(perBatch)}, max ${fmt(maxGas)}`,
      `gas per charge entry        ${fmt(Number(totalGas) / entries)}`,
      `gas per request             ${fmt(Number(totalGas) / settings.charges, 1)}`,
      `gas in all                  ${fmt(totalGas)}`,
      "",
      "where the flush time went (calls, ms in all; store.storeBatch includes chain.sign)",
      ...[...stats.entries()]
        .sort((a, b) => b[1].ms - a[1].ms)
        .map(
          ([name, s]) =>
            `  ${name.padEnd(30)}${fmt(s.calls).padStart(6)}${fmt(s.ms, 1).padStart(11)}`,
        ),
      "",
      problems.length === 0
        ? `verified: ${fmt(settings.charges)} rows settled; ${settings.permits} permits' chain ` +
          `settled = their rows' sums (ledgers too); ${offerCount} payout balances = their offers' ` +
          `sums; ${events.length} BatchSettled events = ${settledBatches.length} settled batches, ` +
          "no batch id twice"
        : `VERIFICATION FAILED:\n${problems.map((p) => `  - ${p}`).join("\n")}`,
    ];
    process.stdout.write(`${lines.join("\n")}\n`);
    return problems.length === 0 ? 0 : 1;
  } catch (error) {
    log(`failed: ${(error as Error).stack ?? String(error)}`);
    return 2;
  } finally {
    clearTimeout(watchdog);
    // After an abort this is abort()'s cleanup, which then exits with the abort's status.
    if (aborted === undefined) log("stopping anvil and dropping the database");
    await cleanup();
  }
}

process.exitCode = await main();

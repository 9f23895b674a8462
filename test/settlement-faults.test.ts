import { parseEther, type Hex } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { SettlementChain, SettlementFlusherDeps } from "../src/domain/settlement/index.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { closePermit, openPermit } from "./helpers/market.js";
import {
  chainPermit,
  chatOn,
  settlementChain,
  settlementKey,
  settlementRows,
  testFlusher,
} from "./helpers/settlement.js";
import { eventually, startChatStack, type TestStack } from "./helpers/stack.js";
/**
 * The sender under faults injected at each of its steps. The gateway here has no settlement key,
 * so nothing settles but the flushers each test makes: a flusher over the real database and the
 * real anvil, whose chain adapter a test wraps to fail (or lie) at one step, as a crash or a
 * misbehaving node would. After each fault, a flusher on the unwrapped chain must settle every
 * charge exactly once; the chain's own `settled` proves it.
 */
describe("settlement sender under faults", () => {
  let stack: TestStack;
  let fake: FakeUpstream;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack({ PERMIT_CACHE_MS: "0" }));
  });
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  const realChain = (): SettlementChain => settlementChain(stack);
  const flusher = (chain: SettlementChain, overrides: Partial<SettlementFlusherDeps> = {}) =>
    testFlusher(stack, chain, overrides);

  const rpc = (method: string, params: unknown[] = []) =>
    stack.clients.publicClient.request({ method: method as never, params: params as never });

  /** A fresh permit with `n` charged chats on it. */
  async function charged(n: number): Promise<{ permitId: Hex; ids: string[]; total: bigint }> {
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    const ids: string[] = [];
    let total = 0n;
    for (let i = 0; i < n; i++) {
      const chat = await chatOn(stack, permitId);
      ids.push(chat.id);
      total += chat.charged;
    }
    return { permitId, ids, total };
  }

  const attempts = async (batchId: string) =>
    (
      await stack.database.db.pool.query<{
        tx_hash: string;
        nonce: string;
        max_fee_per_gas: string;
        max_priority_fee_per_gas: string;
      }>(
        `SELECT tx_hash, nonce, max_fee_per_gas, max_priority_fee_per_gas FROM settlement_attempts
         WHERE batch_id = $1 ORDER BY nonce, max_fee_per_gas`,
        [batchId],
      )
    ).rows;

  const batchOf = async (requestId: string) =>
    (
      await stack.database.db.pool.query<{ batch_id: string; status: string; tx_hash: string }>(
        `SELECT b.batch_id, b.status, b.tx_hash FROM settlement_batches b
         JOIN inference_requests r ON r.batch_id = b.batch_id WHERE r.id = $1`,
        [requestId],
      )
    ).rows[0];

  /** Every charge settled once: records settled, the chain's settled equal to their sum. */
  async function expectSettledOnce(permitId: Hex, ids: string[], total: bigint) {
    const rows = await settlementRows(stack, ids);
    expect(rows.map((r) => r.settlement_status)).toEqual(ids.map(() => "settled"));
    expect((await chainPermit(stack, permitId)).settled).toBe(total);
    const ledger = await stack.database.db.pool.query<{ settled: string; charged: string }>(
      "SELECT settled, charged FROM permit_ledgers WHERE permit_id = $1",
      [permitId],
    );
    expect(BigInt(ledger.rows[0]!.settled)).toBe(total);
  }

  it("a crash after the attempt is stored, before it is broadcast: the next flush sends the stored transaction", async () => {
    const { permitId, ids, total } = await charged(3);
    const real = realChain();
    let sent = 0;
    const crashing: SettlementChain = {
      ...real,
      broadcast: async () => {
        throw new Error("injected crash before broadcast");
      },
    };
    await expect(flusher(crashing).flush()).rejects.toThrow(/injected crash/);
    const stored = await batchOf(ids[0]!);
    expect(stored?.status).toBe("pending");
    expect(
      (await settlementRows(stack, ids)).every((r) => r.settlement_status === "settling"),
    ).toBe(true);
    expect((await chainPermit(stack, permitId)).settled).toBe(0n);

    const counting: SettlementChain = {
      ...real,
      broadcast: async (raw) => {
        sent++;
        return real.broadcast(raw);
      },
    };
    // A charge made after the crash: recovery (what a gateway runs at start, maxRequests 0)
    // finishes the batch in flight and makes no new one.
    const later = await chatOn(stack, permitId);
    const result = await flusher(counting).flush({ maxRequests: 0 });
    expect(result.batches).toHaveLength(1);
    expect(result.batches[0]).toMatchObject({ batchId: stored!.batch_id, status: "settled" });
    expect(sent).toBe(1);
    expect((await settlementRows(stack, [later.id]))[0]?.settlement_status).toBe("unsettled");
    // The transaction that settled is the one stored before the crash.
    expect((await attempts(stored!.batch_id)).map((a) => a.tx_hash)).toEqual([
      result.batches[0]!.txHash,
    ]);
    await expectSettledOnce(permitId, ids, total);
  });

  it("a crash after broadcast, before the receipt is recorded: the next flush finds it settled and sends nothing", async () => {
    const { permitId, ids, total } = await charged(2);
    const real = realChain();
    const crashing: SettlementChain = {
      ...real,
      broadcast: async (raw) => {
        await real.broadcast(raw);
        throw new Error("injected crash after broadcast");
      },
    };
    await expect(flusher(crashing).flush()).rejects.toThrow(/injected crash/);
    // It is mined (automine; under load the block can land just after the broadcast returns),
    // but the gateway has not recorded it.
    await eventually(async () => (await chainPermit(stack, permitId)).settled === total, 5000, 50);
    expect((await batchOf(ids[0]!))?.status).toBe("pending");

    let sent = 0;
    const result = await flusher({
      ...real,
      broadcast: async (raw) => {
        sent++;
        return real.broadcast(raw);
      },
    }).flush();
    expect(sent).toBe(0);
    expect(result.batches[0]?.status).toBe("settled");
    await expectSettledOnce(permitId, ids, total);
  });

  it("a dropped transaction is replaced with the same nonce and fees raised at least 15%", async () => {
    const { permitId, ids, total } = await charged(2);
    const real = realChain();
    // The node accepts the first attempt and loses it (a dropped transaction).
    const dropping: SettlementChain = { ...real, broadcast: async () => "sent" };
    const first = await flusher(dropping, { waitMs: 300 }).flush();
    expect(first.batches[0]?.status).toBe("submitted");
    expect((await chainPermit(stack, permitId)).settled).toBe(0n);
    for (let i = 0; i < 3; i++) await rpc("evm_mine");

    const second = await flusher(real).flush();
    expect(second.batches[0]).toMatchObject({
      batchId: first.batches[0]!.batchId,
      status: "settled",
    });
    const tried = await attempts(first.batches[0]!.batchId);
    expect(tried).toHaveLength(2);
    expect(tried[1]!.nonce).toBe(tried[0]!.nonce);
    expect(BigInt(tried[1]!.max_fee_per_gas) * 100n).toBeGreaterThanOrEqual(
      BigInt(tried[0]!.max_fee_per_gas) * 115n,
    );
    expect(BigInt(tried[1]!.max_priority_fee_per_gas) * 100n).toBeGreaterThanOrEqual(
      BigInt(tried[0]!.max_priority_fee_per_gas) * 115n,
    );
    expect(second.batches[0]!.txHash).toBe(tried[1]!.tx_hash);
    await expectSettledOnce(permitId, ids, total);
  });

  it("a transaction still pending is replaced by a fee bump; whichever lands, the batch settles once", async () => {
    const { permitId, ids, total } = await charged(2);
    const real = realChain();
    await rpc("evm_setAutomine", [false]);
    try {
      const first = await flusher(real, { waitMs: 300 }).flush();
      expect(first.batches[0]?.status).toBe("submitted");
      const batchId = first.batches[0]!.batchId;
      // Blocks pass without it (a congested chain): the head runs ahead of the attempt.
      const congested: SettlementChain = { ...real, head: async () => (await real.head()) + 5n };
      const mining = (async () => {
        await new Promise((r) => setTimeout(r, 400));
        await rpc("evm_mine");
      })();
      const second = await flusher(congested, { replaceAfterBlocks: 3 }).flush();
      await mining;
      expect(second.batches[0]).toMatchObject({ batchId, status: "settled" });
      const tried = await attempts(batchId);
      expect(tried.length).toBeGreaterThanOrEqual(2);
      expect(new Set(tried.map((a) => a.nonce)).size).toBe(1);
      expect(tried.map((a) => a.tx_hash)).toContain(second.batches[0]!.txHash);
    } finally {
      await rpc("evm_setAutomine", [true]);
    }
    await expectSettledOnce(permitId, ids, total);
  });

  it("replacements raise the fees up to SETTLEMENT_MAX_FEE_PER_GAS / SETTLEMENT_MAX_PRIORITY_FEE_PER_GAS and never past them; at the cap the attempt in flight is kept", async () => {
    const { permitId, ids, total } = await charged(2);
    const real = realChain();
    await rpc("evm_setAutomine", [false]);
    try {
      // No block is mined until the end, so the market's fees stay what they are now.
      const market = await real.fees();
      const cap = {
        maxFeePerGas: (market.maxFeePerGas * 135n) / 100n,
        maxPriorityFeePerGas: (market.maxPriorityFeePerGas * 135n) / 100n,
      };
      // A congested chain: after the first look (when the batch is made, so its log is searched
      // from a real block), three blocks pass between two looks, so every attempt the node
      // holds is old enough to replace at the next look.
      let looks = 0n;
      const congested: SettlementChain = {
        ...real,
        head: async () => (await real.head()) + 3n * looks++,
      };
      const mining = (async () => {
        await new Promise((r) => setTimeout(r, 800));
        await rpc("evm_mine");
      })();
      const result = await flusher(congested, { replaceAfterBlocks: 3, feeCap: cap }).flush();
      await mining;
      const batchId = result.batches[0]!.batchId;
      expect(result.batches[0]).toMatchObject({ status: "settled" });
      const ceil20 = (x: bigint) => (x * 120n + 99n) / 100n;
      // The market's, then raised 20%, then held to the cap (12.5% more: a node takes it), then
      // nothing more although the chain stayed congested for many more looks.
      expect(await attempts(batchId)).toEqual([
        expect.objectContaining({
          max_fee_per_gas: market.maxFeePerGas.toString(),
          max_priority_fee_per_gas: market.maxPriorityFeePerGas.toString(),
        }),
        expect.objectContaining({
          max_fee_per_gas: ceil20(market.maxFeePerGas).toString(),
          max_priority_fee_per_gas: ceil20(market.maxPriorityFeePerGas).toString(),
        }),
        expect.objectContaining({
          max_fee_per_gas: cap.maxFeePerGas.toString(),
          max_priority_fee_per_gas: cap.maxPriorityFeePerGas.toString(),
        }),
      ]);
      const tried = await attempts(batchId);
      expect(new Set(tried.map((a) => a.nonce)).size).toBe(1);
      expect(result.batches[0]!.txHash).toBe(tried[2]!.tx_hash);
      expect(stack.logs.text).toContain(
        "its fees are at SETTLEMENT_MAX_FEE_PER_GAS / SETTLEMENT_MAX_PRIORITY_FEE_PER_GAS; keeping it",
      );
    } finally {
      await rpc("evm_setAutomine", [true]);
    }
    await expectSettledOnce(permitId, ids, total);
  });

  it("a first attempt offers the market's fees held to the cap", async () => {
    const { permitId, ids, total } = await charged(1);
    const real = realChain();
    const market = await real.fees();
    // A tip cap below the market's; the fee cap above it (so the transaction still lands).
    const cap = {
      maxFeePerGas: market.maxFeePerGas * 2n,
      maxPriorityFeePerGas: market.maxPriorityFeePerGas / 2n,
    };
    const result = await flusher(real, { feeCap: cap }).flush();
    expect(result.batches[0]).toMatchObject({ status: "settled" });
    expect(await attempts(result.batches[0]!.batchId)).toEqual([
      expect.objectContaining({
        max_fee_per_gas: market.maxFeePerGas.toString(),
        max_priority_fee_per_gas: cap.maxPriorityFeePerGas.toString(),
      }),
    ]);
    await expectSettledOnce(permitId, ids, total);
  });

  it("an attempt whose nonce another transaction took is re-sent under a new nonce with the same batch id", async () => {
    const { permitId, ids, total } = await charged(2);
    const real = realChain();
    const wallet = stack.clients.wallet(settlementKey);
    let stolen = false;
    const racing: SettlementChain = {
      ...real,
      broadcast: async (raw) => {
        if (!stolen) {
          stolen = true;
          // Another sender on the same account takes the nonce first.
          const hash = await wallet.sendTransaction({
            to: stack.roles.settlement.address,
            value: parseEther("0.001"),
          });
          await stack.clients.publicClient.waitForTransactionReceipt({ hash });
        }
        return real.broadcast(raw);
      },
    };
    const result = await flusher(racing).flush();
    expect(result.batches[0]?.status).toBe("settled");
    const tried = await attempts(result.batches[0]!.batchId);
    expect(tried).toHaveLength(2);
    expect(Number(tried[1]!.nonce)).toBeGreaterThan(Number(tried[0]!.nonce));
    expect(result.batches[0]!.txHash).toBe(tried[1]!.tx_hash);
    await expectSettledOnce(permitId, ids, total);
  });

  it("one attempt reverted and another succeeded, seen through a node that lags on the batch's state: the batch settles, is never failed, and its charges settle once", async () => {
    const { permitId, ids, total } = await charged(2);
    const real = realChain();
    let signed = 0;
    let firstHash: Hex | undefined;
    // The node the flusher asks first does not have the first attempt's receipt yet.
    let hideFirst = true;
    // Reads of the batch's state answered by a node still behind the chain.
    let lagging = 0;
    const lagged: SettlementChain = {
      ...real,
      // The first attempt runs out of gas, so it is mined and reverts; later ones are signed as
      // the flusher asks.
      sign: async (tx) => {
        const first = signed++ === 0;
        const result = await real.sign(first ? { ...tx, gas: 40_000n } : tx);
        if (first) firstHash = result.txHash;
        return result;
      },
      receipt: async (hash) => (hideFirst && hash === firstHash ? undefined : real.receipt(hash)),
      broadcast: async (raw) => {
        const outcome = await real.broadcast(raw);
        if (signed === 2) {
          // The second attempt (under the next nonce: the first's looked taken by a stranger)
          // is out: the receipts now show both, the batch's state lags two reads behind.
          hideFirst = false;
          lagging = 2;
        }
        return outcome;
      },
      batchSettled: async (batchId, fromBlock) => {
        if (lagging > 0) {
          lagging -= 1;
          return undefined;
        }
        return real.batchSettled(batchId, fromBlock);
      },
    };
    const result = await flusher(lagged).flush();
    expect(result.batches).toHaveLength(1);
    const batchId = result.batches[0]!.batchId;
    const tried = await attempts(batchId);
    expect(tried).toHaveLength(2);
    expect(Number(tried[1]!.nonce)).toBe(Number(tried[0]!.nonce) + 1);
    expect(tried[0]!.tx_hash).toBe(firstHash);
    expect((await real.receipt(tried[0]!.tx_hash as Hex))?.status).toBe("reverted");
    expect((await real.receipt(tried[1]!.tx_hash as Hex))?.status).toBe("success");
    expect(result.batches[0]).toMatchObject({ status: "settled", txHash: tried[1]!.tx_hash });
    expect(await batchOf(ids[0]!)).toEqual({
      batch_id: batchId,
      status: "settled",
      tx_hash: tried[1]!.tx_hash,
    });
    expect(lagging).toBe(0);
    expect(stack.logs.text).toContain(
      "a settlement attempt succeeded but the chain does not show the batch settled yet; waiting",
    );
    await expectSettledOnce(permitId, ids, total);
    // Nothing left to batch again: a later flush pays nothing twice.
    await flusher(real).flush();
    await expectSettledOnce(permitId, ids, total);
  });

  it("a receipt that says reverted while the batch settled (a node on a stale fork): the chain is asked again before the batch is failed, and its charges settle once", async () => {
    const { permitId, ids, total } = await charged(2);
    const real = realChain();
    let broadcast = false;
    let lagging = 0;
    const stale: SettlementChain = {
      ...real,
      broadcast: async (raw) => {
        const outcome = await real.broadcast(raw);
        broadcast = true;
        lagging = 1;
        return outcome;
      },
      // The node answering receipts saw the transaction revert; the one answering the first
      // read of the batch's state after it is behind.
      receipt: async (hash) => {
        const receipt = await real.receipt(hash);
        return broadcast && receipt !== undefined ? { ...receipt, status: "reverted" } : receipt;
      },
      // It hides the batch's settlement once, whenever the first read that would show it
      // comes (a read before the transaction is mined shows nothing anyway: on a loaded
      // machine the first look may come before the block).
      batchSettled: async (batchId, fromBlock) => {
        const settled = await real.batchSettled(batchId, fromBlock);
        if (settled !== undefined && lagging > 0) {
          lagging -= 1;
          return undefined;
        }
        return settled;
      },
    };
    const result = await flusher(stale).flush();
    expect(result.batches).toHaveLength(1);
    const batchId = result.batches[0]!.batchId;
    const tried = await attempts(batchId);
    expect(tried).toHaveLength(1);
    expect(lagging).toBe(0);
    expect(result.batches[0]).toMatchObject({ status: "settled", txHash: tried[0]!.tx_hash });
    expect(await batchOf(ids[0]!)).toEqual({
      batch_id: batchId,
      status: "settled",
      tx_hash: tried[0]!.tx_hash,
    });
    expect(stack.logs.text).toContain(
      "a settlement attempt's receipt says reverted but the chain says the batch settled; not failing it",
    );
    await expectSettledOnce(permitId, ids, total);
    await flusher(real).flush();
    await expectSettledOnce(permitId, ids, total);
  });

  it("a batch that reverts on chain returns its charges; the next flush settles the good ones and marks the closed permit's unsettleable", async () => {
    const good = await charged(2);
    const doomed = await charged(1);
    await closePermit(stack, doomed.permitId);
    const real = realChain();
    // A node whose simulation saw the permit still open: the batch is sent and reverts.
    const blind: SettlementChain = {
      ...real,
      simulate: async () => ({ ok: true, gas: 1_000_000n }),
    };
    const first = await flusher(blind).flush();
    expect(first.batches[0]?.status).toBe("failed");
    expect(first.batches[0]?.error).toMatch(/reverted/);
    expect(
      (await settlementRows(stack, [...good.ids, ...doomed.ids])).map((r) => r.settlement_status),
    ).toEqual([...good.ids, ...doomed.ids].map(() => "unsettled"));
    expect((await chainPermit(stack, good.permitId)).settled).toBe(0n);

    const second = await flusher(real).flush();
    expect(second.unsettleable).toEqual([
      expect.objectContaining({
        permitId: doomed.permitId,
        requests: 1,
        credits: doomed.total,
        reason: "permit_closed",
      }),
    ]);
    await expectSettledOnce(good.permitId, good.ids, good.total);
    const [row] = await settlementRows(stack, doomed.ids);
    expect(row).toMatchObject({
      settlement_status: "unsettleable",
      settlement_reason: "permit_closed",
    });
    const ledger = await stack.database.db.pool.query<{ unsettleable: string; settled: string }>(
      "SELECT unsettleable, settled FROM permit_ledgers WHERE permit_id = $1",
      [doomed.permitId],
    );
    expect(ledger.rows[0]).toEqual({ unsettleable: doomed.total.toString(), settled: "0" });
  });
});

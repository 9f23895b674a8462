import { execFile, spawn } from "node:child_process";
import { promisify } from "node:util";
import * as grpc from "@grpc/grpc-js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SettlementService } from "../gen/gateway/v1/settlement_pb.js";
import { grpcClient, grpcUnary } from "./helpers/grpc.js";
import { auditChildLogs } from "./helpers/log-audit.js";
import { gatewayCli } from "./helpers/processes.js";
import { closePermit, openPermit, requestClose } from "./helpers/market.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import {
  chainPermit,
  chatOn,
  flush,
  settlementChain,
  settlementRows,
  settlingEnv,
  testFlusher,
  tokenBalance,
} from "./helpers/settlement.js";
import { authed, eventually, json, startChatStack, type TestStack } from "./helpers/stack.js";

describe("settlement", () => {
  let stack: TestStack;
  let fake: FakeUpstream;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack(settlingEnv, { chunks: 3 }));
  });
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  it("settles every charge of N chats once: the chain's settled, the payout and every record agree", async () => {
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    const chats = [];
    for (let i = 0; i < 6; i++) chats.push(await chatOn(stack, permitId, { stream: i % 2 === 1 }));
    const total = chats.reduce((sum, c) => sum + c.charged, 0n);
    expect(total).toBeGreaterThan(0n);
    const payout = stack.roles.operator.address;
    const before = await tokenBalance(stack, 0, payout);

    const { status, body } = await flush(stack);
    expect(status).toBe(200);
    expect(body.busy).toBe(false);
    expect(body.settled_requests).toBeGreaterThanOrEqual(chats.length);
    const batch = body.batches.find((b: { status: string }) => b.status === "settled");
    expect(batch.tx_hash).toMatch(/^0x[0-9a-f]{64}$/);

    expect((await chainPermit(stack, permitId)).settled).toBe(total);
    expect((await tokenBalance(stack, 0, payout)) - before).toBe(BigInt(body.settled_credits));
    for (const chat of chats) {
      const record = await json(await authed(stack, `/v1/requests/${chat.id}`));
      expect(record.settlement).toMatchObject({
        status: "settled",
        batch_id: batch.batch_id,
        tx_hash: batch.tx_hash,
      });
      expect(record.settlement.settled_at).toEqual(expect.any(Number));
    }

    const again = await flush(stack);
    expect(again.body).toMatchObject({ batches: [], settled_requests: 0, settled_credits: "0" });
    expect((await chainPermit(stack, permitId)).settled).toBe(total);
    const rows = await settlementRows(
      stack,
      chats.map((c) => c.id),
    );
    expect(rows.every((r) => r.settlement_status === "settled")).toBe(true);
  });

  it("dryRun reports what would settle and changes nothing; maxRequests bounds a flush", async () => {
    await flush(stack); // drain what earlier tests left
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    const chats = [];
    for (let i = 0; i < 3; i++) chats.push(await chatOn(stack, permitId));
    const batchesBefore = await stack.database.db.pool.query("SELECT 1 FROM settlement_batches");

    const dry = await flush(stack, { dryRun: true });
    expect(dry.status).toBe(200);
    expect(dry.body).toMatchObject({ settled_requests: 0, settled_credits: "0" });
    expect(dry.body.batches).toEqual([
      expect.objectContaining({ status: "dry_run", requests: 3, charges: 1, tx_hash: null }),
    ]);
    expect(BigInt(dry.body.batches[0].gas)).toBeGreaterThan(0n);
    expect((await chainPermit(stack, permitId)).settled).toBe(0n);
    expect(
      (
        await settlementRows(
          stack,
          chats.map((c) => c.id),
        )
      ).map((r) => r.settlement_status),
    ).toEqual(["unsettled", "unsettled", "unsettled"]);
    expect((await stack.database.db.pool.query("SELECT 1 FROM settlement_batches")).rowCount).toBe(
      batchesBefore.rowCount,
    );

    const two = await flush(stack, { maxRequests: 2 });
    expect(two.body.settled_requests).toBe(2);
    const rest = await flush(stack, { max_requests: 10 });
    expect(rest.body.settled_requests).toBe(1);
    expect((await chainPermit(stack, permitId)).settled).toBe(
      chats.reduce((sum, c) => sum + c.charged, 0n),
    );

    for (const bad of [{ maxRequests: 0 }, { maxRequests: "2" }, { dryRun: "yes" }]) {
      const res = await flush(stack, bad);
      expect(res.status).toBe(400);
      expect(res.body.error).toMatchObject({
        code: "invalid_request",
        type: "invalid_request_error",
      });
    }
  });

  it("settles the rest of a batch holding a closed permit's charges and reports those as unsettleable", async () => {
    const good = await openPermit(stack, { deposit: 10n ** 18n });
    const doomed = await openPermit(stack, { deposit: 10n ** 18n });
    const goodChats = [await chatOn(stack, good), await chatOn(stack, good)];
    const doomedChat = await chatOn(stack, doomed);
    // Closed behind the gateway's back: its indexer (and so its close watcher) is paused.
    await stack.gateway.indexer.stop();
    try {
      await closePermit(stack, doomed);
      const { status, body } = await flush(stack);
      expect(status).toBe(200);
      expect(body.unsettleable).toContainEqual({
        permit_id: doomed,
        offer_id: doomedChat.offerId,
        requests: 1,
        credits: doomedChat.charged.toString(),
        reason: "permit_closed",
      });
      expect(body.batches.every((b: { status: string }) => b.status === "settled")).toBe(true);
    } finally {
      stack.gateway.indexer.start();
    }
    expect((await chainPermit(stack, good)).settled).toBe(
      goodChats[0]!.charged + goodChats[1]!.charged,
    );
    const record = await json(await authed(stack, `/v1/requests/${doomedChat.id}`));
    expect(record.settlement).toMatchObject({
      status: "unsettleable",
      reason: "permit_closed",
      tx_hash: null,
    });
    // Reported once: the next flush has nothing left of it.
    expect((await flush(stack)).body.unsettleable).toEqual([]);
  });

  it("settles a closing permit's charges before closableAt without a manual flush", async () => {
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    const chats = [await chatOn(stack, permitId), await chatOn(stack, permitId, { stream: true })];
    const total = chats[0]!.charged + chats[1]!.charged;
    await requestClose(stack, permitId);
    const { closableAt } = await chainPermit(stack, permitId);
    await eventually(
      async () =>
        (
          await settlementRows(
            stack,
            chats.map((c) => c.id),
          )
        ).every((r) => r.settlement_status === "settled"),
      15_000,
      100,
    );
    expect((await chainPermit(stack, permitId)).settled).toBe(total);
    const block = await stack.clients.publicClient.getBlock();
    expect(block.timestamp).toBeLessThan(closableAt);
  });

  it("refuses a missing or wrong operator token, and an API key in its place: 401 on REST, unauthenticated on gRPC", async () => {
    const url = `${stack.gateway.url}/settlements/flush`;
    const cases: Record<string, string>[] = [
      {},
      { authorization: "Bearer wrong-token-wrong-token" },
      { authorization: `Bearer ${stack.apiKey}` },
    ];
    for (const headers of cases) {
      const res = await fetch(url, { method: "POST", headers });
      expect(res.status).toBe(401);
      expect((await json(res)).error).toMatchObject({
        code: "invalid_operator_token",
        type: "authentication_error",
      });
    }
    const client = grpcClient(stack.gateway.url);
    try {
      for (const headers of cases) {
        const calls = [
          grpcUnary(client, SettlementService.method.flush, {}, headers),
          grpcUnary(client, SettlementService.method.reconcile, {}, headers),
        ];
        for (const call of calls) {
          const error = await call.then(
            () => undefined,
            (e: grpc.ServiceError) => e,
          );
          expect(error?.code).toBe(grpc.status.UNAUTHENTICATED);
        }
      }
    } finally {
      client.close();
    }
  });

  it("answers Flush and Reconcile to a @grpc/grpc-js client with the operator token", async () => {
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    const chat = await chatOn(stack, permitId);
    const client = grpcClient(stack.gateway.url);
    const auth = { authorization: `Bearer ${stack.operatorToken}` };
    try {
      const flushed = await grpcUnary(client, SettlementService.method.flush, {}, auth);
      expect(flushed.busy).toBe(false);
      expect(flushed.settledRequests).toBeGreaterThanOrEqual(1n);
      expect((await chainPermit(stack, permitId)).settled).toBe(chat.charged);
      const report = await grpcUnary(client, SettlementService.method.reconcile, {}, auth);
      expect(report.drift).toBe(false);
      expect(report.account).toBe(stack.roles.settlement.address.toLowerCase());
      expect(report.permits.find((p) => p.permitId === permitId)).toMatchObject({
        gatewaySettled: chat.charged.toString(),
        chainSettled: chat.charged.toString(),
        ledgerSettled: chat.charged.toString(),
        drift: false,
      });
    } finally {
      client.close();
    }
  });

  it("GET /v1/permits/{id}: settled rises and charged_unsettled falls after a flush", async () => {
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    const chat = await chatOn(stack, permitId);
    // Once this process's reservation lease on the permit is given back (idle for about 1 s).
    let before: Record<string, unknown> = {};
    await eventually(async () => {
      before = await json(await authed(stack, `/v1/permits/${permitId}`));
      return before.reserved === "0";
    });
    expect(before).toMatchObject({ settled: "0", charged_unsettled: chat.charged.toString() });
    await flush(stack);
    const after = await json(await authed(stack, `/v1/permits/${permitId}`));
    expect(after).toMatchObject({
      settled: chat.charged.toString(),
      charged_unsettled: "0",
      reserved: "0",
      available: before.available,
    });
  });

  it("an operator's Flush while the gateway's own flush runs (right after a start) waits for it, never 500", async () => {
    // Both flushes of one process hold the account's lease as the process: before they took
    // turns, the first to end released it under the other (LeaseLostError, 500).
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    const chat = await chatOn(stack, permitId);
    await stack.restart();
    const flushed = await flush(stack);
    expect(flushed.status).toBe(200);
    await eventually(
      async () => (await settlementRows(stack, [chat.id]))[0]?.settlement_status === "settled",
      15_000,
      100,
    );
    expect((await chainPermit(stack, permitId)).settled).toBe(chat.charged);
  });

  it("a gateway that starts drives a batch left in flight by a stopped process to its end", async () => {
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    const chat = await chatOn(stack, permitId);
    const real = settlementChain(stack);
    // A process that stored its batch and died before broadcasting it.
    const dying = testFlusher(stack, {
      ...real,
      broadcast: async () => {
        throw new Error("process killed");
      },
    });
    await expect(dying.flush()).rejects.toThrow(/process killed/);
    expect((await settlementRows(stack, [chat.id]))[0]?.settlement_status).toBe("settling");

    await stack.restart();
    await eventually(
      async () => (await settlementRows(stack, [chat.id]))[0]?.settlement_status === "settled",
      15_000,
      100,
    );
    expect((await chainPermit(stack, permitId)).settled).toBe(chat.charged);
  });

  const cli = gatewayCli;
  const cliEnv = () => ({
    PATH: process.env.PATH ?? "",
    GATEWAY_URL: stack.gateway.url,
    SETTLEMENT_OPERATOR_TOKEN: stack.operatorToken,
    LOG_LEVEL: "info",
  });
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  const reconcileCli = async (): Promise<{ code: number; report: any }> => {
    try {
      const { stdout } = await promisify(execFile)(
        process.execPath,
        [...cli, "settle", "reconcile"],
        {
          env: cliEnv(),
        },
      );
      return { code: 0, report: JSON.parse(stdout) };
    } catch (error) {
      const e = error as { code: number; stdout: string };
      return { code: e.code, report: JSON.parse(e.stdout) };
    }
  };

  it("the `gateway settle` worker process settles a chat made after it started, and stops on SIGTERM", async () => {
    await flush(stack);
    const worker = spawn(process.execPath, [...cli, "settle"], {
      env: { ...cliEnv(), SETTLE_INTERVAL_MS: "300" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    auditChildLogs(worker, "gateway settle");
    let output = "";
    worker.stdout!.on("data", (chunk: Buffer) => (output += chunk.toString()));
    try {
      await eventually(async () => output.includes("settlement worker started"), 20_000, 100);
      const permitId = await openPermit(stack, { deposit: 10n ** 18n });
      const chat = await chatOn(stack, permitId);
      await eventually(
        async () => (await settlementRows(stack, [chat.id]))[0]?.settlement_status === "settled",
        20_000,
        100,
      );
      expect((await chainPermit(stack, permitId)).settled).toBe(chat.charged);
      // The worker logs the batch once Flush has answered it.
      await eventually(async () => output.includes("settlement batch"), 10_000, 50);
      expect(output).not.toContain(stack.operatorToken);
    } finally {
      const exited = new Promise<number | null>((resolve) => worker.once("exit", resolve));
      worker.kill("SIGTERM");
      expect(await exited).toBe(0);
    }
  });

  it("`gateway settle reconcile` reports no drift after the runs above, and drift (exit 1) once a settled charge is altered", async () => {
    const clean = await reconcileCli();
    expect(clean.code).toBe(0);
    expect(clean.report.drift).toBe(false);
    expect(clean.report.permits.length).toBeGreaterThan(0);

    const { rows } = await stack.database.db.pool.query<{ id: string; permit_id: string }>(
      "SELECT id, permit_id FROM inference_requests WHERE settlement_status = 'settled' LIMIT 1",
    );
    const altered = rows[0]!;
    await stack.database.db.pool.query(
      "UPDATE inference_requests SET credits_charged = credits_charged + 1 WHERE id = $1",
      [altered.id],
    );
    try {
      const drifted = await reconcileCli();
      expect(drifted.code).toBe(1);
      expect(drifted.report.drift).toBe(true);
      const permit = drifted.report.permits.find(
        (p: { permitId: string }) => p.permitId === altered.permit_id,
      );
      expect(permit.drift).toBe(true);
      expect(BigInt(permit.gatewaySettled)).toBe(BigInt(permit.chainSettled) + 1n);
    } finally {
      await stack.database.db.pool.query(
        "UPDATE inference_requests SET credits_charged = credits_charged - 1 WHERE id = $1",
        [altered.id],
      );
    }
  });
});

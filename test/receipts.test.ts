import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { verifyTypedData } from "ethers";
import { getAddress } from "viem";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { GatewayService } from "../gen/gateway/v1/gateway_pb.js";
import { InferenceService } from "../gen/gateway/v1/inference_pb.js";
import { createApiKey } from "../src/adapters/pg/api-keys.js";
import { authorizeKey } from "./helpers/authorize.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { grpcClient, grpcUnary } from "./helpers/grpc.js";
import { auditSecret } from "./helpers/log-audit.js";
import { openPermit } from "./helpers/market.js";
import { gatewayCli, serveProcess, stopProcess, type GatewayProcess } from "./helpers/processes.js";
import { chatOn, flush, settlingEnv } from "./helpers/settlement.js";
import { authed, json, startChatStack, startTestStack, type TestStack } from "./helpers/stack.js";

const run = promisify(execFile);

/** The gateway's receipt key in this suite (a secret: it must never show in a log or answer). */
const receiptKey = generatePrivateKey();
const receiptSigner = privateKeyToAccount(receiptKey).address;

type Receipt = {
  types: Record<string, { name: string; type: string }[]>;
  primaryType: string;
  domain: { name: string; version: string; chainId: number; verifyingContract: string };
  message: Record<string, unknown>;
};

/** A record's claim or count (null: none) as the receipt's `UsageFigures` signs it. */
function receiptFigures(figures: Record<string, string> | null) {
  if (figures === null)
    return {
      present: false,
      inputTokens: "0",
      outputTokens: "0",
      cachedTokens: "0",
      reasoningTokens: "0",
    };
  return {
    present: true,
    inputTokens: figures.input_tokens,
    outputTokens: figures.output_tokens,
    cachedTokens: figures.cached_input_tokens,
    reasoningTokens: figures.reasoning_tokens,
  };
}

/** ethers' verification, as a payer's tooling would do it (it derives EIP712Domain itself). */
function recover(receipt: Receipt, signature: string): string {
  const { EIP712Domain: _domain, ...types } = receipt.types;
  return verifyTypedData(receipt.domain, types, receipt.message, signature);
}

/** Every answer body this suite read, to be searched for the receipt key. */
const answers: string[] = [];
async function text(res: Response): Promise<string> {
  const body = await res.text();
  answers.push(body);
  return body;
}

describe("signed usage receipts", () => {
  let stack: TestStack;
  let fake: FakeUpstream;

  beforeAll(async () => {
    auditSecret("private key", receiptKey);
    ({ stack, fake } = await startChatStack(
      { ...settlingEnv, RECEIPT_PRIVATE_KEY: receiptKey },
      { chunks: 3 },
    ));
  }, 120_000);
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  const fetchReceipt = async (id: string, key = stack.apiKey) => {
    const res = await fetch(`${stack.gateway.url}/v1/requests/${id}/receipt`, {
      headers: { authorization: `Bearer ${key}` },
    });
    return { status: res.status, body: JSON.parse(await text(res)) };
  };

  it("GET /v1/gateway needs no key and publishes the receipt signer (also over RPC, keyless)", async () => {
    const expected = {
      object: "gateway",
      chain_id: stack.anvil.chainId,
      market: stack.demo.market,
      settlement_account: stack.roles.settlement.address,
      receipt_signer: receiptSigner,
      deployment: expect.stringMatching(/^dep_[0-9a-f]{32}$/),
      audit_corpus: null,
    };
    const open = await fetch(`${stack.gateway.url}/v1/gateway`);
    expect(open.status).toBe(200);
    expect(JSON.parse(await text(open))).toEqual(expected);
    // A wrong key is not checked: the answer is public and the same.
    const wrong = await fetch(`${stack.gateway.url}/v1/gateway`, {
      headers: { authorization: "Bearer sk-not-a-key" },
    });
    expect(JSON.parse(await text(wrong))).toEqual(expected);

    const client = grpcClient(stack.gateway.url);
    try {
      const { gateway } = await grpcUnary(client, GatewayService.method.getGateway, {});
      expect(gateway).toMatchObject({
        chainId: BigInt(stack.anvil.chainId),
        market: stack.demo.market,
        receiptSigner,
      });
    } finally {
      client.close();
    }
  });

  it("a receipt verifies with ethers to the published signer, carries the record, and is the same every time", async () => {
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    const chat = await chatOn(stack, permitId, { stream: true });
    const record = await json(await authed(stack, `/v1/requests/${chat.id}`));
    const { status, body } = await fetchReceipt(chat.id);
    expect(status).toBe(200);
    expect(Object.keys(body).sort()).toEqual(["receipt", "signature", "signer"]);
    expect(body.signer).toBe(receiptSigner);
    expect(body.receipt.primaryType).toBe("UsageReceipt");
    expect(body.receipt.domain).toEqual({
      name: "Model Market Gateway",
      version: "4",
      chainId: stack.anvil.chainId,
      verifyingContract: stack.demo.market,
    });
    expect(body.receipt.message).toEqual({
      requestId: chat.id,
      permitId,
      offerId: record.offer_id,
      modelId: record.model_id,
      tariffVersion: record.tariff_version,
      inputTokens: record.input_tokens,
      outputTokens: record.output_tokens,
      cachedTokens: record.cached_input_tokens,
      reasoningTokens: record.reasoning_tokens,
      charge: chat.charged.toString(),
      billing: record.billing,
      closedAt: record.completed_at,
      usageSource: record.usage_source,
      claimed: receiptFigures(record.usage_claimed),
      counted: receiptFigures(record.usage_counted),
    });
    expect(recover(body.receipt, body.signature)).toBe(receiptSigner);

    // Deterministic (RFC 6979): asked again, over REST and gRPC, the same signature.
    expect((await fetchReceipt(chat.id)).body).toEqual(body);
    const client = grpcClient(stack.gateway.url);
    try {
      const rpc = await grpcUnary(
        client,
        InferenceService.method.getRequestReceipt,
        { id: chat.id },
        { authorization: `Bearer ${stack.apiKey}` },
      );
      expect(rpc.signature).toBe(body.signature);
      expect(rpc.receipt?.message?.charge).toBe(chat.charged.toString());
    } finally {
      client.close();
    }
  });

  it("a receipt with any field changed, or under another domain, does not verify", async () => {
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    const chat = await chatOn(stack, permitId);
    const { body } = await fetchReceipt(chat.id);
    const receipt = body.receipt as Receipt;
    expect(recover(receipt, body.signature)).toBe(receiptSigner);
    const m = receipt.message as Record<string, Record<string, unknown>>;
    const other: Record<string, unknown> = {
      requestId: `0x${"ab".repeat(32)}`,
      permitId: `0x${"cd".repeat(32)}`,
      offerId: `0x${"ef".repeat(32)}`,
      modelId: `0x${"12".repeat(32)}`,
      tariffVersion: "99",
      inputTokens: "100000",
      outputTokens: "100000",
      cachedTokens: "7",
      reasoningTokens: "7",
      charge: (chat.charged + 1n).toString(),
      billing: "partial",
      closedAt: Number(receipt.message.closedAt) + 1,
      usageSource: receipt.message.usageSource === "provider" ? "gateway" : "provider",
      claimed: { ...m.claimed, present: !m.claimed!.present },
      counted: { ...m.counted, outputTokens: "123456" },
    };
    expect(Object.keys(other).sort()).toEqual(Object.keys(receipt.message).sort());
    for (const [field, value] of Object.entries(other)) {
      expect(value, field).not.toEqual(receipt.message[field]);
      const tampered = { ...receipt, message: { ...receipt.message, [field]: value } };
      expect(recover(tampered, body.signature), field).not.toBe(receiptSigner);
    }
    for (const domain of [
      { ...receipt.domain, chainId: receipt.domain.chainId + 1 },
      { ...receipt.domain, verifyingContract: `0x${"11".repeat(20)}` },
      { ...receipt.domain, version: "3" },
    ]) {
      expect(recover({ ...receipt, domain }, body.signature)).not.toBe(receiptSigner);
    }
  });

  it("another key cannot read someone's receipt: 404 request_not_found, as the record", async () => {
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    const chat = await chatOn(stack, permitId);
    // Even a key the same payer authorized: a receipt is its request's, as the record is.
    const other = await createApiKey(stack.database.db.pool, "other app");
    auditSecret("api key", other.key);
    await authorizeKey(stack.gateway.url, other.key, stack.roles.payer.privateKey);
    const record = await fetch(`${stack.gateway.url}/v1/requests/${chat.id}`, {
      headers: { authorization: `Bearer ${other.key}` },
    });
    expect(record.status).toBe(404);
    const recordBody = JSON.parse(await text(record));
    const receipt = await fetchReceipt(chat.id, other.key);
    expect(receipt.status).toBe(404);
    expect(receipt.body).toEqual(recordBody);
    expect(receipt.body.error.code).toBe("request_not_found");
    // A request that does not exist answers the same.
    const absent = await fetchReceipt(`0x${"5a".repeat(32)}`, other.key);
    expect(absent.body.error).toEqual({
      ...receipt.body.error,
      message: receipt.body.error.message.replace(chat.id, `0x${"5a".repeat(32)}`),
    });
  });

  it("an open request has no receipt yet (409 request_not_closed); a void one none ever (404 receipt_not_found)", async () => {
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    fake.setOptions({ stallAfterChunks: 1 });
    const abort = new AbortController();
    try {
      const res = await authed(stack, "/v1/chat/completions", {
        method: "POST",
        headers: { "content-type": "application/json", "x-gateway-permit": permitId },
        body: JSON.stringify({
          model: "demo-chat",
          messages: [{ role: "user", content: "x" }],
          stream: true,
        }),
        signal: abort.signal,
      });
      const id = res.headers.get("x-gateway-request-id")!;
      const open = await fetchReceipt(id);
      expect(open.status).toBe(409);
      expect(open.body.error.code).toBe("request_not_closed");
    } finally {
      abort.abort();
      fake.setOptions({ stallAfterChunks: undefined });
    }

    fake.setOptions({ failStatus: 500 });
    try {
      const res = await authed(stack, "/v1/chat/completions", {
        method: "POST",
        headers: { "content-type": "application/json", "x-gateway-permit": permitId },
        body: JSON.stringify({ model: "demo-chat", messages: [{ role: "user", content: "y" }] }),
      });
      expect(res.status).toBe(502);
      await res.text();
    } finally {
      fake.setOptions({ failStatus: undefined });
    }
    const { rows } = await stack.database.db.pool.query<{ id: string }>(
      "SELECT id FROM inference_requests WHERE permit_id = $1 AND billing = 'void'",
      [permitId],
    );
    expect(rows).toHaveLength(1);
    const voided = await fetchReceipt(rows[0]!.id);
    expect(voided.status).toBe(404);
    expect(voided.body.error.code).toBe("receipt_not_found");
  });

  it("a permit's receipts are listed to keys its payer authorized, with their settlement batch, in pages; not to others", async () => {
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    const chats: { id: string; charged: bigint }[] = [];
    for (let i = 0; i < 3; i++) chats.push(await chatOn(stack, permitId));
    // Another app the payer authorized for this permit only: its charges are the permit's too.
    const app = await createApiKey(stack.database.db.pool, "second app");
    auditSecret("api key", app.key);
    await authorizeKey(stack.gateway.url, app.key, stack.roles.payer.privateKey, { permitId });
    const res = await fetch(`${stack.gateway.url}/v1/chat/completions`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${app.key}`,
        "content-type": "application/json",
        "x-gateway-permit": permitId,
      },
      body: JSON.stringify({ model: "demo-chat", messages: [{ role: "user", content: "z" }] }),
    });
    expect(res.status).toBe(200);
    const appChat = res.headers.get("x-gateway-request-id")!;
    await res.text();

    const settled = await flush(stack);
    expect(settled.status).toBe(200);

    const list = async (query: string, key = stack.apiKey) => {
      const r = await fetch(`${stack.gateway.url}/v1/permits/${permitId}/receipts${query}`, {
        headers: { authorization: `Bearer ${key}` },
      });
      return { status: r.status, body: JSON.parse(await text(r)) };
    };
    const all = await list("");
    expect(all.status).toBe(200);
    expect(all.body.has_more).toBe(false);
    const listed = all.body.data.map((r: { receipt: Receipt }) => r.receipt.message);
    expect(listed.map((m: Receipt["message"]) => m.requestId).sort()).toEqual(
      [...chats.map((c) => c.id), appChat].sort(),
    );
    // In the order they closed (ties by request id): what pages are cut by.
    const order = [...listed].sort(
      (a: Receipt["message"], b: Receipt["message"]) =>
        Number(a.closedAt) - Number(b.closedAt) ||
        String(a.requestId).localeCompare(String(b.requestId)),
    );
    expect(listed).toEqual(order);
    // One (permit, offer) entry: every charge in one batch, settled, as the ledger records it.
    // (A flush may also settle other permits' charges left by earlier tests, in batches of their
    // own, listed before this one: the receipts name theirs.)
    const batchId = all.body.data[0].settlement.batch_id as string;
    const { rows: recorded } = await stack.database.db.pool.query<{
      status: string;
      tx_hash: string;
    }>("SELECT status, tx_hash FROM settlement_batches WHERE batch_id = $1", [batchId]);
    const batch = recorded[0]!;
    expect(batch.status).toBe("settled");
    for (const item of all.body.data) {
      expect(item.object).toBe("usage_receipt");
      expect(recover(item.receipt, item.signature)).toBe(receiptSigner);
      expect(item.settlement).toMatchObject({
        status: "settled",
        batch_id: batchId,
        tx_hash: batch.tx_hash,
      });
    }
    // The receipt a key reads alone is the one listed.
    const single = await fetchReceipt(chats[0]!.id);
    expect(
      all.body.data.find((r: { receipt: Receipt }) => r.receipt.message.requestId === chats[0]!.id)
        .signature,
    ).toBe(single.body.signature);

    // Pages: two, then the rest.
    const first = await list("?limit=2");
    expect(first.body.has_more).toBe(true);
    expect(first.body.data).toEqual(all.body.data.slice(0, 2));
    const second = await list(
      `?limit=2&starting_after=${first.body.data[1].receipt.message.requestId}`,
    );
    expect(second.body).toEqual({ object: "list", data: all.body.data.slice(2), has_more: false });

    // A key the payer never authorized, and one authorized for another permit only: 403.
    const outsider = await createApiKey(stack.database.db.pool, "outsider");
    auditSecret("api key", outsider.key);
    const elsewhere = await createApiKey(stack.database.db.pool, "elsewhere");
    auditSecret("api key", elsewhere.key);
    const otherPermit = await openPermit(stack, { deposit: 10n ** 18n });
    await authorizeKey(stack.gateway.url, elsewhere.key, stack.roles.payer.privateKey, {
      permitId: otherPermit,
    });
    for (const key of [outsider.key, elsewhere.key]) {
      const refused = await list("", key);
      expect(refused.status).toBe(403);
      expect(refused.body.error.code).toBe("permit_not_authorized");
      expect(JSON.stringify(refused.body)).not.toContain(chats[0]!.id);
    }
    expect((await list("?limit=0")).body.error.code).toBe("invalid_request");
    expect((await list("?limit=101")).body.error.code).toBe("invalid_request");
  });

  it("gateway permit audit: passes after settlement, fails naming the difference once a charge is altered in the database", async () => {
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    const chats: { id: string; charged: bigint }[] = [];
    for (let i = 0; i < 3; i++) chats.push(await chatOn(stack, permitId, { stream: i === 1 }));
    expect((await flush(stack)).status).toBe(200);
    const total = chats.reduce((sum, c) => sum + c.charged, 0n);
    const env = {
      PATH: process.env.PATH ?? "",
      GATEWAY_URL: stack.gateway.url,
      GATEWAY_API_KEY: stack.apiKey,
      RPC_URL: stack.anvil.rpcUrl,
      MARKET_ADDRESS: stack.demo.market,
    };
    const audit = async (args: string[]) => {
      try {
        const ran = await run(process.execPath, [...gatewayCli, "permit", "audit", ...args], {
          env,
        });
        return { code: 0, ...ran };
      } catch (error) {
        const e = error as { code: number; stdout: string; stderr: string };
        return { code: e.code, stdout: e.stdout, stderr: e.stderr };
      }
    };

    const passed = await audit([permitId]);
    expect(passed.stderr).toBe("");
    expect(passed.code).toBe(0);
    expect(passed.stdout).toContain(`settled receipts ${total} = settled on chain ${total}`);
    const report = await audit([permitId, "--json"]);
    expect(report.code).toBe(0);
    // Compared by id (the gateway lists them by close, and by id within one second).
    const byId = (a: { request_id: string }, b: { request_id: string }) =>
      a.request_id < b.request_id ? -1 : 1;
    const parsed = JSON.parse(report.stdout) as { requests: { request_id: string }[] };
    expect({ ...parsed, requests: [...parsed.requests].sort(byId) }).toEqual({
      permit_id: permitId,
      chain_id: stack.anvil.chainId,
      market: getAddress(stack.demo.market),
      receipt_signer: receiptSigner,
      receipts: 3,
      settled_receipts: 3,
      settled_charges: total.toString(),
      chain_settled: total.toString(),
      difference: "0",
      invalid: [],
      requests: await Promise.all(
        chats.map(async (chat) => {
          const r = await json(await authed(stack, `/v1/requests/${chat.id}`));
          const figures = (f: Record<string, string> | null) =>
            f === null
              ? null
              : {
                  input_tokens: f.input_tokens,
                  output_tokens: f.output_tokens,
                  cached_tokens: f.cached_input_tokens,
                  reasoning_tokens: f.reasoning_tokens,
                };
          return {
            request_id: chat.id,
            settled: true,
            charge: chat.charged.toString(),
            charged: figures(r),
            usage_source: r.usage_source,
            claimed: figures(r.usage_claimed),
            counted: figures(r.usage_counted),
            receipt_version: "4",
          };
        }),
      ).then((all) => all.sort(byId)),
      ok: true,
    });
    // The text report shows each receipt's charge and both numbers.
    for (const chat of chats)
      expect(passed.stdout).toContain(`receipt ${chat.id}: charged ${chat.charged} for `);

    // The gateway's database now claims one credit less for one request than it settled.
    await stack.database.db.pool.query(
      "UPDATE inference_requests SET credits_charged = credits_charged - 1 WHERE id = $1",
      [chats[1]!.id],
    );
    const failed = await audit([permitId]);
    expect(failed.code).toBe(1);
    expect(failed.stderr).toContain(
      `permit ${permitId}: audit FAILED: settled receipts sum to ${total - 1n}, the chain settled ${total}: difference 1 (the chain settled 1 more than the receipts)`,
    );
    const failedJson = await audit([permitId, "--json"]);
    expect(failedJson.code).toBe(1);
    expect(JSON.parse(failedJson.stdout)).toMatchObject({ difference: "1", ok: false });

    // A key the payer did not authorize cannot audit: the gateway refuses the list.
    const outsider = await createApiKey(stack.database.db.pool, "auditor");
    auditSecret("api key", outsider.key);
    env.GATEWAY_API_KEY = outsider.key;
    const refused = await audit([permitId]);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toContain("permit_not_authorized");
  });

  // `gateway serve` processes share the stack's database only on a real PostgreSQL.
  it.skipIf(!process.env.TEST_DATABASE_URL)(
    "gateway serve: without RECEIPT_PRIVATE_KEY no receipts; with it, another process signs the same receipt",
    async () => {
      const permitId = await openPermit(stack, { deposit: 10n ** 18n });
      const chat = await chatOn(stack, permitId);
      let served: GatewayProcess | undefined;
      try {
        served = await serveProcess(stack);
        const facts = await fetch(`${served.url}/v1/gateway`);
        expect(JSON.parse(await text(facts))).toMatchObject({ receipt_signer: null });
        const res = await fetch(`${served.url}/v1/requests/${chat.id}/receipt`, {
          headers: { authorization: `Bearer ${stack.apiKey}` },
        });
        expect(res.status).toBe(503);
        expect(JSON.parse(await text(res)).error.code).toBe("receipts_unavailable");
      } finally {
        await stopProcess(served);
      }
      // The key, not the process, makes the signature.
      let keyed: GatewayProcess | undefined;
      try {
        keyed = await serveProcess(stack, { RECEIPT_PRIVATE_KEY: receiptKey });
        const here = await fetchReceipt(chat.id);
        const there = await fetch(`${keyed.url}/v1/requests/${chat.id}/receipt`, {
          headers: { authorization: `Bearer ${stack.apiKey}` },
        });
        expect(JSON.parse(await text(there))).toEqual(here.body);
      } finally {
        await stopProcess(keyed);
      }
    },
    60_000,
  );

  it("the receipt key never appears in an answer (the log audit covers the logs)", () => {
    // The answers read include receipts (they name the signer), and none carries the key.
    expect(answers.some((body) => body.includes(receiptSigner))).toBe(true);
    const forms = [receiptKey, receiptKey.slice(2), receiptKey.slice(2).toUpperCase()];
    for (const body of answers) for (const form of forms) expect(body).not.toContain(form);
  });
});

describe("a gateway without a receipt key", () => {
  let stack: TestStack;
  beforeAll(async () => {
    stack = await startTestStack();
  }, 120_000);
  afterAll(async () => {
    await stack?.close();
  });

  it("publishes receipt_signer null (and no settlement account), and answers the receipt routes 503 receipts_unavailable", async () => {
    const facts = await fetch(`${stack.gateway.url}/v1/gateway`);
    expect(await json(facts)).toEqual({
      object: "gateway",
      chain_id: stack.anvil.chainId,
      market: stack.demo.market,
      settlement_account: null,
      receipt_signer: null,
      deployment: expect.stringMatching(/^dep_[0-9a-f]{32}$/),
      audit_corpus: null,
    });
    for (const path of [
      `/v1/requests/0x${"77".repeat(32)}/receipt`,
      `/v1/permits/${stack.demo.permitId}/receipts`,
    ]) {
      const res = await authed(stack, path);
      expect(res.status).toBe(503);
      expect((await json(res)).error).toEqual({
        code: "receipts_unavailable",
        type: "service_unavailable",
        message:
          "this gateway has no receipt key configured (RECEIPT_PRIVATE_KEY): it signs no receipts",
      });
    }
    // The key is still checked first: no key, no answer about receipts.
    const anonymous = await fetch(`${stack.gateway.url}/v1/requests/0x${"77".repeat(32)}/receipt`);
    expect(anonymous.status).toBe(401);
  });
});

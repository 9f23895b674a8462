import { execFile } from "node:child_process";
import { deploymentId } from "../src/adapters/pg/permit-authorizations.js";
import { promisify } from "node:util";
import type { Hex } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { marketAbi } from "../gen/contracts/artifacts.js";
import { ProviderService } from "../gen/gateway/v1/provider_pb.js";
import { BatchStatus, SettlementService } from "../gen/gateway/v1/settlement_pb.js";
import { createApiKey } from "../src/adapters/pg/api-keys.js";
import { bindKey, type EarningsJson } from "../src/clients/provider.js";
import { signable } from "./helpers/authorize.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { grpcClient, grpcUnary } from "./helpers/grpc.js";
import { auditLog, auditSecret } from "./helpers/log-audit.js";
import { closePermit, openPermit } from "./helpers/market.js";
import { gatewayCli } from "./helpers/processes.js";
import { chatOn, flush, settlingEnv, tokenBalance } from "./helpers/settlement.js";
import { authed, json, startChatStack, type TestStack } from "./helpers/stack.js";
import { formatAmount } from "../src/domain/token-units.js";

const run = promisify(execFile);

/**
 * Provider earnings (issue 22): who may read an offer's earnings (its operator's bound keys and
 * the settlement operator, nobody else), and that what they read is what the chain paid.
 */
describe("provider earnings", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let chatOffer: Hex;
  /** Another offer of the same operator. */
  let otherOffer: Hex;

  beforeAll(async () => {
    ({ stack, fake, chatOffer } = await startChatStack(settlingEnv, { chunks: 3 }));
    otherOffer = stack.demo.offers.find((o) => o.offerId !== chatOffer)!.offerId;
  });
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  const newKey = async (name: string): Promise<string> => {
    const { key } = await createApiKey(stack.database.db.pool, name);
    auditSecret("api key", key);
    return key;
  };
  const operator = () => privateKeyToAccount(stack.roles.operator.privateKey);
  const chain = () => ({ chainId: stack.config.chainId, market: stack.demo.market });
  const as = (key: string | undefined): Record<string, string> =>
    key === undefined ? {} : { authorization: `Bearer ${key}` };
  const earnings = (offerId: Hex, key: string | undefined, query = "") =>
    fetch(`${stack.gateway.url}/v1/provider-offers/${offerId}/earnings${query}`, {
      headers: as(key),
    });
  const post = (key: string, path: string, body: unknown) =>
    fetch(`${stack.gateway.url}${path}`, {
      method: "POST",
      headers: { ...as(key), "content-type": "application/json" },
      body: JSON.stringify(body),
    });
  /** The BindOfferKey typed data the gateway makes for `key` on `offerId`. */
  const challenge = async (key: string, offerId: Hex) => {
    const res = await post(key, `/v1/provider-offers/${offerId}/key-bindings/challenge`, {});
    expect(res.status).toBe(200);
    return (await json(res)) as Parameters<typeof signable>[0] & {
      message: { offerId: Hex; operator: Hex; keyId: string; expiresAt: number; nonce: string };
    };
  };

  it("refuses the earnings to anyone the offer's operator did not bind: no key 401, an unbound key 403, a key bound to another offer 403", async () => {
    const key = await newKey("competitor");
    const noKey = await earnings(chatOffer, undefined);
    expect(noKey.status).toBe(401);
    expect((await json(noKey)).error.code).toBe("missing_api_key");
    const wrong = await earnings(chatOffer, "gw_not-a-key");
    expect(wrong.status).toBe(401);
    expect((await json(wrong)).error.code).toBe("invalid_api_key");

    const unbound = await earnings(chatOffer, key);
    expect(unbound.status).toBe(403);
    expect((await json(unbound)).error).toMatchObject({
      code: "not_offer_operator",
      type: "permission_error",
    });

    // Bound by the operator to its other offer: that one is readable, this one still is not.
    const binding = await bindKey(
      { baseUrl: stack.gateway.url, apiKey: key },
      { offerId: otherOffer, signer: operator(), chain: chain() },
    );
    expect(binding).toMatchObject({
      object: "offer_key_binding",
      offer_id: otherOffer,
      operator: stack.roles.operator.address.toLowerCase(),
      status: "active",
    });
    expect((await earnings(otherOffer, key)).status).toBe(200);
    const elsewhere = await earnings(chatOffer, key);
    expect(elsewhere.status).toBe(403);
    expect((await json(elsewhere)).error.code).toBe("not_offer_operator");

    // Over gRPC the same: PERMISSION_DENIED with the reason.
    const client = grpcClient(stack.gateway.url);
    try {
      const error = await grpcUnary(
        client,
        ProviderService.method.getOfferEarnings,
        { offerId: chatOffer },
        as(key),
      ).then(
        () => undefined,
        (e: Error & { code: number }) => e,
      );
      expect(error?.code).toBe(7); // PERMISSION_DENIED
    } finally {
      client.close();
    }
  });

  it("binds a key only on the operator's signature, for the key it names, once per nonce; the key can revoke it", async () => {
    const key = await newKey("provider dashboard");
    const other = await newKey("someone else");

    // Signed by someone other than the operator (the payer): refused, and nothing is bound.
    const typed = await challenge(key, chatOffer);
    expect(typed).toMatchObject({
      primaryType: "BindOfferKey",
      domain: { name: "Model Market Gateway", version: "3", verifyingContract: stack.demo.market },
      message: { offerId: chatOffer, operator: stack.roles.operator.address },
    });
    const forged = await privateKeyToAccount(stack.roles.payer.privateKey).signTypedData(
      signable(typed),
    );
    const bindBody = (signature: Hex) => ({
      expiresAt: typed.message.expiresAt,
      nonce: typed.message.nonce,
      signature,
    });
    const refused = await post(
      key,
      `/v1/provider-offers/${chatOffer}/key-bindings`,
      bindBody(forged),
    );
    expect(refused.status).toBe(401);
    expect((await json(refused)).error.code).toBe("invalid_signature");
    expect((await earnings(chatOffer, key)).status).toBe(403);

    // The operator's signature for `key`, submitted by another key: it does not verify for that one.
    const signature = await operator().signTypedData(signable(typed));
    const stolen = await post(
      other,
      `/v1/provider-offers/${chatOffer}/key-bindings`,
      bindBody(signature),
    );
    expect(stolen.status).toBe(401);
    expect((await json(stolen)).error.code).toBe("invalid_signature");
    expect((await earnings(chatOffer, other)).status).toBe(403);
    // ...nor for another offer of the same operator.
    const moved = await post(
      key,
      `/v1/provider-offers/${otherOffer}/key-bindings`,
      bindBody(signature),
    );
    expect(moved.status).toBe(401);

    const bound = await post(
      key,
      `/v1/provider-offers/${chatOffer}/key-bindings`,
      bindBody(signature),
    );
    expect(bound.status).toBe(200);
    const { binding } = await json(bound);
    expect(binding).toMatchObject({ status: "active", expires_at: typed.message.expiresAt });
    expect((await earnings(chatOffer, key)).status).toBe(200);

    // The same signed payload again: the nonce is spent.
    const replayed = await post(
      key,
      `/v1/provider-offers/${chatOffer}/key-bindings`,
      bindBody(signature),
    );
    expect(replayed.status).toBe(409);
    expect((await json(replayed)).error.code).toBe("nonce_used");

    // Another key cannot revoke it; the key that holds it can, at once.
    const del = (k: string, offerId: Hex) =>
      fetch(`${stack.gateway.url}/v1/provider-offers/${offerId}/key-bindings/${binding.id}`, {
        method: "DELETE",
        headers: as(k),
      });
    const notYours = await del(other, chatOffer);
    expect(notYours.status).toBe(404);
    expect((await json(notYours)).error.code).toBe("binding_not_found");
    expect((await earnings(chatOffer, key)).status).toBe(200);
    const revoked = await del(key, chatOffer);
    expect(revoked.status).toBe(200);
    expect((await json(revoked)).binding).toMatchObject({ id: binding.id, status: "revoked" });
    const after = await earnings(chatOffer, key);
    expect(after.status).toBe(403);
    expect((await json(after)).error.code).toBe("not_offer_operator");
  });

  it("lists a key's active bindings to that key only: not another key's, not once revoked", async () => {
    const key = await newKey("provider console");
    const competitor = await newKey("competitor console");
    const list = async (k: string | undefined) => {
      const res = await fetch(`${stack.gateway.url}/v1/provider-offers/key-bindings`, {
        headers: as(k),
      });
      return { status: res.status, body: await json(res) };
    };
    expect(await list(key)).toEqual({ status: 200, body: { object: "list", data: [] } });
    const { status, body } = await list(undefined);
    expect(status).toBe(401);
    expect(body.error.code).toBe("missing_api_key");

    const first = await bindKey(
      { baseUrl: stack.gateway.url, apiKey: key },
      { offerId: chatOffer, signer: operator(), chain: chain() },
    );
    const second = await bindKey(
      { baseUrl: stack.gateway.url, apiKey: key },
      { offerId: otherOffer, signer: operator(), chain: chain() },
    );
    const mine = await list(key);
    expect(mine.status).toBe(200);
    // Newest first, each as the binding answer showed it.
    expect(mine.body.data).toEqual([second, first]);
    expect(mine.body.data.map((b: { offer_id: string }) => b.offer_id)).toEqual([
      otherOffer,
      chatOffer,
    ]);
    // Another key sees none of them: a competitor does not learn which offers a key reads.
    expect((await list(competitor)).body).toEqual({ object: "list", data: [] });

    const revoked = await fetch(
      `${stack.gateway.url}/v1/provider-offers/${otherOffer}/key-bindings/${second.id}`,
      { method: "DELETE", headers: as(key) },
    );
    expect(revoked.status).toBe(200);
    expect((await list(key)).body.data).toEqual([first]);

    // Over gRPC, the same.
    const client = grpcClient(stack.gateway.url);
    try {
      const answer = await grpcUnary(client, ProviderService.method.listKeyBindings, {}, as(key));
      expect(answer.bindings.map((b) => [b.id, b.offerId])).toEqual([[first.id, chatOffer]]);
    } finally {
      client.close();
    }
  });

  it("settled credits are what the payout received on chain; unsettleable charges are listed with their reason; the operator token and the batch list see the same batch", async () => {
    const key = await newKey("earnings reader");
    await bindKey(
      { baseUrl: stack.gateway.url, apiKey: key },
      { offerId: chatOffer, signer: operator(), chain: chain() },
    );
    await flush(stack); // nothing of earlier tests left unsettled
    const before = (await json(await earnings(chatOffer, key))) as EarningsJson;
    expect(before.unsettled).toMatchObject({ requests: 0, credits: "0" });

    const good = await openPermit(stack, { deposit: 10n ** 18n });
    const doomed = await openPermit(stack, { deposit: 10n ** 18n });
    const goodChats = [
      await chatOn(stack, good),
      await chatOn(stack, good, { stream: true }),
      await chatOn(stack, good),
    ];
    const doomedChat = await chatOn(stack, doomed);
    const records = await Promise.all(
      [...goodChats, doomedChat].map(async (c) =>
        json(await authed(stack, `/v1/requests/${c.id}`)),
      ),
    );
    const sum = (f: (r: { input_tokens: string; output_tokens: string }) => string, n: number) =>
      records.slice(0, n).reduce((s, r) => s + BigInt(f(r)), 0n);
    const goodCredits = goodChats.reduce((s, c) => s + c.charged, 0n);
    const charged = (await json(await earnings(chatOffer, key))) as EarningsJson;
    expect(charged.unsettled).toEqual({
      requests: 4,
      input_tokens: sum((r) => r.input_tokens, 4).toString(),
      output_tokens: sum((r) => r.output_tokens, 4).toString(),
      credits: (goodCredits + doomedChat.charged).toString(),
    });
    expect(charged.payout).toBe(stack.roles.operator.address.toLowerCase());

    const payout = charged.payout as Hex;
    const balanceBefore = await tokenBalance(stack, 0, payout);
    // The doomed permit is closed behind the gateway's back (its indexer paused), so the flush
    // finds its charge can never settle.
    await stack.gateway.indexer.stop();
    let flushed;
    try {
      await closePermit(stack, doomed);
      flushed = await flush(stack);
    } finally {
      stack.gateway.indexer.start();
    }
    expect(flushed.status).toBe(200);
    const batch = flushed.body.batches.find((b: { status: string }) => b.status === "settled");
    expect(batch.tx_hash).toMatch(/^0x[0-9a-f]{64}$/);
    const received = (await tokenBalance(stack, 0, payout)) - balanceBefore;

    const res = await earnings(chatOffer, key);
    expect(res.status).toBe(200);
    const e = (await json(res)) as EarningsJson;
    expect(BigInt(e.settled.credits) - BigInt(before.settled.credits)).toBe(received);
    expect(received).toBe(goodCredits);
    expect(e.settled.requests - before.settled.requests).toBe(3);
    expect(e.unsettled).toEqual({
      requests: 0,
      input_tokens: "0",
      output_tokens: "0",
      credits: "0",
    });
    expect(e.settling.requests).toBe(0);
    expect(e.unsettleable).toMatchObject({
      requests: 1,
      credits: doomedChat.charged.toString(),
      input_tokens: records[3].input_tokens,
      output_tokens: records[3].output_tokens,
    });
    expect(e.unsettleable_reasons).toEqual([
      { reason: "permit_closed", requests: 1, credits: doomedChat.charged.toString() },
    ]);
    // Earnings over time: the same charges by UTC day of completion, oldest first. They add up
    // to the states' totals, the settled ones to what settled; this test's four charges fell on
    // the days their records completed.
    const states = [e.unsettled, e.settling, e.settled, e.unsettleable];
    expect(e.days.map((d) => d.starts_at % 86400)).toEqual(e.days.map(() => 0));
    expect(e.days.map((d) => d.starts_at)).toEqual(e.days.map((d) => d.starts_at).sort());
    expect(e.days.reduce((s, d) => s + d.requests, 0)).toBe(
      states.reduce((s, t) => s + t.requests, 0),
    );
    expect(e.days.reduce((s, d) => s + BigInt(d.credits), 0n)).toBe(
      states.reduce((s, t) => s + BigInt(t.credits), 0n),
    );
    expect(e.days.reduce((s, d) => s + BigInt(d.settled_credits), 0n)).toBe(
      BigInt(e.settled.credits),
    );
    const grew = new Map<number, { requests: number; credits: bigint; settled: bigint }>();
    for (const d of e.days) {
      const was = before.days.find((b) => b.starts_at === d.starts_at);
      const delta = {
        requests: d.requests - (was?.requests ?? 0),
        credits: BigInt(d.credits) - BigInt(was?.credits ?? "0"),
        settled: BigInt(d.settled_credits) - BigInt(was?.settled_credits ?? "0"),
      };
      if (delta.requests !== 0) grew.set(d.starts_at, delta);
    }
    const expected = new Map<number, { requests: number; credits: bigint; settled: bigint }>();
    records.forEach((r: { completed_at: number; credits_charged: string }, i) => {
      const day = Math.floor(r.completed_at / 86400) * 86400;
      const held = expected.get(day) ?? { requests: 0, credits: 0n, settled: 0n };
      const credits = BigInt(r.credits_charged);
      expected.set(day, {
        requests: held.requests + 1,
        credits: held.credits + credits,
        settled: held.settled + (i < 3 ? credits : 0n),
      });
    });
    expect(grew).toEqual(expected);
    const listed = e.batches.find((b) => b.batch_id === batch.batch_id);
    expect(listed).toMatchObject({
      status: "settled",
      tx_hash: batch.tx_hash,
      requests: 3,
      credits: goodCredits.toString(),
    });
    expect(listed?.settled_at).toEqual(expect.any(Number));

    // The settlement operator reads the same, over REST and gRPC (over the same window: the
    // default one ends with the current second, which may have moved on).
    const asOperator = await earnings(chatOffer, stack.operatorToken, `?from=${e.from}&to=${e.to}`);
    expect(asOperator.status).toBe(200);
    expect(await json(asOperator)).toEqual(e);
    const client = grpcClient(stack.gateway.url);
    try {
      const answer = await grpcUnary(
        client,
        ProviderService.method.getOfferEarnings,
        { offerId: chatOffer },
        as(stack.operatorToken),
      );
      expect(answer.earnings?.settled?.credits).toBe(e.settled.credits);
      const batches = await grpcUnary(
        client,
        SettlementService.method.listBatches,
        { limit: 10, status: BatchStatus.SETTLED },
        as(stack.operatorToken),
      );
      expect(batches.batches.find((b) => b.batchId === batch.batch_id)?.txHash).toBe(batch.tx_hash);
    } finally {
      client.close();
    }

    // The console's batch list: the batch, its transaction and its totals.
    const list = await fetch(`${stack.gateway.url}/settlements/batches?limit=10&status=settled`, {
      headers: as(stack.operatorToken),
    });
    expect(list.status).toBe(200);
    const { data } = await json(list);
    expect(data.find((b: { batch_id: string }) => b.batch_id === batch.batch_id)).toEqual({
      batch_id: batch.batch_id,
      status: "settled",
      requests: batch.requests,
      credits: batch.credits,
      tx_hash: batch.tx_hash,
      created_at: expect.any(Number),
      settled_at: listed!.settled_at,
      error: null,
    });
    for (const headers of [as(key), {}]) {
      const refused = await fetch(`${stack.gateway.url}/settlements/batches`, { headers });
      expect(refused.status).toBe(401);
      expect((await json(refused)).error.code).toBe("invalid_operator_token");
    }
    const bad = await fetch(`${stack.gateway.url}/settlements/batches?limit=0`, {
      headers: as(stack.operatorToken),
    });
    expect(bad.status).toBe(400);
  });

  it("reads a bounded window: before the charges nothing, a reversed or too long window is refused", async () => {
    const key = await newKey("window reader");
    await bindKey(
      { baseUrl: stack.gateway.url, apiKey: key },
      { offerId: chatOffer, signer: operator(), chain: chain() },
    );
    const now = Math.floor(Date.now() / 1000);
    const past = (await json(
      await earnings(chatOffer, key, `?from=${now - 7200}&to=${now - 3600}`),
    )) as EarningsJson;
    expect(past).toMatchObject({ from: now - 7200, to: now - 3600, batches: [] });
    for (const state of ["unsettled", "settling", "settled", "unsettleable"] as const)
      expect(past[state]).toEqual({
        requests: 0,
        input_tokens: "0",
        output_tokens: "0",
        credits: "0",
      });
    for (const query of [
      `?from=${now}&to=${now}`,
      `?from=0&to=${367 * 86400}`,
      "?from=-1",
      "?to=x",
    ]) {
      const res = await earnings(chatOffer, key, query);
      expect(res.status, query).toBe(400);
      expect((await json(res)).error.code).toBe("invalid_request");
    }
    const missing = await earnings(`0x${"ee".repeat(32)}`, stack.operatorToken);
    expect(missing.status).toBe(404);
    expect((await json(missing)).error.code).toBe("offer_not_found");
  });

  it("gateway provider bind-key and earnings: the operator signs in the CLI, the bound key reads", async () => {
    const key = await newKey("cli reader");
    const env = {
      PATH: process.env.PATH ?? "",
      GATEWAY_URL: stack.gateway.url,
      GATEWAY_API_KEY: key,
      OPERATOR_PRIVATE_KEY: stack.roles.operator.privateKey,
      CHAIN_ID: String(stack.config.chainId),
      MARKET_ADDRESS: stack.demo.market,
      // No terminal: the deployment is pinned, or nothing is signed (issue 37).
      GATEWAY_DEPLOYMENT_ID: await deploymentId(stack.database.db.pool),
    };
    const cli = async (...args: string[]) => {
      const out = await run(process.execPath, [...gatewayCli, "provider", ...args], { env }).then(
        (r) => ({ code: 0, ...r }),
        (e: { code: number; stdout: string; stderr: string }) => e,
      );
      auditLog("cli", `${out.stdout}\n${out.stderr}`);
      return out;
    };
    const refused = await cli("earnings", chatOffer);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(/403 not_offer_operator/);

    const bound = await cli("bind-key", chatOffer);
    expect(bound.code).toBe(0);
    expect(bound.stdout).toMatch(/bound API key key_[0-9a-f]+ to offer/);

    const asJson = await cli("earnings", chatOffer, "--json");
    expect(asJson.code).toBe(0);
    const viaRest = await json(
      await earnings(
        chatOffer,
        key,
        `?from=${JSON.parse(asJson.stdout).from}&to=${JSON.parse(asJson.stdout).to}`,
      ),
    );
    expect(JSON.parse(asJson.stdout)).toEqual(viaRest);
    const text = await cli(
      "earnings",
      chatOffer,
      "--from",
      String(viaRest.from),
      "--to",
      String(viaRest.to),
    );
    expect(text.code).toBe(0);
    expect(Number(/^settled\s+(\d+)\s/m.exec(text.stdout)?.[1])).toBe(viaRest.settled.requests);
    expect(text.stdout).toContain(`payout ${viaRest.payout}`);
    expect(text.stdout).toContain(`unsettleable: permit_closed`);
    // Amounts in the model's token units, the exact base units beside them (issue 38, item 3).
    expect(viaRest.model_id).toBe(stack.demo.models[0]!.modelId);
    const settled = BigInt(viaRest.settled.credits);
    expect(text.stdout).toContain(
      `${formatAmount(settled, { decimals: 18, symbol: "DCHAT" })} (${settled} base units)`,
    );
    expect(text.stdout).not.toContain(key);
  });

  it("a binding lapses when the offer's operator changes: the former operator's keys are refused", async () => {
    const key = await newKey("former operator's dashboard");
    await bindKey(
      { baseUrl: stack.gateway.url, apiKey: key },
      { offerId: otherOffer, signer: operator(), chain: chain() },
    );
    expect((await earnings(otherOffer, key)).status).toBe(200);
    const setOperator = async (address: Hex) => {
      const owner = stack.clients.wallet(stack.roles.operator.privateKey); // it created the offer
      const hash = await owner.writeContract({
        address: stack.demo.market,
        abi: marketAbi,
        functionName: "setOfferOperator",
        args: [otherOffer, address],
      });
      await stack.clients.publicClient.waitForTransactionReceipt({ hash });
      await stack.gateway.indexer.syncOnce();
    };
    const successor = privateKeyToAccount(stack.roles.payer.privateKey);
    await setOperator(successor.address);
    try {
      const refused = await earnings(otherOffer, key);
      expect(refused.status).toBe(403);
      expect((await json(refused)).error.code).toBe("not_offer_operator");
      // The former operator can no longer bind a key either; the new one can. (Its own tool
      // refuses a challenge naming another operator before signing; signing for the operator
      // the chain names now, as a contract operator's key would, the gateway refuses.)
      const other = await newKey("successor's dashboard");
      await expect(
        bindKey(
          { baseUrl: stack.gateway.url, apiKey: other },
          { offerId: otherOffer, signer: operator(), chain: chain() },
        ),
      ).rejects.toMatchObject({ reason: "challenge_mismatch", field: "message.operator" });
      await expect(
        bindKey(
          { baseUrl: stack.gateway.url, apiKey: other },
          {
            offerId: otherOffer,
            signer: operator(),
            operator: successor.address,
            chain: chain(),
          },
        ),
      ).rejects.toMatchObject({ status: 401, code: "invalid_signature" });
      await bindKey(
        { baseUrl: stack.gateway.url, apiKey: other },
        { offerId: otherOffer, signer: successor, chain: chain() },
      );
      expect((await earnings(otherOffer, other)).status).toBe(200);
    } finally {
      await setOperator(stack.roles.operator.address);
    }
  });
});

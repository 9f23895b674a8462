import * as grpc from "@grpc/grpc-js";
import {
  parseSignature,
  serializeCompactSignature,
  signatureToCompactSignature,
  type Hex,
} from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { InferenceService } from "../gen/gateway/v1/inference_pb.js";
import { PermitService } from "../gen/gateway/v1/permit_pb.js";
import { deployErc1271Wallet } from "../src/adapters/chain/deploy.js";
import { createApiKey } from "../src/adapters/pg/api-keys.js";
import { permitLedger } from "../src/adapters/pg/ledger/index.js";
import { startGateway, type Gateway } from "../src/app.js";
import { authorizeKey, signable, type AuthorizationView } from "./helpers/authorize.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { grpcClient, grpcServerStream, grpcUnary } from "./helpers/grpc.js";
import { auditSecret } from "./helpers/log-audit.js";
import { openPermit } from "./helpers/market.js";
import { eventually, json, startChatStack, type TestStack } from "./helpers/stack.js";

/**
 * Spending authority (DESIGN.md section 8): an API key spends, or reads the balance of, only the
 * permits whose payer signed for it. Each case is an attack one participant could make on
 * another's money before the authority existed: any key could spend any payer's permit.
 */

/** How long another gateway on the database may keep serving a revoked key (API_KEY_CACHE_MS). */
const cacheMs = 1000;
const messages = [{ role: "user", content: "hi" }];

/** The EIP-2098 form of a 65-byte signature. */
function toCompact(signature: Hex): Hex {
  return serializeCompactSignature(signatureToCompactSignature(parseSignature(signature)));
}

describe("spending authority (PostgreSQL or PGlite, anvil)", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let payerKey: Hex;
  let payerAddress: Hex;
  let stranger: { address: Hex; privateKey: Hex };

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack({ API_KEY_CACHE_MS: String(cacheMs) }));
    payerKey = stack.roles.payer.privateKey;
    payerAddress = stack.roles.payer.address;
    stranger = stack.anvil.accounts[7]!;
  });
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  /** A fresh API key, authorized for nothing. */
  const newKey = async (): Promise<{ id: string; key: string }> => {
    const created = await createApiKey(stack.database.db.pool, "app");
    auditSecret("api key", created.key);
    return { id: created.id, key: created.key };
  };
  const freshPermit = () => openPermit(stack, { deposit: 10n ** 18n });

  const call = (key: string, path: string, init: RequestInit = {}, base = stack.gateway.url) =>
    fetch(`${base}${path}`, {
      ...init,
      headers: {
        authorization: `Bearer ${key}`,
        "content-type": "application/json",
        ...(init.headers as Record<string, string>),
      },
    });
  const chat = (key: string, permitId: Hex, stream = false, base = stack.gateway.url) =>
    call(
      key,
      "/v1/chat/completions",
      {
        method: "POST",
        headers: { "x-gateway-permit": permitId },
        body: JSON.stringify({ model: "demo-chat", messages, stream }),
      },
      base,
    );
  const view = (key: string, permitId: Hex, base = stack.gateway.url) =>
    call(key, `/v1/permits/${permitId}`, {}, base);
  const chatCalls = () => fake.calls("/v1/chat/completions");

  /** Whether the answer is the spec's 403 `permit_not_authorized`. */
  const expectRefused = async (res: Response): Promise<void> => {
    expect(res.status).toBe(403);
    const body = await json(res);
    expect(body.error.code).toBe("permit_not_authorized");
    expect(body.error.type).toBe("permission_error");
  };
  /** Served, and the stream read to its end (so its charge is recorded). */
  const expectServed = async (res: Response): Promise<void> => {
    expect(res.status).toBe(200);
    await res.text();
  };

  /** What the gateway holds or charged on a permit, and the records it made for it. */
  const ledgerOf = async (permitId: Hex) => {
    const ledger = await permitLedger(stack.database.db.pool, permitId);
    const { rows } = await stack.database.db.pool.query<{ n: string }>(
      "SELECT count(*) AS n FROM inference_requests WHERE permit_id = $1",
      [permitId],
    );
    const leases = await stack.database.db.pool.query<{ n: string }>(
      "SELECT count(*) AS n FROM permit_leases WHERE permit_id = $1",
      [permitId],
    );
    return {
      reserved: ledger.reserved,
      charged: ledger.charged,
      requests: Number(rows[0]!.n),
      leases: Number(leases.rows[0]!.n),
    };
  };

  /** The AuthorizeKey typed data for `key`, as the challenge route answers it. */
  const challenge = async (key: string, body: Record<string, unknown>) => {
    const res = await call(key, "/v1/permit-authorizations/challenge", {
      method: "POST",
      body: JSON.stringify(body),
    });
    expect(res.status).toBe(200);
    return json(res);
  };
  const submit = (key: string, typed: { message: Record<string, unknown> }, signature: Hex) =>
    call(key, "/v1/permit-authorizations", {
      method: "POST",
      body: JSON.stringify({
        payer: typed.message.payer,
        permitId: typed.message.permitId,
        expiresAt: typed.message.expiresAt,
        issuedAt: typed.message.issuedAt,
        deployment: typed.message.deployment,
        totalCap: typed.message.totalCap,
        perRequestCap: typed.message.perRequestCap,
        period: typed.message.period,
        periodCap: typed.message.periodCap,
        nonce: typed.message.nonce,
        signature,
      }),
    });

  it("refuses a key its payer did not authorize, on chat (JSON, SSE, gRPC) and the permit view, before anything is reserved or sent upstream", async () => {
    const permitId = await freshPermit();
    const intruder = await newKey();
    const before = chatCalls();

    await expectRefused(await chat(intruder.key, permitId, false));
    await expectRefused(await chat(intruder.key, permitId, true));
    await expectRefused(await view(intruder.key, permitId));

    const client = grpcClient(stack.gateway.url);
    try {
      const metadata = { authorization: `Bearer ${intruder.key}` };
      const streamError = (await grpcServerStream(
        client,
        InferenceService.method.streamChatCompletion,
        {
          body: new TextEncoder().encode(JSON.stringify({ model: "demo-chat", messages })),
          permitId,
        },
        metadata,
      ).catch((e: grpc.ServiceError) => e)) as grpc.ServiceError;
      expect(streamError.code).toBe(grpc.status.PERMISSION_DENIED);
      const streamDetails = streamError.metadata.get("grpc-status-details-bin")[0] as Buffer;
      expect(streamDetails.toString("latin1")).toContain("permit_not_authorized");
      const viewError = (await grpcUnary(
        client,
        InferenceService.method.getPermit,
        { permitId },
        metadata,
      ).catch((e: grpc.ServiceError) => e)) as grpc.ServiceError;
      expect(viewError.code).toBe(grpc.status.PERMISSION_DENIED);
    } finally {
      client.close();
    }

    expect(chatCalls()).toBe(before);
    expect(await ledgerOf(permitId)).toEqual({
      reserved: 0n,
      charged: 0n,
      requests: 0,
      leases: 0,
    });
    // The stack's own key, which the payer authorized, is served on the same permit.
    await expectServed(await chat(stack.apiKey, permitId, false));
    expect(chatCalls()).toBe(before + 1);
  });

  it("serves a key once the payer signed for it; a permit-scoped authorization opens that permit only, a payer-wide one every permit of the payer", async () => {
    const permitId = await freshPermit();
    const other = await freshPermit();
    const app = await newKey();
    await expectRefused(await chat(app.key, permitId));

    const scoped = await authorizeKey(stack.gateway.url, app.key, payerKey, { permitId });
    expect(scoped).toMatchObject({
      object: "permit_authorization",
      api_key_id: app.id,
      payer: payerAddress.toLowerCase(),
      permit_id: permitId,
      status: "active",
      revoked_at: null,
      revoked_by: null,
    });
    await expectServed(await chat(app.key, permitId, false));
    await expectServed(await chat(app.key, permitId, true));
    expect(await json(await view(app.key, permitId))).toMatchObject({ permit_id: permitId });

    const before = chatCalls();
    await expectRefused(await chat(app.key, other));
    await expectRefused(await view(app.key, other));
    expect(chatCalls()).toBe(before);
    expect(await ledgerOf(other)).toEqual({ reserved: 0n, charged: 0n, requests: 0, leases: 0 });

    const wide = await authorizeKey(stack.gateway.url, app.key, payerKey);
    expect(wide.permit_id).toBe(`0x${"00".repeat(32)}`);
    await expectServed(await chat(app.key, other));
    expect(chatCalls()).toBe(before + 1);

    const listed = await json(await call(app.key, "/v1/permit-authorizations"));
    expect(listed.object).toBe("list");
    expect(listed.data.map((a: AuthorizationView) => a.id)).toEqual([wide.id, scoped.id]);
    // The same service over gRPC.
    const client = grpcClient(stack.gateway.url);
    try {
      const { authorizations } = await grpcUnary(
        client,
        PermitService.method.listAuthorizations,
        {},
        { authorization: `Bearer ${app.key}` },
      );
      expect(authorizations.map((a) => [a.id, a.permitId])).toEqual([
        [wide.id, `0x${"00".repeat(32)}`],
        [scoped.id, permitId],
      ]);
    } finally {
      client.close();
    }
    // Another key sees none of them.
    const stranger = await newKey();
    expect(await json(await call(stranger.key, "/v1/permit-authorizations"))).toEqual({
      object: "list",
      data: [],
    });
  });

  it("accepts an EIP-2098 compact signature from the payer", async () => {
    const app = await newKey();
    const permitId = await freshPermit();
    const typed = await challenge(app.key, { payer: payerAddress, permitId });
    const full = await privateKeyToAccount(payerKey).signTypedData(signable(typed));
    const compact = toCompact(full);
    expect(compact.length).toBe(2 + 128);
    const res = await submit(app.key, typed, compact);
    expect(res.status).toBe(200);
    await expectServed(await chat(app.key, permitId));
  });

  it("refuses 401 invalid_signature a signature by anyone but the payer, one made for another key, and one over altered fields", async () => {
    const permitId = await freshPermit();
    const app = await newKey();
    const other = await newKey();
    const typed = await challenge(app.key, { payer: payerAddress, permitId });
    expect(typed).toMatchObject({
      primaryType: "AuthorizeKey",
      domain: {
        name: "Model Market Gateway",
        version: "3",
        chainId: stack.anvil.chainId,
        verifyingContract: stack.demo.market,
      },
      message: { payer: payerAddress, keyId: app.id, permitId },
    });
    expect(typed.message.expiresAt).toBeGreaterThan(Math.floor(Date.now() / 1000) + 29 * 86400);

    const expectInvalid = async (res: Response) => {
      expect(res.status).toBe(401);
      expect((await json(res)).error).toMatchObject({
        code: "invalid_signature",
        type: "authentication_error",
      });
    };
    // The stranger signs the payer's typed data.
    const bySomeoneElse = await privateKeyToAccount(stranger.privateKey).signTypedData(
      signable(typed),
    );
    await expectInvalid(await submit(app.key, typed, bySomeoneElse));
    // The payer's real signature for `app`, posted by another key.
    const byPayer = await privateKeyToAccount(payerKey).signTypedData(signable(typed));
    await expectInvalid(await submit(other.key, typed, byPayer));
    // ... or with a wider scope than signed (every permit of the payer).
    await expectInvalid(
      await submit(
        app.key,
        { message: { ...typed.message, permitId: `0x${"00".repeat(32)}` } },
        byPayer,
      ),
    );
    await expectRefused(await chat(other.key, permitId));
    await expectRefused(await chat(app.key, permitId));
    expect(await json(await call(app.key, "/v1/permit-authorizations"))).toEqual({
      object: "list",
      data: [],
    });
  });

  it("refuses a replayed nonce 409 nonce_used", async () => {
    const app = await newKey();
    const typed = await challenge(app.key, { payer: payerAddress });
    const signature = await privateKeyToAccount(payerKey).signTypedData(signable(typed));
    expect((await submit(app.key, typed, signature)).status).toBe(200);
    const replay = await submit(app.key, typed, signature);
    expect(replay.status).toBe(409);
    expect((await json(replay)).error.code).toBe("nonce_used");
    expect((await json(await call(app.key, "/v1/permit-authorizations"))).data).toHaveLength(1);
  });

  it("names this deployment, when it was issued and its caps in what the payer signs; a signature for another deployment is refused 403 wrong_deployment", async () => {
    const permitId = await freshPermit();
    const app = await newKey();
    const gateway = await json(await fetch(`${stack.gateway.url}/v1/gateway`));
    expect(gateway.deployment).toMatch(/^dep_[0-9a-f]{32}$/);
    const t0 = Math.floor(Date.now() / 1000);
    const typed = await challenge(app.key, { payer: payerAddress, permitId, totalCap: "5000" });
    expect(typed.types.AuthorizeKey.map((f: { name: string }) => f.name)).toEqual([
      "payer",
      "keyId",
      "permitId",
      "expiresAt",
      "issuedAt",
      "deployment",
      "totalCap",
      "perRequestCap",
      "period",
      "periodCap",
      "warnAt",
      "nonce",
    ]);
    expect(typed.message).toMatchObject({
      deployment: gateway.deployment,
      totalCap: "5000",
      perRequestCap: "0",
    });
    expect(typed.message.issuedAt).toBeGreaterThanOrEqual(t0);
    expect(typed.message.issuedAt).toBeLessThanOrEqual(Math.floor(Date.now() / 1000));
    const payer = privateKeyToAccount(payerKey);

    // Signed for another deployment (another database serving this market): refused, named.
    const elsewhere = {
      ...typed,
      message: { ...typed.message, deployment: "dep_" + "ab".repeat(16) },
    };
    const forElsewhere = await payer.signTypedData(signable(elsewhere));
    const wrong = await submit(app.key, elsewhere, forElsewhere);
    expect(wrong.status).toBe(403);
    expect((await json(wrong)).error).toMatchObject({
      code: "wrong_deployment",
      type: "permission_error",
    });
    // The same signature with the deployment left out is not the payer's for this one.
    const { deployment: _left, ...withoutDeployment } = elsewhere.message;
    expect((await submit(app.key, { message: withoutDeployment }, forElsewhere)).status).toBe(401);
    // The caps and the issue time are signed: raising a cap breaks the signature.
    const signature = await payer.signTypedData(signable(typed));
    const raised = await submit(
      app.key,
      { message: { ...typed.message, totalCap: "5001" } },
      signature,
    );
    expect(raised.status).toBe(401);
    const stored = await submit(app.key, typed, signature);
    expect(stored.status).toBe(200);
    expect((await json(stored)).authorization).toMatchObject({
      issued_at: typed.message.issuedAt,
      total_cap: "5000",
      per_request_cap: "0",
    });
    expect((await json(await call(app.key, "/v1/permit-authorizations"))).data[0]).toMatchObject({
      issued_at: typed.message.issuedAt,
      total_cap: "5000",
      per_request_cap: "0",
    });
  });

  it("signs a periodic cap (issue 38): a changed, raised or dropped period or period cap does not verify; the stored one lists its period, its use and its renewal", async () => {
    const permitId = await freshPermit();
    const app = await newKey();
    const typed = await challenge(app.key, {
      payer: payerAddress,
      permitId,
      period: "day",
      periodCap: "7000",
    });
    expect(typed.message).toMatchObject({ period: "day", periodCap: "7000", totalCap: "0" });
    const payer = privateKeyToAccount(payerKey);
    const signature = await payer.signTypedData(signable(typed));
    for (const altered of [
      { period: "month" },
      { period: "week" },
      { periodCap: "7001" },
      { period: "", periodCap: "0" },
    ]) {
      const res = await submit(app.key, { message: { ...typed.message, ...altered } }, signature);
      expect({ altered, status: res.status }).toEqual({ altered, status: 401 });
      expect((await json(res)).error.code).toBe("invalid_signature");
    }
    const stored = await submit(app.key, typed, signature);
    expect(stored.status).toBe(200);
    expect((await json(stored)).authorization).toMatchObject({
      period: "day",
      period_cap: "7000",
      period_used: "0",
    });
    const listed = (await json(await call(app.key, "/v1/permit-authorizations"))).data[0];
    const now = Math.floor(Date.now() / 1000);
    expect(listed).toMatchObject({ period: "day", period_cap: "7000", period_used: "0" });
    // The end of the current UTC day (or the next, read at midnight).
    expect(listed.period_renews_at % 86_400).toBe(0);
    expect(listed.period_renews_at).toBeGreaterThan(now - 5);
    expect(listed.period_renews_at).toBeLessThanOrEqual(now + 86_400);
  });

  it("caps an authorization's lifetime (AUTHORIZATION_MAX_EXPIRY_SECONDS, 90 days) and a challenge's age (a day), and a cap names one permit", async () => {
    const app = await newKey();
    const now = Math.floor(Date.now() / 1000);
    const maxLifetime = 90 * 24 * 3600;
    const tooFar = await call(app.key, "/v1/permit-authorizations/challenge", {
      method: "POST",
      body: JSON.stringify({ payer: payerAddress, expiresAt: now + maxLifetime + 120 }),
    });
    expect(tooFar.status).toBe(400);
    expect((await json(tooFar)).error.code).toBe("authorization_expiry_too_far");
    const payerWideCap = await call(app.key, "/v1/permit-authorizations/challenge", {
      method: "POST",
      body: JSON.stringify({ payer: payerAddress, totalCap: "10" }),
    });
    expect(payerWideCap.status).toBe(400);
    expect((await json(payerWideCap)).error).toMatchObject({
      code: "authorization_cap_invalid",
      message: "a credit cap needs one permit (permitId): its token is the cap's unit",
    });

    // A payer signs what a hostile app built itself: an expiry far beyond the cap.
    const payer = privateKeyToAccount(payerKey);
    const typed = await challenge(app.key, { payer: payerAddress });
    const far = { ...typed, message: { ...typed.message, expiresAt: 2 ** 40 } };
    const farRes = await submit(app.key, far, await payer.signTypedData(signable(far)));
    expect(farRes.status).toBe(400);
    expect((await json(farRes)).error.code).toBe("authorization_expiry_too_far");
    // ... or a challenge issued two days ago (an old signature the payer forgot about).
    const old = {
      ...typed,
      message: { ...typed.message, issuedAt: now - 2 * 86400, expiresAt: now + 3600 },
    };
    const oldRes = await submit(app.key, old, await payer.signTypedData(signable(old)));
    expect(oldRes.status).toBe(409);
    expect((await json(oldRes)).error.code).toBe("challenge_expired");
    expect((await json(await call(app.key, "/v1/permit-authorizations"))).data).toEqual([]);
  });

  it("refuses an authorization once it expired", async () => {
    const permitId = await freshPermit();
    const app = await newKey();
    const expiresAt = Math.floor(Date.now() / 1000) + 2;
    const authorization = await authorizeKey(stack.gateway.url, app.key, payerKey, {
      permitId,
      expiresAt,
    });
    expect(authorization.expires_at).toBe(expiresAt);
    expect((await view(app.key, permitId)).status).toBe(200);
    await new Promise((r) => setTimeout(r, Math.max(0, (expiresAt + 0.2) * 1000 - Date.now())));
    const before = chatCalls();
    await expectRefused(await view(app.key, permitId));
    await expectRefused(await chat(app.key, permitId));
    expect(chatCalls()).toBe(before);
    const listed = await json(await call(app.key, "/v1/permit-authorizations?status=expired"));
    expect(listed.data.map((a: AuthorizationView) => a.id)).toEqual([authorization.id]);
  });

  it("lets an ERC-1271 contract wallet authorize a key (65-byte and compact signatures), and no one but its owner", async () => {
    const owner = stack.anvil.accounts[6]!;
    const wallet = await deployErc1271Wallet(
      stack.clients.wallet(stack.roles.deployer.privateKey),
      stack.clients.publicClient,
      { owner: owner.address },
    );
    const app = await newKey();
    const typed = await challenge(app.key, { payer: wallet });
    const full = await privateKeyToAccount(owner.privateKey).signTypedData(signable(typed));
    const res = await submit(app.key, typed, full);
    expect(res.status).toBe(200);
    expect((await json(res)).authorization).toMatchObject({
      api_key_id: app.id,
      payer: wallet.toLowerCase(),
      status: "active",
    });

    const again = await challenge(app.key, { payer: wallet });
    const compact = toCompact(
      await privateKeyToAccount(owner.privateKey).signTypedData(signable(again)),
    );
    expect((await submit(app.key, again, compact)).status).toBe(200);

    const third = await challenge(app.key, { payer: wallet });
    const forged = await privateKeyToAccount(stranger.privateKey).signTypedData(signable(third));
    const refused = await submit(app.key, third, forged);
    expect(refused.status).toBe(401);
    expect((await json(refused)).error.code).toBe("invalid_signature");
  });

  describe("revocation", () => {
    let second: Gateway;

    beforeAll(async () => {
      // Another gateway process on the same database (as the soak runs them): it has its own
      // caches, and learns of a revocation made on the first only through the database.
      second = await startGateway(stack.config, {
        logger: stack.logger,
        database: stack.database.db,
      });
    });
    afterAll(async () => {
      await second?.close();
    });

    /** How long the second gateway keeps answering `key` after the revocation, in ms. */
    const refusedOnSecondWithin = async (key: string, permitId: Hex, since: number) => {
      await eventually(
        async () => (await view(key, permitId, second.url)).status === 403,
        5000,
        25,
      );
      return Date.now() - since;
    };

    it("by the key that holds it: refused at once on this gateway, within API_KEY_CACHE_MS on another", async () => {
      const permitId = await freshPermit();
      const app = await newKey();
      const authorization = await authorizeKey(stack.gateway.url, app.key, payerKey);
      // Both gateways serve it (the second loads the key and its authority now).
      expect((await view(app.key, permitId, second.url)).status).toBe(200);
      await expectServed(await chat(app.key, permitId, false, second.url));

      // Another key cannot revoke it (nor learn that it exists).
      const other = await newKey();
      const foreign = await call(other.key, `/v1/permit-authorizations/${authorization.id}`, {
        method: "DELETE",
      });
      expect(foreign.status).toBe(404);
      expect((await json(foreign)).error.code).toBe("authorization_not_found");
      expect((await view(app.key, permitId)).status).toBe(200);

      const revokedAt = Date.now();
      const res = await call(app.key, `/v1/permit-authorizations/${authorization.id}`, {
        method: "DELETE",
      });
      expect(res.status).toBe(200);
      const revoked = (await json(res)).authorization as AuthorizationView;
      expect(revoked).toMatchObject({ id: authorization.id, status: "revoked", revoked_by: "key" });
      const before = chatCalls();
      await expectRefused(await chat(app.key, permitId));
      const elapsed = await refusedOnSecondWithin(app.key, permitId, revokedAt);
      expect(elapsed).toBeLessThan(cacheMs + 500);
      await expectRefused(await chat(app.key, permitId, true, second.url));
      expect(chatCalls()).toBe(before);

      // Revoking twice changes nothing.
      const again = await call(app.key, `/v1/permit-authorizations/${authorization.id}`, {
        method: "DELETE",
      });
      expect(again.status).toBe(200);
      expect((await json(again)).authorization).toEqual(revoked);
    });

    it("by the payer's signature, without the key: refused at once here, within API_KEY_CACHE_MS on another; a revocation signed by anyone else is refused", async () => {
      const permitId = await freshPermit();
      const app = await newKey();
      const authorization = await authorizeKey(stack.gateway.url, app.key, payerKey, {
        permitId,
      });
      expect((await view(app.key, permitId, second.url)).status).toBe(200);

      // The payer works with any key of its own (here the stack's), not with `app`.
      const typedRes = await call(
        stack.apiKey,
        `/v1/permit-authorizations/${authorization.id}/revocation-challenge`,
        { method: "POST" },
      );
      expect(typedRes.status).toBe(200);
      const typed = await json(typedRes);
      expect(typed).toMatchObject({
        primaryType: "RevokeKeyAuthorization",
        domain: { name: "Model Market Gateway", version: "3" },
        message: { payer: payerAddress, authorizationId: authorization.id },
      });
      const revoke = (signature: Hex) =>
        call(stack.apiKey, `/v1/permit-authorizations/${authorization.id}/revoke`, {
          method: "POST",
          body: JSON.stringify({ signature }),
        });

      const forged = await revoke(
        await privateKeyToAccount(stranger.privateKey).signTypedData(signable(typed)),
      );
      expect(forged.status).toBe(401);
      expect((await json(forged)).error.code).toBe("invalid_signature");
      expect((await view(app.key, permitId)).status).toBe(200);

      const revokedAt = Date.now();
      const res = await revoke(await privateKeyToAccount(payerKey).signTypedData(signable(typed)));
      expect(res.status).toBe(200);
      expect((await json(res)).authorization).toMatchObject({
        id: authorization.id,
        api_key_id: app.id,
        status: "revoked",
        revoked_by: "payer",
      });
      const before = chatCalls();
      await expectRefused(await chat(app.key, permitId));
      const elapsed = await refusedOnSecondWithin(app.key, permitId, revokedAt);
      expect(elapsed).toBeLessThan(cacheMs + 500);
      expect(chatCalls()).toBe(before);
      const listed = await json(await call(app.key, "/v1/permit-authorizations?status=revoked"));
      expect(listed.data.map((a: AuthorizationView) => a.id)).toEqual([authorization.id]);
    });

    it("an authorization made on one gateway is effective there at once", async () => {
      const permitId = await freshPermit();
      const app = await newKey();
      // The second gateway holds the key (with no authority) before the payer signs.
      await expectRefused(await view(app.key, permitId, second.url));
      await authorizeKey(second.url, app.key, payerKey, { permitId });
      expect((await view(app.key, permitId, second.url)).status).toBe(200);
    });
  });
});

import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import type { Hex } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { creditTokenAbi, marketAbi } from "../../gen/contracts/artifacts.js";
import { PermitService } from "../../gen/gateway/v1/permit_pb.js";
import { createApiKey } from "../../src/adapters/pg/api-keys.js";
import { startGateway, type Gateway } from "../../src/app.js";
import { id32 } from "../../src/dev/demo-market.js";
import {
  anyPermit,
  buildListAuthorizationsTypedData,
  buildRevokeAuthorizationsTypedData,
  signable,
} from "../../src/domain/permit-authorization/index.js";
import { authorizeKey, type AuthorizationView } from "../helpers/authorize.js";
import type { FakeUpstream } from "../helpers/fake-upstream.js";
import { grpcClient, grpcUnary } from "../helpers/grpc.js";
import { auditSecret } from "../helpers/log-audit.js";
import { mintCredits } from "../helpers/market.js";
import { runGatewayCli, type CliRun } from "../helpers/processes.js";
import { eventually, json, startChatStack, type TestStack } from "../helpers/stack.js";

/**
 * The payer in control without the key (issue 28, item 2): with its own signature, and no API
 * key at all, a payer lists every authorization made for its address, revokes them by key, by
 * permit or all, and a revoke all voids the AuthorizeKey signatures it made and nobody has
 * submitted yet. Each case is what one participant could otherwise do to another: a key holder
 * keeping a payer's authority the payer can no longer see or cut, an app sitting on a signed
 * authorization to submit it later, a stranger reading or cutting a payer's authorizations.
 */

/** API_KEY_CACHE_MS: how long another gateway may keep what it loaded before a revocation. */
const cacheMs = 1000;
const messages = [{ role: "user", content: "hi" }];
const now = () => Math.floor(Date.now() / 1000);

describe("a payer's control of its authorizations, without the key (PostgreSQL or PGlite, anvil)", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let second: Gateway;
  /** The payer of this suite (the demo payer's permits and authorizations stay the stack's). */
  let payer: { address: Hex; privateKey: Hex };
  let stranger: { address: Hex; privateKey: Hex };
  let deployment: string;
  let permitCounter = 0;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack({ API_KEY_CACHE_MS: String(cacheMs) }));
    payer = stack.anvil.accounts[5]!;
    stranger = stack.anvil.accounts[6]!;
    await mintCredits(stack, payer.address, 100n * 10n ** 18n);
    deployment = (await json(await fetch(`${stack.gateway.url}/v1/gateway`))).deployment;
    // Another gateway process on the same database, with caches of its own.
    second = await startGateway(stack.config, {
      logger: stack.logger,
      database: stack.database.db,
    });
  }, 120_000);
  afterAll(async () => {
    await second?.close();
    await fake?.stop();
    await stack?.close();
  });

  /** A permit of this suite's payer on the demo chat model (any offer). */
  const openPermit = async (): Promise<Hex> => {
    const model = stack.demo.models[0]!;
    const permitId = id32(`payer-control:${Date.now()}:${permitCounter++}`);
    const wallet = stack.clients.wallet(payer.privateKey);
    const deposit = 10n ** 18n;
    const send = async (hash: Hex) => {
      const receipt = await stack.clients.publicClient.waitForTransactionReceipt({ hash });
      expect(receipt.status).toBe("success");
    };
    await send(
      await wallet.writeContract({
        address: model.creditToken,
        abi: creditTokenAbi,
        functionName: "approve",
        args: [stack.demo.market, deposit],
      }),
    );
    const block = await stack.clients.publicClient.getBlock();
    await send(
      await wallet.writeContract({
        address: stack.demo.market,
        abi: marketAbi,
        functionName: "openPermit",
        args: [permitId, model.modelId, anyPermit, deposit, block.timestamp + 30n * 86_400n],
      }),
    );
    return permitId;
  };
  const newKey = async (name = "app"): Promise<{ id: string; key: string }> => {
    const created = await createApiKey(stack.database.db.pool, name);
    auditSecret("api key", created.key);
    return { id: created.id, key: created.key };
  };
  const chat = (key: string, permitId: Hex, base = stack.gateway.url) =>
    fetch(`${base}/v1/chat/completions`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${key}`,
        "content-type": "application/json",
        "x-gateway-permit": permitId,
      },
      body: JSON.stringify({ model: "demo-chat", messages }),
    });
  const expectServed = async (res: Response) => {
    expect(res.status).toBe(200);
    await res.arrayBuffer();
  };
  const expectRefused = async (res: Response, code = "permit_not_authorized") => {
    const body = await json(res);
    expect(res.status, JSON.stringify(body)).toBe(403);
    expect(body.error.code).toBe(code);
  };
  const expectError = async (res: Response, status: number, code: string) => {
    const body = await json(res);
    expect(res.status, JSON.stringify(body)).toBe(status);
    expect(body.error.code).toBe(code);
  };
  const chatCalls = () => fake.calls("/v1/chat/completions");

  const domain = () => ({ chainId: stack.config.chainId, market: stack.demo.market });
  /** The payer's ListAuthorizations signature, as its own tool makes it (no challenge). */
  const signList = (
    privateKey: Hex,
    message: { payer?: Hex; deployment?: string; expiresAt?: number },
    at = domain(),
  ) => {
    const expiresAt = message.expiresAt ?? now() + 300;
    const signed = {
      payer: message.payer ?? payer.address,
      deployment: message.deployment ?? deployment,
      expiresAt,
    };
    return privateKeyToAccount(privateKey)
      .signTypedData(signable(buildListAuthorizationsTypedData({ ...at, message: signed })))
      .then((signature) => ({ deployment: signed.deployment, expiresAt, signature }));
  };
  const signRevoke = (
    privateKey: Hex,
    message: { keyId?: string; permitId?: Hex; before?: number; deployment?: string },
  ) => {
    const signed = {
      payer: payer.address,
      deployment: message.deployment ?? deployment,
      keyId: message.keyId ?? "",
      permitId: message.permitId ?? anyPermit,
      before: message.before ?? now(),
    };
    return privateKeyToAccount(privateKey)
      .signTypedData(signable(buildRevokeAuthorizationsTypedData({ ...domain(), message: signed })))
      .then((signature) => ({
        deployment: signed.deployment,
        ...(signed.keyId === "" ? {} : { keyId: signed.keyId }),
        ...(signed.permitId === anyPermit ? {} : { permitId: signed.permitId }),
        before: signed.before,
        signature,
      }));
  };
  /** No Authorization header: the signature is the only credential. */
  const post = (path: string, body: unknown, base = stack.gateway.url) =>
    fetch(`${base}${path}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: typeof body === "string" ? body : JSON.stringify(body),
    });
  const list = (body: unknown, who: Hex = payer.address) =>
    post(`/v1/payers/${who}/authorizations`, body);
  const revoke = (body: unknown, base = stack.gateway.url) =>
    post(`/v1/payers/${payer.address}/authorizations/revoke`, body, base);
  const listAll = async (): Promise<AuthorizationView[]> => {
    const res = await list(await signList(payer.privateKey, {}));
    expect(res.status).toBe(200);
    return (await json(res)).data as AuthorizationView[];
  };

  /** The AuthorizeKey typed data for `key`, signed by the payer, not submitted. */
  const pendingAuthorization = async (key: string, permitId?: Hex) => {
    const res = await fetch(`${stack.gateway.url}/v1/permit-authorizations/challenge`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({
        payer: payer.address,
        ...(permitId === undefined ? {} : { permitId }),
      }),
    });
    expect(res.status).toBe(200);
    const typed = await json(res);
    const signature = await privateKeyToAccount(payer.privateKey).signTypedData(signable(typed));
    return {
      issuedAt: typed.message.issuedAt as number,
      submit: (base = stack.gateway.url) =>
        fetch(`${base}/v1/permit-authorizations`, {
          method: "POST",
          headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
          body: JSON.stringify({ ...typed.message, signature }),
        }),
    };
  };
  /** Waits until the gateway's clock (this machine's) is past `t` (Unix seconds). */
  const waitPast = async (t: number) => {
    while (now() <= t) await new Promise((r) => setTimeout(r, 50));
  };

  it("lists every authorization of its address across keys, newest first and by pages, with no API key; a stranger's or another deployment's signature reads nothing", async () => {
    const permitId = await openPermit();
    const a = await newKey("list a");
    const b = await newKey("list b");
    const first = await authorizeKey(stack.gateway.url, a.key, payer.privateKey, { permitId });
    const secondAuth = await authorizeKey(stack.gateway.url, b.key, payer.privateKey);
    const third = await authorizeKey(stack.gateway.url, a.key, payer.privateKey);
    // The demo payer's authorization of the stack's key is not this payer's.
    const listed = await listAll();
    expect(listed.map((x) => [x.id, x.api_key_id, x.permit_id, x.status])).toEqual([
      [third.id, a.id, anyPermit, "active"],
      [secondAuth.id, b.id, anyPermit, "active"],
      [first.id, a.id, permitId, "active"],
    ]);
    expect(listed[2]).toEqual(first);

    // Pages: the same read token, twice.
    const token = await signList(payer.privateKey, {});
    const page1 = await json(await list({ ...token, limit: 2 }));
    expect(page1.data.map((x: AuthorizationView) => x.id)).toEqual([third.id, secondAuth.id]);
    expect(page1.has_more).toBe(true);
    const page2 = await json(await list({ ...token, limit: 2, startingAfter: secondAuth.id }));
    expect(page2).toEqual({ object: "list", data: [first], has_more: false });

    // Over gRPC too, without credentials.
    const client = grpcClient(stack.gateway.url);
    try {
      const answer = await grpcUnary(client, PermitService.method.listPayerAuthorizations, {
        payer: payer.address,
        deployment: token.deployment,
        expiresAt: BigInt(token.expiresAt),
        signature: token.signature,
      });
      expect(answer.authorizations.map((x) => x.id)).toEqual([third.id, secondAuth.id, first.id]);
      expect(answer.hasMore).toBe(false);
    } finally {
      client.close();
    }

    // A stranger's signature over the payer's listing, or the payer's over another payer's.
    await expectError(
      await list(await signList(stranger.privateKey, {})),
      401,
      "invalid_signature",
    );
    await expectError(
      await list(await signList(payer.privateKey, {}), stranger.address),
      401,
      "invalid_signature",
    );
    // Signed for another chain (another domain): not this gateway's.
    await expectError(
      await list(await signList(payer.privateKey, {}, { ...domain(), chainId: 1 })),
      401,
      "invalid_signature",
    );
    // Another deployment (another database serving the same market).
    await expectError(
      await list(await signList(payer.privateKey, { deployment: `dep_${"ab".repeat(16)}` })),
      403,
      "wrong_deployment",
    );
    // Expired, and too long a read token.
    await expectError(
      await list(await signList(payer.privateKey, { expiresAt: now() - 1 })),
      401,
      "signature_expired",
    );
    await expectError(
      await list(await signList(payer.privateKey, { expiresAt: now() + 3600 })),
      400,
      "invalid_request",
    );
    // A body an anonymous caller could make large is cut at 4 KiB.
    await expectError(await list({ ...token, pad: "p".repeat(5000) }), 413, "request_too_large");
  });

  it("revokes by key without the key holder: that key is refused at once, the payer's other key keeps working, the key's authority from another payer stays", async () => {
    const permitId = await openPermit();
    const a = await newKey("by key a");
    const b = await newKey("by key b");
    const revokedOne = await authorizeKey(stack.gateway.url, a.key, payer.privateKey, {
      permitId,
    });
    await authorizeKey(stack.gateway.url, b.key, payer.privateKey, { permitId });
    // The demo payer also authorized `a` on its own permit.
    await authorizeKey(stack.gateway.url, a.key, stack.roles.payer.privateKey, {
      permitId: stack.demo.permitId,
    });
    await expectServed(await chat(a.key, permitId));
    await expectServed(await chat(a.key, permitId, second.url));

    // Signed by a stranger: nothing happens.
    await expectError(
      await revoke(await signRevoke(stranger.privateKey, { keyId: a.id })),
      401,
      "invalid_signature",
    );
    await expectError(
      await revoke(
        await signRevoke(payer.privateKey, { keyId: a.id, deployment: `dep_${"cd".repeat(16)}` }),
      ),
      403,
      "wrong_deployment",
    );
    await expectError(
      await revoke(await signRevoke(payer.privateKey, { keyId: a.id, before: now() + 3600 })),
      400,
      "invalid_request",
    );
    await expectServed(await chat(a.key, permitId));

    const signed = await signRevoke(payer.privateKey, { keyId: a.id });
    const revokedAt = Date.now();
    const res = await revoke(signed);
    expect(res.status).toBe(200);
    const body = await json(res);
    expect(body).toMatchObject({ object: "payer_revocation", revoked: 1, epoch: null });
    expect(body.authorizations).toEqual([
      {
        ...revokedOne,
        status: "revoked",
        revoked_at: expect.any(Number),
        revoked_by: "payer",
      },
    ]);
    const calls = chatCalls();
    await expectRefused(await chat(a.key, permitId));
    expect(chatCalls()).toBe(calls);
    await expectServed(await chat(b.key, permitId));
    await expectServed(await chat(a.key, stack.demo.permitId));
    // The other gateway: within its cache time.
    await eventually(
      async () => (await chat(a.key, permitId, second.url)).status === 403,
      5000,
      25,
    );
    expect(Date.now() - revokedAt).toBeLessThan(cacheMs + 1000);

    // Replayed: nothing more to revoke.
    expect(await json(await revoke(signed))).toMatchObject({ revoked: 0, authorizations: [] });
  });

  it("revokes by permit: the key keeps its authority over the payer's other permit", async () => {
    const p1 = await openPermit();
    const p2 = await openPermit();
    const a = await newKey("by permit");
    const onP1 = await authorizeKey(stack.gateway.url, a.key, payer.privateKey, { permitId: p1 });
    await authorizeKey(stack.gateway.url, a.key, payer.privateKey, { permitId: p2 });
    const res = await revoke(await signRevoke(payer.privateKey, { permitId: p1 }));
    const body = await json(res);
    expect(res.status, JSON.stringify(body)).toBe(200);
    expect(body.revoked).toBe(1);
    expect(body.authorizations.map((x: AuthorizationView) => x.id)).toEqual([onP1.id]);
    await expectRefused(await chat(a.key, p1));
    await expectServed(await chat(a.key, p2));
  });

  it("revoke all: every authorization refused at once; an AuthorizeKey signed before it and submitted after is refused authorization_revoked, one signed after is accepted, and replaying the old revoke all leaves it", async () => {
    const permitId = await openPermit();
    const a = await newKey("all a");
    const b = await newKey("all b");
    const late = await newKey("all late");
    await authorizeKey(stack.gateway.url, a.key, payer.privateKey);
    await authorizeKey(stack.gateway.url, b.key, payer.privateKey, { permitId });
    await expectServed(await chat(a.key, permitId));
    await expectServed(await chat(b.key, permitId, second.url));
    // An app holds a signed authorization and has not submitted it yet.
    const pending = await pendingAuthorization(late.key, permitId);
    const pendingElsewhere = await pendingAuthorization(late.key);

    const active = (await listAll()).filter((x) => x.status === "active").map((x) => x.id);
    expect(active.length).toBeGreaterThanOrEqual(2);

    const before = now();
    const signed = await signRevoke(payer.privateKey, { before });
    const res = await revoke(signed);
    const body = await json(res);
    expect(res.status, JSON.stringify(body)).toBe(200);
    expect(body.revoked).toBe(active.length);
    expect(body.authorizations.map((x: AuthorizationView) => x.id)).toEqual(active);
    // The later of the payer's clock and the gateway's (a second may pass on a loaded machine
    // between the two reads): the epoch is what the gateway revoked up to, never before `before`.
    expect(body.epoch).toBe(body.revoked_before);
    expect(body.epoch).toBeGreaterThanOrEqual(before);
    expect(body.epoch).toBeLessThanOrEqual(now());
    expect(body.warning).toBeNull();
    const calls = chatCalls();
    await expectRefused(await chat(a.key, permitId));
    await expectRefused(await chat(b.key, permitId));
    expect(chatCalls()).toBe(calls);
    // Nothing of the payer's is active any more.
    expect((await listAll()).filter((x) => x.status === "active")).toEqual([]);

    // The pending signatures die with it, on either gateway.
    await expectRefused(await pending.submit(), "authorization_revoked");
    await expectRefused(await pendingElsewhere.submit(second.url), "authorization_revoked");
    await expectRefused(await chat(late.key, permitId));

    // Signed after the revocation: accepted.
    await waitPast(before);
    const fresh = await pendingAuthorization(late.key, permitId);
    expect(fresh.issuedAt).toBeGreaterThan(before);
    const made = await fresh.submit();
    expect(made.status).toBe(200);
    await expectServed(await chat(late.key, permitId));

    // The old revoke all, replayed, revokes nothing made after it.
    const replay = await json(await revoke(signed));
    expect(replay).toMatchObject({ revoked: 0, epoch: before });
    await expectServed(await chat(late.key, permitId));
    // The other gateway refuses the revoked keys within its cache time, and serves the new one.
    await eventually(
      async () => (await chat(a.key, permitId, second.url)).status === 403,
      5000,
      25,
    );
    // (Where the database cannot signal, PGlite, the other gateway holds the late key's earlier
    // refusal for its cache time too.)
    await eventually(
      async () => {
        const res = await chat(late.key, permitId, second.url);
        await res.text();
        return res.status === 200;
      },
      5000,
      25,
    );
  });

  it("a payer's calls need no credentials, over Connect too; a large body is refused there as well", async () => {
    const client = createClient(
      PermitService,
      createConnectTransport({ baseUrl: stack.gateway.url, httpVersion: "1.1" }),
    );
    const token = await signList(payer.privateKey, {});
    const answer = await client.listPayerAuthorizations({
      payer: payer.address,
      deployment: token.deployment,
      expiresAt: BigInt(token.expiresAt),
      signature: token.signature,
      limit: 1,
    });
    expect(answer.authorizations.length).toBe(1);
    expect(answer.hasMore).toBe(true);
    const large = await client
      .listPayerAuthorizations({
        payer: payer.address,
        deployment: "d".repeat(8000),
        expiresAt: BigInt(token.expiresAt),
        signature: token.signature,
      })
      .catch((e: unknown) => e);
    expect(large).toBeInstanceOf(ConnectError);
    expect((large as ConnectError).code).toBe(Code.ResourceExhausted);
    // Every other PermitService call still needs an API key.
    const keyed = await client.listAuthorizations({}).catch((e: unknown) => e);
    expect((keyed as ConnectError).code).toBe(Code.Unauthenticated);
  });

  describe("from the CLI (real processes, no API key)", () => {
    const outputs: CliRun[] = [];
    afterAll(() => {
      for (const run of outputs)
        for (const key of [payer.privateKey, stranger.privateKey])
          expect(run.stdout + run.stderr).not.toContain(key.slice(2));
    });
    const env = (extra: Record<string, string> = {}) => ({
      PATH: process.env.PATH ?? "",
      RPC_URL: stack.config.rpcUrl,
      CHAIN_ID: String(stack.config.chainId),
      MARKET_ADDRESS: stack.demo.market,
      GATEWAY_URL: stack.gateway.url,
      PAYER_PRIVATE_KEY: payer.privateKey,
      // No terminal: the deployment is pinned, or nothing is signed (issue 37).
      GATEWAY_DEPLOYMENT_ID: deployment,
      ...extra,
    });
    const cli = async (args: string[], extra: Record<string, string> = {}) => {
      const run = await runGatewayCli(["permit", ...args], env(extra));
      outputs.push(run);
      return run;
    };

    it("permit authorizations lists them, permit revoke --key, --permit and --all cut them, each showing the deployment before signing", async () => {
      const permitId = await openPermit();
      const a = await newKey("cli a");
      const b = await newKey("cli b");
      const onA = await authorizeKey(stack.gateway.url, a.key, payer.privateKey, { permitId });
      const onB = await authorizeKey(stack.gateway.url, b.key, payer.privateKey, { permitId });

      const listed = await cli(["authorizations", "--json"]);
      expect(listed.stderr).toBe("");
      expect(listed.code).toBe(0);
      const out = JSON.parse(listed.stdout) as {
        payer: string;
        deployment: string;
        authorizations: AuthorizationView[];
      };
      expect(out.payer).toBe(payer.address);
      expect(out.deployment).toBe(deployment);
      expect(out.authorizations.slice(0, 2)).toEqual([onB, onA]);

      const text = await cli(["authorizations"]);
      expect(text.code).toBe(0);
      expect(text.stdout).toMatch(
        new RegExp(
          `^signing ListAuthorizations as payer ${payer.address}: gateway deployment ${deployment} \\(pinned\\), chain ${stack.config.chainId}, market ${stack.demo.market}, valid until \\d{4}-\\d\\d-\\d\\dT`,
        ),
      );
      expect(text.stdout).toContain(`${onA.id}  active   key ${a.id}  permit ${permitId}`);

      const byKey = await cli(["revoke", "--key", a.id]);
      expect(byKey.stderr).toBe("");
      expect(byKey.code).toBe(0);
      expect(byKey.stdout).toContain(`gateway deployment ${deployment}`);
      expect(byKey.stdout).toContain("revoked 1 authorization\n");
      await expectRefused(await chat(a.key, permitId));
      await expectServed(await chat(b.key, permitId));

      // By permit: b loses its authority over a second permit and keeps the first.
      const second = await openPermit();
      await authorizeKey(stack.gateway.url, b.key, payer.privateKey, { permitId: second });
      await expectServed(await chat(b.key, second));
      const byPermit = await cli(["revoke", "--permit", second]);
      expect(byPermit.stderr).toBe("");
      expect(byPermit.code).toBe(0);
      expect(byPermit.stdout).toContain("revoked 1 authorization\n");
      await expectRefused(await chat(b.key, second));
      await expectServed(await chat(b.key, permitId));

      const all = await cli(["revoke", "--all", "--json"]);
      expect(all.code).toBe(0);
      const revokedAll = JSON.parse(all.stdout) as {
        revoked: number;
        epoch: number;
        before: number;
        revoked_before: number;
        warning: string | null;
        authorizations: AuthorizationView[];
      };
      // The later of the CLI's clock and the gateway's: a second can pass between the two.
      expect(revokedAll.epoch).toBe(revokedAll.revoked_before);
      expect(revokedAll.epoch).toBeGreaterThanOrEqual(revokedAll.before);
      expect(revokedAll.epoch).toBeLessThanOrEqual(now());
      expect(revokedAll.warning).toBeNull();
      expect(revokedAll.authorizations.map((x) => x.id)).toContain(onB.id);
      await expectRefused(await chat(b.key, permitId));

      // The listing shows them revoked by the payer.
      const after = JSON.parse((await cli(["authorizations", "--json"])).stdout) as {
        authorizations: AuthorizationView[];
      };
      expect(
        after.authorizations
          .filter((x) => [onA.id, onB.id].includes(x.id))
          .map((x) => [x.id, x.status, x.revoked_by]),
      ).toEqual([
        [onB.id, "revoked", "payer"],
        [onA.id, "revoked", "payer"],
      ]);
    });

    it("signs nothing for a gateway on another market, and refuses usage mistakes", async () => {
      const other = await cli(["authorizations"], { MARKET_ADDRESS: stranger.address });
      expect(other.code).toBe(1);
      expect(other.stderr).toContain("differs at market");
      expect(other.stderr).toContain("nothing was signed");
      expect(other.stdout).toBe("");
      const both = await cli(["revoke", "--all", "--key", `key_${"0".repeat(24)}`]);
      expect(both.code).toBe(2);
      expect(both.stderr).toContain("--all revokes everything");
      const none = await cli(["revoke"]);
      expect(none.code).toBe(2);
      const plain = await cli(["authorizations"], { GATEWAY_URL: "http://gateway.example" });
      expect(plain.code).toBe(2);
      expect(plain.stderr).toContain("GATEWAY_URL must be an https:// URL");
    });
  });
});

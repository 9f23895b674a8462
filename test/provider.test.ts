import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { getAddress, keccak256, stringToHex, type Hex } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { canonicalEndpointUrl } from "../src/adapters/upstream/endpoint-guard.js";
import { startGateway, type Gateway } from "../src/app.js";
import { runProviderCommand } from "../src/cli/provider.js";
import { registerEndpoint } from "../src/clients/provider.js";
import { GatewayRequestError } from "../src/clients/gateway-call.js";
import { endpointTokenHash, endpointUrlHash } from "../src/domain/registration/index.js";
import { ProviderService } from "../gen/gateway/v1/provider_pb.js";
import { describeIfPostgres } from "./helpers/db.js";
import { grpcClient, grpcUnary } from "./helpers/grpc.js";
import { gatewayCli } from "./helpers/processes.js";
import { startFakeUpstream, type FakeUpstream } from "./helpers/fake-upstream.js";
import {
  authed,
  eventually,
  json,
  startChatStack,
  startTestStack,
  type TestStack,
} from "./helpers/stack.js";

const run = promisify(execFile);

function capture() {
  const lines: string[] = [];
  return { lines, out: { log: (l: string) => lines.push(l), error: (l: string) => lines.push(l) } };
}

describe("provider onboarding", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  const token = "provider-secret-token-123";
  const responses: string[] = [];
  const record = async (res: Response) => {
    const text = await res.text();
    responses.push(text);
    return { status: res.status, body: text === "" ? undefined : JSON.parse(text) };
  };

  beforeAll(async () => {
    // Verifications here follow each other at once, each meant to run (the bound: below).
    stack = await startTestStack({
      ALLOW_PRIVATE_ENDPOINTS: "true",
      PROBE_INTERVAL_MS: "200",
      VERIFY_MIN_INTERVAL_SECONDS: "0",
    });
    fake = await startFakeUpstream({ models: ["demo-coder"], token });
  });
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  const coderOffer = () =>
    stack.demo.offers.find((o) => o.modelId === stack.demo.models[1]!.modelId)!.offerId;
  const env = () => ({
    GATEWAY_URL: stack.gateway.url,
    GATEWAY_API_KEY: stack.apiKey,
    OPERATOR_PRIVATE_KEY: stack.roles.operator.privateKey,
    RPC_URL: stack.config.rpcUrl,
    MARKET_ADDRESS: stack.demo.market,
  });

  it("registers and verifies through the CLI; health and the offers listing show it", async () => {
    const offerId = coderOffer();
    const register = capture();
    const code = await runProviderCommand(
      ["register", "--offer", offerId, "--endpoint", fake.url, "--endpoint-token", token],
      env(),
      register.out,
    );
    expect(code, register.lines.join("\n")).toBe(0);
    // What the operator signs, shown first: built from its own arguments (the endpoint and token
    // only as their hashes, which the signature binds).
    expect(register.lines.slice(0, 6)).toEqual([
      `about to sign RegisterEndpoint as the operator of offer ${offerId} (chain ${stack.config.chainId}, market ${stack.demo.market.toLowerCase()}):`,
      `  offer     ${offerId}`,
      `  operator  ${getAddress(stack.roles.operator.address)}`,
      `  endpoint  the URL given, canonical form hashed: ${endpointUrlHash(canonicalEndpointUrl(fake.url))}`,
      `  token     the token given, hashed: ${endpointTokenHash(token)}`,
      expect.stringMatching(/^ {2}expires {3}\d+ \(.*, in 10 minutes\)$/),
    ]);
    expect(register.lines.join("\n")).not.toContain(token);
    expect(register.lines.slice(6)).toEqual([
      `registered an endpoint for offer ${offerId} (signed by ${stack.roles.operator.address})`,
      `next: gateway provider verify ${offerId}`,
    ]);

    const verify = capture();
    expect(
      await runProviderCommand(["verify", offerId], env(), verify.out),
      verify.lines.join("\n"),
    ).toBe(0);
    // The provider saw the gateway's checks, with its token.
    expect(fake.calls("/v1/models")).toBeGreaterThan(0);
    expect(fake.requests.every((r) => r.headers.authorization === `Bearer ${token}`)).toBe(true);

    const health = await record(await authed(stack, `/v1/provider-offers/${offerId}/health`));
    expect(health.status).toBe(200);
    expect(health.body).toMatchObject({ offer_id: offerId, status: "active", running: true });
    expect(health.body.verified_at).toEqual(expect.any(Number));
    expect(health.body.verification_expires_at).toBe(health.body.verified_at + 86_400);

    const offers = await record(await authed(stack, "/v1/models/demo-coder/offers"));
    const listed = offers.body.data.find((o: { offer_id: string }) => o.offer_id === offerId);
    expect(listed.verified_at).toBe(health.body.verified_at);
    expect(listed.verification_expires_at).toBe(health.body.verification_expires_at);

    // The real CLI binary answers the same health.
    const { stdout } = await run(process.execPath, [...gatewayCli, "provider", "health", offerId], {
      env: { ...process.env, ...env() },
    });
    expect(JSON.parse(stdout)).toMatchObject({ offer_id: offerId, running: true });
  });

  it("fails verification with a code naming the check, and the offer loses its verification", async () => {
    const offerId = coderOffer();
    fake.setOptions({ listModels: true, models: ["something-else"] });
    const notListed = await record(
      await authed(stack, `/v1/provider-offers/${offerId}/verify`, { method: "POST" }),
    );
    expect(notListed.status).toBe(422);
    expect(notListed.body.error.code).toBe("model_not_listed");
    const offers = await record(await authed(stack, "/v1/models/demo-coder/offers"));
    expect(
      offers.body.data.find((o: { offer_id: string }) => o.offer_id === offerId).verified_at,
    ).toBeNull();

    fake.setOptions({ models: ["demo-coder"], omitUsage: true });
    const noUsage = await record(
      await authed(stack, `/v1/provider-offers/${offerId}/verify`, { method: "POST" }),
    );
    expect(noUsage.status).toBe(422);
    expect(noUsage.body.error.code).toBe("usage_missing");

    fake.setOptions({ omitUsage: false });
    const ok = await record(
      await authed(stack, `/v1/provider-offers/${offerId}/verify`, { method: "POST" }),
    );
    expect(ok.status).toBe(200);
    expect(ok.body.offer.verified_at).toEqual(expect.any(Number));
  });

  it("shows a stopped provider as not running within the probe interval", async () => {
    const offerId = coderOffer();
    const stopped = await startFakeUpstream({ models: ["demo-chat"] });
    const chatOffer = stack.demo.offers.find(
      (o) => o.status === "active" && o.modelId === stack.demo.models[0]!.modelId,
    )!.offerId;
    await registerEndpoint(
      { baseUrl: stack.gateway.url, apiKey: stack.apiKey },
      {
        offerId: chatOffer,
        endpointUrl: stopped.url,
        signer: privateKeyToAccount(stack.roles.operator.privateKey),
        chain: { chainId: stack.config.chainId, market: stack.demo.market },
      },
    );
    await eventually(
      async () =>
        (await json(await authed(stack, `/v1/provider-offers/${chatOffer}/health`))).running ===
        true,
      3000,
    );
    await stopped.stop();
    // The background prober (200 ms) notices without anyone asking.
    await eventually(async () => {
      const { rows } = await stack.database.db.pool.query(
        "SELECT running FROM provider_endpoints WHERE offer_id = $1",
        [chatOffer],
      );
      return rows[0]?.running === false;
    }, 2000);
    const health = await record(await authed(stack, `/v1/provider-offers/${chatOffer}/health`));
    expect(health.body.running).toBe(false);
    expect((await json(await authed(stack, `/v1/provider-offers/${offerId}/health`))).running).toBe(
      true,
    );
  });

  it("answers bad input with the error body", async () => {
    const offerId = coderOffer();
    const unknown = `0x${"ab".repeat(32)}`;
    const cases: [string, RequestInit, number, string][] = [
      [`/v1/provider-offers/${unknown}/health`, {}, 404, "offer_not_found"],
      ["/v1/provider-offers/0x12/health", {}, 400, "invalid_hex"],
      [
        "/v1/provider-offers/challenge",
        { method: "POST", body: "{", headers: { "content-type": "application/json" } },
        400,
        "invalid_json",
      ],
      [
        "/v1/provider-offers/challenge",
        {
          method: "POST",
          body: JSON.stringify({ offerId }),
          headers: { "content-type": "application/json" },
        },
        400,
        "invalid_request",
      ],
      [
        "/v1/provider-offers/challenge",
        {
          method: "POST",
          body: JSON.stringify({ offerId: unknown, endpointUrl: fake.url }),
          headers: { "content-type": "application/json" },
        },
        404,
        "offer_not_found",
      ],
      [
        "/v1/provider-offers/challenge",
        {
          method: "POST",
          body: JSON.stringify({
            offerId,
            endpointUrl: fake.url,
            expiresAt: Math.floor(Date.now() / 1000) + 3600,
          }),
          headers: { "content-type": "application/json" },
        },
        400,
        "challenge_expiry_invalid",
      ],
      [
        "/v1/provider-offers/challenge",
        {
          method: "POST",
          body: JSON.stringify({ offerId, endpointUrl: fake.url, expiresAt: "soon" }),
          headers: { "content-type": "application/json" },
        },
        400,
        "invalid_request",
      ],
    ];
    for (const [path, init, status, code] of cases) {
      const res = await record(await authed(stack, path, init));
      expect(res.status, path).toBe(status);
      expect(res.body.error.code, path).toBe(code);
      expect(res.body.error.type).toEqual(expect.any(String));
    }
  });

  it("refuses a signed registration replayed with another endpoint token (401 invalid_signature); the signed token registers", async () => {
    const offerId = coderOffer();
    const post = (path: string, body: object) =>
      authed(stack, path, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(body),
      });
    const challenge = await record(
      await post("/v1/provider-offers/challenge", {
        offerId,
        endpointUrl: fake.url,
        endpointToken: token,
      }),
    );
    expect(challenge.status).toBe(200);
    expect(challenge.body.domain.version).toBe("3");
    expect(challenge.body.message.endpointTokenHash).toBe(keccak256(stringToHex(token)));
    const { EIP712Domain: _, ...types } = challenge.body.types;
    const signature = await privateKeyToAccount(stack.roles.operator.privateKey).signTypedData({
      domain: challenge.body.domain,
      types,
      primaryType: challenge.body.primaryType,
      message: challenge.body.message,
    });
    const signed = {
      offerId,
      endpointUrl: fake.url,
      nonce: challenge.body.message.nonce,
      expiresAt: challenge.body.message.expiresAt,
      signature,
    };
    const attacker = "attacker-token-456";
    for (const swap of [{ endpointToken: attacker }, {}]) {
      const refused = await record(
        await post("/v1/provider-offers/register", { ...signed, ...swap }),
      );
      expect(refused.status).toBe(401);
      expect(refused.body).toEqual({
        error: {
          code: "invalid_signature",
          type: "authentication_error",
          message:
            "signature does not match the challenge fields (offerId, endpointUrl, endpointToken, nonce, expiresAt)",
        },
      });
    }
    const registered = await record(
      await post("/v1/provider-offers/register", { ...signed, endpointToken: token }),
    );
    expect(registered.status).toBe(200);
    expect(registered.body.offer.offer_id).toBe(offerId);
    // The gateway presents the signed token, not the attacker's.
    const verified = await record(await post(`/v1/provider-offers/${offerId}/verify`, {}));
    expect(verified.status).toBe(200);
    expect(fake.requests.at(-1)!.headers.authorization).toBe(`Bearer ${token}`);
    expect(stack.logs.text).not.toContain(attacker);
  });

  it("never shows the endpoint URL or token in a response or a log line", () => {
    const host = new URL(fake.url).host;
    for (const text of [...responses, stack.logs.text]) {
      expect(text).not.toContain(host);
      expect(text).not.toContain(token);
    }
    expect(stack.logs.lines.length).toBeGreaterThan(0);
  });
});

// DESIGN.md section 8, "No one can knock an offer out": verify is open to any API key.
describe("verification under a flood", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let chatOffer: Hex;
  let second: Gateway | undefined;
  // The gateways' clock: the bound (VERIFY_MIN_INTERVAL_SECONDS, default 60) is passed by
  // moving it, not by sleeping.
  let now = Math.floor(Date.now() / 1000);
  const clock = () => now;
  const onboardedAt = now;

  beforeAll(async () => {
    ({ stack, fake, chatOffer } = await startChatStack({}, { clock }));
    // On PostgreSQL a second gateway shares the database: the bound is fleet-wide.
    if (process.env.TEST_DATABASE_URL !== undefined) {
      second = await startGateway(stack.config, {
        logger: stack.logger,
        database: stack.database.db,
        clock,
      });
    }
  });
  afterAll(async () => {
    await second?.close();
    await fake?.stop();
    await stack?.close();
  });

  const verify = (base = stack.gateway.url) =>
    fetch(`${base}/v1/provider-offers/${chatOffer}/verify`, {
      method: "POST",
      headers: { authorization: `Bearer ${stack.apiKey}` },
    });
  const listedOffer = async () =>
    (await json(await authed(stack, "/v1/models/demo-chat/offers"))).data.find(
      (o: { offer_id: string }) => o.offer_id === chatOffer,
    );
  /** One verification run sends exactly one `GET /v1/models` (liveness probes are off here). */
  const runs = () => fake.calls("/v1/models");

  it("answers a verify inside the bound with the last run, without an upstream call", async () => {
    const before = { runs: runs(), chats: fake.calls("/v1/chat/completions") };
    expect(before.runs).toBe(1); // onboarding's verification
    now += 59;
    const res = await verify();
    expect(res.status).toBe(200);
    const body = await json(res);
    expect(body.offer.verified_at).toBe(onboardedAt);
    expect(body.offer.verification_expires_at).toBe(onboardedAt + 86_400);
    expect(body.verification).toEqual({
      ran_at: onboardedAt,
      replayed: true,
      next_run_at: onboardedAt + 60,
    });
    // The same over gRPC: VerifyOfferResponse.verification.
    const client = grpcClient(stack.gateway.url);
    try {
      const rpc = await grpcUnary(
        client,
        ProviderService.method.verifyOffer,
        { offerId: chatOffer },
        { authorization: `Bearer ${stack.apiKey}` },
      );
      expect(rpc.offer?.verifiedAt).toBe(BigInt(onboardedAt));
      expect(rpc.verification).toMatchObject({
        ranAt: BigInt(onboardedAt),
        replayed: true,
        nextRunAt: BigInt(onboardedAt + 60),
      });
    } finally {
      client.close();
    }
    // The CLI says the outcome is the last run's, not a new check.
    const cli = capture();
    const code = await runProviderCommand(
      ["verify", chatOffer],
      { GATEWAY_URL: stack.gateway.url, GATEWAY_API_KEY: stack.apiKey },
      cli.out,
    );
    expect(code, cli.lines.join("\n")).toBe(0);
    expect(cli.lines).toEqual([
      `offer ${chatOffer} verified at ${onboardedAt}, eligible until ${onboardedAt + 86_400}`,
      `(the last run's outcome, from ${onboardedAt}; the checks run again from ${onboardedAt + 60})`,
    ]);
    expect(runs()).toBe(before.runs);
    expect(fake.calls("/v1/chat/completions")).toBe(before.chats);
  });

  it("100 concurrent verifies against a provider answering 429 cause one run and leave the offer verified", async () => {
    now = onboardedAt + 60; // the bound has passed: the next verify runs
    const before = { runs: runs(), chats: fake.calls("/v1/chat/completions") };
    fake.setOptions({ failStatus: 429 });
    const bases = [stack.gateway.url, ...(second === undefined ? [] : [second.url])];
    const answers = await Promise.all(
      Array.from({ length: 100 }, async (_, i) => {
        const res = await verify(bases[i % bases.length]);
        return { status: res.status, body: await json(res) };
      }),
    );
    // Exactly one run, in the whole fleet: its model list and its one completion (429).
    expect(runs() - before.runs).toBe(1);
    expect(fake.calls("/v1/chat/completions") - before.chats).toBe(1);
    // The callers of the gateway that ran share its failure. A caller of the other gateway that
    // came while the run was under way is answered the last run that had ended: onboarding's.
    let failed = 0;
    for (const a of answers) {
      if (a.status === 200) {
        // The bound now runs from the flood's claim.
        expect(a.body.verification).toEqual({
          ran_at: onboardedAt,
          replayed: true,
          next_run_at: onboardedAt + 120,
        });
        continue;
      }
      failed++;
      expect(a.status).toBe(502);
      expect(a.body.error.code).toBe("endpoint_unreachable");
      expect(a.body.error.message).toContain(
        `the standing verification (until ${onboardedAt + 86_400}) is kept`,
      );
    }
    expect(failed).toBeGreaterThanOrEqual(second === undefined ? 100 : 50);

    // Still verified, still eligible: a chat is routed to it.
    expect(await listedOffer()).toMatchObject({
      verified_at: onboardedAt,
      verification_expires_at: onboardedAt + 86_400,
    });
    fake.setOptions({ failStatus: undefined });
    const chat = await authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json", "x-gateway-permit": stack.demo.permitId },
      body: JSON.stringify({ model: "demo-chat", messages: [{ role: "user", content: "hi" }] }),
    });
    expect(chat.status).toBe(200);
    expect(chat.headers.get("x-gateway-offer-id")).toBe(chatOffer);
    await chat.text();
  });

  it("keeps the verification through a 5xx and a reset connection; a wrong answer clears it", async () => {
    for (const fault of [{ failStatus: 503 }, { resetBeforeHeaders: true }] as const) {
      now += 60;
      fake.setOptions({ failStatus: undefined, resetBeforeHeaders: undefined, ...fault });
      const res = await verify();
      expect(res.status).toBe(502);
      expect((await json(res)).error.code).toBe("endpoint_unreachable");
      expect(await listedOffer()).toMatchObject({ verified_at: onboardedAt });
    }
    fake.setOptions({ failStatus: undefined, resetBeforeHeaders: undefined, omitUsage: true });
    now += 60;
    const wrong = await verify();
    expect(wrong.status).toBe(422);
    expect((await json(wrong)).error.code).toBe("usage_missing");
    expect(await listedOffer()).toMatchObject({ verified_at: null, verification_expires_at: null });
    // Inside the bound the failure is answered again, saying when it ran, without a run.
    const runsBefore = runs();
    const replayed = await verify();
    expect(replayed.status).toBe(422);
    const body = await json(replayed);
    expect(body.error.code).toBe("usage_missing");
    expect(body.error.message).toContain(`the last verification (at ${now}) failed`);
    expect(runs()).toBe(runsBefore);
    fake.setOptions({ omitUsage: false });
  });
});

describe("endpoint safety", () => {
  let stack: TestStack;
  beforeAll(async () => {
    stack = await startTestStack({ ALLOW_PRIVATE_ENDPOINTS: "false" });
  });
  afterAll(async () => {
    await stack?.close();
  });

  it.each([
    "http://169.254.169.254/",
    "http://[::ffff:a9fe:a9fe]/",
    "http://10.0.0.1/",
    "http://2130706433/",
    "http://[::1]/",
    "http://localhost:9/",
    "http://100.64.0.1/",
  ])("refuses %s with 400 endpoint_not_allowed", async (endpointUrl) => {
    const error = await registerEndpoint(
      { baseUrl: stack.gateway.url, apiKey: stack.apiKey },
      {
        offerId: stack.demo.offers[0]!.offerId,
        endpointUrl,
        signer: privateKeyToAccount(stack.roles.operator.privateKey),
        chain: { chainId: stack.config.chainId, market: stack.demo.market },
      },
    ).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(GatewayRequestError);
    expect((error as GatewayRequestError).status).toBe(400);
    expect((error as GatewayRequestError).code).toBe("endpoint_not_allowed");
  });
});

describeIfPostgres("two gateway processes on one PostgreSQL", () => {
  let stack: TestStack;
  let second: Gateway;
  beforeAll(async () => {
    stack = await startTestStack({ ALLOW_PRIVATE_ENDPOINTS: "true" });
    second = await startGateway(stack.config, {
      logger: stack.logger,
      database: stack.database.db,
    });
  });
  afterAll(async () => {
    await second?.close();
    await stack?.close();
  });

  it("lets exactly one of two racing registrations with one nonce succeed", async () => {
    const offerId = stack.demo.offers[0]!.offerId;
    const headers = { authorization: `Bearer ${stack.apiKey}`, "content-type": "application/json" };
    const endpointUrl = "http://127.0.0.1:9/";
    const typed = await json(
      await fetch(`${stack.gateway.url}/v1/provider-offers/challenge`, {
        method: "POST",
        headers,
        body: JSON.stringify({ offerId, endpointUrl }),
      }),
    );
    const { EIP712Domain: _, ...types } = typed.types;
    const signature = await privateKeyToAccount(stack.roles.operator.privateKey).signTypedData({
      domain: typed.domain,
      types,
      primaryType: typed.primaryType,
      message: typed.message,
    });
    const body = JSON.stringify({
      offerId,
      endpointUrl,
      nonce: typed.message.nonce,
      expiresAt: typed.message.expiresAt,
      signature,
    });
    const results = await Promise.all(
      [stack.gateway.url, second.url].map(async (base) => {
        const res = await fetch(`${base}/v1/provider-offers/register`, {
          method: "POST",
          headers,
          body,
        });
        return { status: res.status, body: await json(res) };
      }),
    );
    expect(results.map((r) => r.status).sort()).toEqual([200, 409]);
    expect(results.find((r) => r.status === 409)!.body.error.code).toBe("nonce_used");
  });
});

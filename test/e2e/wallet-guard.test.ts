import { randomBytes } from "node:crypto";
import { networkInterfaces } from "node:os";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { getAddress, zeroHash, type Hex } from "viem";
import { createApiKey } from "../../src/adapters/pg/api-keys.js";
import { canonicalEndpointUrl } from "../../src/adapters/upstream/endpoint-guard.js";
import { runPermitCommand } from "../../src/cli/permit.js";
import { runProviderCommand } from "../../src/cli/provider.js";
import { apiKeyIdOf } from "../../src/domain/api-key-check.js";
import { anyPermit } from "../../src/domain/permit-authorization/index.js";
import { endpointTokenHash, endpointUrlHash } from "../../src/domain/registration/index.js";
import { authorizeKey, type AuthorizationView } from "../helpers/authorize.js";
import { startFakeGateway, route, type FakeGateway } from "../helpers/fake-gateway.js";
import type { FakeUpstream } from "../helpers/fake-upstream.js";
import { auditSecret } from "../helpers/log-audit.js";
import { runGatewayCli, type CliRun } from "../helpers/processes.js";
import { json, startChatStack, type TestStack } from "../helpers/stack.js";

/**
 * Issue 28, item 1: wallet commands sign only what their user asked for. Each case runs the real
 * CLI as a child process against a real HTTP gateway that forwards everything to the stack's
 * real gateway but changes one thing (the challenge, mostly); the CLI must sign nothing, exit 1
 * and name the field, and the fake gateway must receive no signature.
 */

const challengePath = "/v1/permit-authorizations/challenge";
const day = 86_400;

describe("wallet commands sign only what their user asked for", () => {
  let stack: TestStack;
  let upstream: FakeUpstream;
  let chatOffer: Hex;
  let fake: FakeGateway;
  let deployment: string;
  let app: { id: string; key: string };
  let other: { id: string; key: string };
  const runs: CliRun[] = [];

  beforeAll(async () => {
    ({ stack, fake: upstream, chatOffer } = await startChatStack());
    fake = await startFakeGateway(stack.gateway.url);
    deployment = (
      (await json(await fetch(`${stack.gateway.url}/v1/gateway`))) as {
        deployment: string;
      }
    ).deployment;
    app = await createApiKey(stack.database.db.pool, "agent");
    other = await createApiKey(stack.database.db.pool, "someone else");
    auditSecret("api key", app.key);
    auditSecret("api key", other.key);
  }, 120_000);
  afterAll(async () => {
    // No output of any run, refused or not, carries a private key or an API key.
    for (const run of runs)
      for (const secret of [
        stack.roles.payer.privateKey.slice(2),
        stack.roles.operator.privateKey.slice(2),
        app.key,
        other.key,
      ])
        expect(run.stdout + run.stderr).not.toContain(secret);
    await fake?.close();
    await upstream?.stop();
    await stack?.close();
  });
  beforeEach(() => fake?.reset());

  const market = () => stack.demo.market.toLowerCase();
  const chainId = () => stack.config.chainId;
  const payer = () => getAddress(stack.roles.payer.address);
  const permitId = () => stack.demo.permitId;
  const env = (extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv => ({
    PATH: process.env.PATH ?? "",
    RPC_URL: stack.config.rpcUrl,
    MARKET_ADDRESS: stack.demo.market,
    GATEWAY_URL: fake.url,
    GATEWAY_API_KEY: app.key,
    PAYER_PRIVATE_KEY: stack.roles.payer.privateKey,
    OPERATOR_PRIVATE_KEY: stack.roles.operator.privateKey,
    // Pinned: without a terminal nothing is signed otherwise (issue 37).
    GATEWAY_DEPLOYMENT_ID: deployment,
    ...extra,
  });
  const cli = async (args: string[], runEnv: NodeJS.ProcessEnv = env()): Promise<CliRun> => {
    const run = await runGatewayCli(args, runEnv);
    runs.push(run);
    return run;
  };
  const heldBy = async (key: string): Promise<AuthorizationView[]> =>
    (
      (await json(
        await fetch(`${stack.gateway.url}/v1/permit-authorizations`, {
          headers: { authorization: `Bearer ${key}` },
        }),
      )) as { data: AuthorizationView[] }
    ).data;
  const chat = (key: string) =>
    fetch(`${stack.gateway.url}/v1/chat/completions`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${key}`,
        "x-gateway-permit": permitId(),
        "content-type": "application/json",
      },
      body: JSON.stringify({ model: "demo-chat", messages: [{ role: "user", content: "hi" }] }),
    });
  /** Nothing signed reached the fake gateway, and nothing was stored behind it. */
  const nothingSigned = async (submitPath: string) => {
    expect(fake.signaturesReceived()).toEqual([]);
    expect(fake.received.filter((r) => r.method === "POST" && r.path === submitPath)).toEqual([]);
  };

  describe("gateway permit authorize", () => {
    const expiresAt = Math.floor(Date.now() / 1000) + 7 * day;
    const authorize = (extra: string[] = []) =>
      cli([
        "permit",
        "authorize",
        "--permit",
        permitId(),
        "--expires-at",
        String(expiresAt),
        "--key-id",
        app.id,
        ...extra,
      ]);

    // A typed data an attacker would rather have: an EIP-2612 permit of the payer's credit
    // token to a spender of its own, unlimited, for ever.
    const erc2612 = (c: { domain: { chainId: number } }) => ({
      types: {
        EIP712Domain: [
          { name: "name", type: "string" },
          { name: "version", type: "string" },
          { name: "chainId", type: "uint256" },
          { name: "verifyingContract", type: "address" },
        ],
        Permit: [
          { name: "owner", type: "address" },
          { name: "spender", type: "address" },
          { name: "value", type: "uint256" },
          { name: "nonce", type: "uint256" },
          { name: "deadline", type: "uint256" },
        ],
      },
      primaryType: "Permit",
      domain: {
        name: "Demo Credit",
        version: "1",
        chainId: c.domain.chainId,
        verifyingContract: stack.demo.models[0]!.creditToken,
      },
      message: {
        owner: payer(),
        spender: stack.anvil.accounts[9]!.address,
        value: ((1n << 256n) - 1n).toString(),
        nonce: 0,
        deadline: ((1n << 256n) - 1n).toString(),
      },
    });
    const anotherMarket = `0x${"77".repeat(20)}`;
    const anotherDeployment = `dep_${"ab".repeat(16)}`;
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    type Challenge = any;
    const cases: [string, (c: Challenge) => unknown, () => string][] = [
      [
        "an EIP-2612 Permit",
        erc2612,
        () =>
          "the gateway's challenge differs at primaryType: expected AuthorizeKey, got Permit; nothing was signed",
      ],
      [
        "an AuthorizeKey for another key",
        (c) => ({ ...c, message: { ...c.message, keyId: other.id } }),
        () =>
          `the gateway's challenge differs at message.keyId: expected ${app.id}, got ${other.id}; nothing was signed`,
      ],
      [
        "every permit instead of the one asked for",
        (c) => ({ ...c, message: { ...c.message, permitId: anyPermit } }),
        () =>
          `the gateway's challenge differs at message.permitId: expected ${permitId()}, got ${anyPermit}; nothing was signed`,
      ],
      [
        "an expiry of 2^40",
        (c) => ({ ...c, message: { ...c.message, expiresAt: 2 ** 40 } }),
        () =>
          `the gateway's challenge differs at message.expiresAt: expected ${expiresAt}, got ${2 ** 40}; nothing was signed`,
      ],
      [
        "another chain id",
        (c) => ({ ...c, domain: { ...c.domain, chainId: 1 } }),
        () =>
          `the gateway's challenge differs at domain.chainId: expected ${chainId()}, got 1; nothing was signed`,
      ],
      [
        "another market",
        (c) => ({ ...c, domain: { ...c.domain, verifyingContract: anotherMarket } }),
        () =>
          `the gateway's challenge differs at domain.verifyingContract: expected ${market()}, got ${anotherMarket}; nothing was signed`,
      ],
      [
        "another deployment",
        (c) => ({ ...c, message: { ...c.message, deployment: anotherDeployment } }),
        () =>
          `the gateway's challenge differs at message.deployment: expected ${deployment}, got ${anotherDeployment}; nothing was signed`,
      ],
      [
        "a field list without the caps",
        (c) => ({
          ...c,
          types: {
            ...c.types,
            AuthorizeKey: c.types.AuthorizeKey.filter(
              (f: { name: string }) => f.name !== "totalCap" && f.name !== "perRequestCap",
            ),
          },
        }),
        () =>
          "the gateway's challenge differs at types.AuthorizeKey[6]: expected totalCap uint256, got period string; nothing was signed",
      ],
      [
        // The AuthorizeKey of before issue 38: a periodic cap the user asked for would be lost.
        "a field list without the periodic cap",
        (c) => ({
          ...c,
          types: {
            ...c.types,
            AuthorizeKey: c.types.AuthorizeKey.filter(
              (f: { name: string }) => f.name !== "period" && f.name !== "periodCap",
            ),
          },
        }),
        () =>
          "the gateway's challenge differs at types.AuthorizeKey[8]: expected period string, got warnAt uint256; nothing was signed",
      ],
      [
        "a field list without the soft threshold (a key holder dropping the payer's warning)",
        (c) => ({
          ...c,
          types: {
            ...c.types,
            AuthorizeKey: c.types.AuthorizeKey.filter((f: { name: string }) => f.name !== "warnAt"),
          },
        }),
        () =>
          "the gateway's challenge differs at types.AuthorizeKey[10]: expected warnAt uint256, got nonce string; nothing was signed",
      ],
      [
        "another EIP712Domain (a salt)",
        (c) => ({
          ...c,
          types: {
            ...c.types,
            EIP712Domain: [...c.types.EIP712Domain, { name: "salt", type: "bytes32" }],
          },
        }),
        () =>
          "the gateway's challenge differs at types.EIP712Domain[4]: expected nothing, got salt bytes32; nothing was signed",
      ],
      [
        "a struct more",
        (c) => ({ ...c, types: { ...c.types, Extra: [{ name: "x", type: "uint256" }] } }),
        () =>
          "the gateway's challenge differs at types.Extra: expected nothing, got x uint256; nothing was signed",
      ],
      [
        "a message field more",
        (c) => ({ ...c, message: { ...c.message, spender: payer() } }),
        () =>
          `the gateway's challenge differs at message.spender: expected nothing, got ${payer()}; nothing was signed`,
      ],
      [
        "another payer",
        (c) => ({ ...c, message: { ...c.message, payer: stack.anvil.accounts[9]!.address } }),
        () =>
          `the gateway's challenge differs at message.payer: expected ${payer()}, got ${stack.anvil.accounts[9]!.address}; nothing was signed`,
      ],
      [
        "a total cap it was not asked for",
        (c) => ({ ...c, message: { ...c.message, totalCap: "1000000000000000000000000" } }),
        () =>
          "the gateway's challenge differs at message.totalCap: expected 0, got 1000000000000000000000000; nothing was signed",
      ],
    ];

    it.each(cases.map(([name, change, message]) => ({ name, change, message })))(
      "a challenge with $name: nothing signed, exit 1, the field named",
      async ({ change, message }) => {
        fake.rewrite(route("POST", challengePath), change);
        const run = await authorize();
        expect(run.stderr).toBe(`${message()}\n`);
        expect(run.stdout).toBe("");
        expect(run.code).toBe(1);
        // The challenge was asked for; nothing came back signed.
        expect(fake.received.map((r) => `${r.method} ${r.path}`)).toEqual([
          "GET /v1/gateway",
          `POST ${challengePath}`,
        ]);
        await nothingSigned("/v1/permit-authorizations");
        expect(await heldBy(app.key)).toEqual([]);
      },
      60_000,
    );

    it("a challenge issued long ago (or ahead) by the gateway's clock: refused by the CLI's", async () => {
      for (const shift of [-3600, 3600]) {
        fake.reset();
        let issuedAt = 0;
        fake.rewrite(route("POST", challengePath), (c) => {
          issuedAt = (c.message.issuedAt as number) + shift;
          return { ...c, message: { ...c.message, issuedAt } };
        });
        const run = await authorize();
        expect(run.code).toBe(1);
        expect(run.stderr).toMatch(
          new RegExp(
            `^the gateway's challenge differs at message\\.issuedAt: expected within 300 seconds of this machine's clock \\(\\d+\\), got ${issuedAt}; nothing was signed\n$`,
          ),
        );
        await nothingSigned("/v1/permit-authorizations");
      }
    }, 60_000);

    it("GET /v1/gateway naming another chain or market: refused before any challenge", async () => {
      fake.rewrite(route("GET", "/v1/gateway"), (g) => ({ ...g, chain_id: 1 }));
      const run = await authorize();
      expect(run.code).toBe(1);
      expect(run.stderr).toBe(
        `the gateway's GET /v1/gateway differs at chain_id: expected ${chainId()}, got 1; nothing was signed\n`,
      );
      expect(fake.received.map((r) => r.path)).toEqual(["/v1/gateway"]);
    });

    it("refuses an expiry beyond 90 days before sending anything; the expiry and caps are the arguments'", async () => {
      const now = Math.floor(Date.now() / 1000);
      const far = await cli([
        "permit",
        "authorize",
        "--permit",
        permitId(),
        "--expires-at",
        String(now + 91 * day),
      ]);
      expect(far.code).toBe(2);
      expect(far.stderr).toMatch(/^the expiry is more than 90 days away: /);
      const forever = await cli(["permit", "authorize", "--expires-in", `${2 ** 40}`]);
      expect(forever.code).toBe(2);
      // A cap needs one permit; a per-request cap above the total is no narrowing.
      const capped = await cli(["permit", "authorize", "--total-cap", "5"]);
      expect(capped.code).toBe(2);
      expect(capped.stderr).toMatch(/^a credit cap needs one permit \(permitId\)/);
      const inverted = await cli([
        "permit",
        "authorize",
        "--permit",
        permitId(),
        "--total-cap",
        "5",
        "--per-request-cap",
        "6",
      ]);
      expect(inverted.code).toBe(2);
      expect(inverted.stderr).toMatch(/^perRequestCap is above totalCap/);
      const notCredits = await cli([
        "permit",
        "authorize",
        "--permit",
        permitId(),
        "--total-cap",
        "1.5",
      ]);
      expect(notCredits.code).toBe(2);
      // A bare fraction is neither base units nor (without the suffix or --tokens) tokens.
      expect(notCredits.stderr).toMatch(
        /^--total-cap in base units is a whole number; for tokens write "1.5tokens" or add --tokens/,
      );
      expect(fake.received).toEqual([]);
    });

    it("http:// to another machine is refused before any request; a redirect is not followed", async () => {
      const lan = Object.values(networkInterfaces())
        .flat()
        .find((i) => i !== undefined && i.family === "IPv4" && !i.internal)?.address;
      const listening = await startFakeGateway(stack.gateway.url, "0.0.0.0");
      const sink = await startFakeGateway(stack.gateway.url);
      try {
        const url = `http://${lan ?? "gateway.invalid"}:${listening.port}`;
        for (const args of [
          ["permit", "authorize", "--permit", permitId()],
          ["permit", "revoke", "pauth_000000000000000000000000"],
          ["provider", "register", "--offer", chatOffer, "--endpoint", upstream.url],
          ["provider", "bind-key", chatOffer],
        ]) {
          const run = await cli(args, env({ GATEWAY_URL: url }));
          expect(run.code, args.join(" ")).toBe(2);
          expect(run.stderr).toMatch(
            /^GATEWAY_URL must be an https:\/\/ URL \(http:\/\/ only to this machine: 127\.0\.0\.0\/8, ::1, localhost\)/,
          );
        }
        expect(listening.received).toEqual([]);

        // The fake gateway sends the challenge request elsewhere, with the API key on it.
        fake.redirect(route("POST", challengePath), `${sink.url}${challengePath}`);
        const redirected = await authorize();
        expect(redirected.code).toBe(1);
        expect(redirected.stderr).toBe(
          `the gateway answered POST ${challengePath} with a redirect (HTTP 307); redirects are not followed: set GATEWAY_URL to the address that answers itself\n`,
        );
        expect(sink.received).toEqual([]);
        await nothingSigned("/v1/permit-authorizations");
      } finally {
        await listening.close();
        await sink.close();
      }
    });

    it("not confirmed at the terminal: nothing signed (exit 1)", async () => {
      const lines: string[] = [];
      const questions: string[] = [];
      const code = await runPermitCommand(
        ["authorize", "--permit", permitId(), "--expires-at", String(expiresAt)],
        env(),
        {
          log: (line) => lines.push(line),
          error: (line) => lines.push(line),
          ask: async (question) => {
            questions.push(question);
            return false;
          },
        },
      );
      expect(code).toBe(1);
      expect(questions).toEqual(["sign it? [y/N] "]);
      expect(lines.at(-1)).toBe("not confirmed; nothing was signed");
      expect(lines).toContain(`  API key      ${app.id} (derived from the API key)`);
      await nothingSigned("/v1/permit-authorizations");
      expect(await heldBy(app.key)).toEqual([]);
    });

    it("the happy path: what it signs is shown first, then the key chats within the caps it was given", async () => {
      expect((await chat(app.key)).status).toBe(403);
      const run = await authorize([
        "--total-cap",
        "5000000000000000000",
        "--per-request-cap",
        "1000000000000000000",
        "--period",
        "day",
        "--period-cap",
        "3000000000000000000",
        "--warn-at",
        "2.5tokens",
        "--json",
      ]);
      expect(run.code).toBe(0);
      const { authorization } = JSON.parse(run.stdout) as { authorization: AuthorizationView };
      expect(authorization).toMatchObject({
        api_key_id: app.id,
        payer: payer().toLowerCase(),
        permit_id: permitId(),
        status: "active",
        expires_at: expiresAt,
        total_cap: "5000000000000000000",
        per_request_cap: "1000000000000000000",
        period: "day",
        period_cap: "3000000000000000000",
        period_used: "0",
        warn_at: "2500000000000000000",
        warn_reached: false,
      });
      const lines = run.stderr.split("\n");
      // Amounts in the permit's token units (read from the chain), the base units signed beside.
      expect(lines.slice(0, 10)).toEqual([
        `about to sign AuthorizeKey as the payer ${payer()} (chain ${chainId()}, market ${market()}):`,
        `  payer        ${payer()}`,
        `  API key      ${app.id} (--key-id)`,
        `  permit       ${permitId()}`,
        `  expires      ${expiresAt} (${new Date(expiresAt * 1000).toISOString()}, in 7 days)`,
        "  total cap    5 DCHAT (5000000000000000000 base units)",
        "  per request  1 DCHAT (1000000000000000000 base units)",
        "  per period   3 DCHAT (3000000000000000000 base units) per UTC day",
        "  warn at      2.5 DCHAT (2500000000000000000 base units) of use per UTC day",
        `  deployment   ${deployment} (pinned)`,
      ]);
      expect(lines[10]).toBe(
        `  issued       ${authorization.issued_at} (${new Date(authorization.issued_at * 1000).toISOString()}, now)`,
      );
      expect(lines.slice(11)).toEqual([""]);
      expect(fake.signaturesReceived().map((r) => r.path)).toEqual(["/v1/permit-authorizations"]);
      const served = await chat(app.key);
      expect(served.status).toBe(200);
      await served.arrayBuffer();
    }, 60_000);

    it("without --key-id, the key id is derived from the key: a challenge naming another is refused", async () => {
      expect(app.id).toBe(apiKeyIdOf(app.key));
      fake.rewrite(route("POST", challengePath), (c) => ({
        ...c,
        message: { ...c.message, keyId: other.id },
      }));
      const run = await cli(["permit", "authorize", "--permit", permitId()]);
      expect(run.code).toBe(1);
      expect(run.stderr).toBe(
        `the gateway's challenge differs at message.keyId: expected ${app.id}, got ${other.id}; nothing was signed\n`,
      );
      await nothingSigned("/v1/permit-authorizations");
      expect(await heldBy(other.key)).toEqual([]);
    });
  });

  describe("gateway permit revoke ID", () => {
    let authorization: AuthorizationView;
    beforeAll(async () => {
      const key = await createApiKey(stack.database.db.pool, "to revoke");
      auditSecret("api key", key.key);
      authorization = await authorizeKey(stack.gateway.url, key.key, stack.roles.payer.privateKey);
    });
    const revokePath = () => `/v1/permit-authorizations/${authorization.id}/revoke`;

    it.each([
      {
        name: "another authorization",
        change: (c: { message: object }) => ({
          ...c,
          message: { ...c.message, authorizationId: "pauth_000000000000000000000000" },
        }),
        message: (): string =>
          `the gateway's challenge differs at message.authorizationId: expected ${authorization.id}, got pauth_000000000000000000000000; nothing was signed`,
      },
      {
        name: "another chain id",
        change: (c: { domain: object }) => ({ ...c, domain: { ...c.domain, chainId: 10 } }),
        message: (): string =>
          `the gateway's challenge differs at domain.chainId: expected ${chainId()}, got 10; nothing was signed`,
      },
    ])("a challenge for $name: nothing signed", async ({ change, message }) => {
      fake.rewrite(route("POST", /\/revocation-challenge$/), change);
      const run = await cli(["permit", "revoke", authorization.id]);
      expect(run.code).toBe(1);
      expect(run.stderr).toBe(`${message()}\n`);
      await nothingSigned(revokePath());
    });

    it("the happy path: shown, signed, revoked", async () => {
      const run = await cli(["permit", "revoke", authorization.id, "--yes"]);
      expect(run.stderr).toBe(
        `about to sign RevokeKeyAuthorization as the payer ${payer()} (chain ${chainId()}, market ${market()}):\n` +
          `  payer    ${payer()}\n` +
          `  revokes  ${authorization.id}\n`,
      );
      expect(run.code).toBe(0);
      expect(run.stdout).toBe(
        `revoked ${authorization.id} (API key ${authorization.api_key_id}, by the payer)\n`,
      );
    });
  });

  describe("gateway provider register and bind-key", () => {
    const token = `tok_${randomBytes(8).toString("hex")}`;
    const register = () =>
      cli([
        "provider",
        "register",
        "--offer",
        chatOffer,
        "--endpoint",
        upstream.url,
        "--endpoint-token",
        token,
      ]);
    const otherHash = `0x${"99".repeat(32)}`;

    it.each([
      {
        name: "another endpoint URL hash",
        change: (c: { message: object }) => ({
          ...c,
          message: { ...c.message, endpointUrlHash: otherHash },
        }),
        message: (): string =>
          `the gateway's challenge differs at message.endpointUrlHash: expected ${endpointUrlHash(canonicalEndpointUrl(upstream.url))}, got ${otherHash}; nothing was signed`,
      },
      {
        name: "no token's hash",
        change: (c: { message: object }) => ({
          ...c,
          message: { ...c.message, endpointTokenHash: zeroHash },
        }),
        message: (): string =>
          `the gateway's challenge differs at message.endpointTokenHash: expected ${endpointTokenHash(token)}, got ${zeroHash}; nothing was signed`,
      },
      {
        name: "another domain version",
        change: (c: { domain: object }) => ({ ...c, domain: { ...c.domain, version: "2" } }),
        message: (): string =>
          "the gateway's challenge differs at domain.version: expected 3, got 2; nothing was signed",
      },
      {
        name: "another market",
        change: (c: { domain: object }) => ({
          ...c,
          domain: { ...c.domain, verifyingContract: `0x${"66".repeat(20)}` },
        }),
        message: (): string =>
          `the gateway's challenge differs at domain.verifyingContract: expected ${market()}, got 0x${"66".repeat(20)}; nothing was signed`,
      },
      {
        name: "another offer",
        change: (c: { message: object }) => ({
          ...c,
          message: { ...c.message, offerId: otherHash },
        }),
        message: (): string =>
          `the gateway's challenge differs at message.offerId: expected ${chatOffer}, got ${otherHash}; nothing was signed`,
      },
    ])("register, a challenge with $name: nothing signed", async ({ change, message }) => {
      fake.rewrite(route("POST", "/v1/provider-offers/challenge"), change);
      const run = await register();
      expect(run.stderr).toBe(`${message()}\n`);
      expect(run.code).toBe(1);
      await nothingSigned("/v1/provider-offers/register");
    });

    it.each([
      {
        name: "another key",
        change: (c: { message: object }) => ({ ...c, message: { ...c.message, keyId: other.id } }),
        message: (): string =>
          `the gateway's challenge differs at message.keyId: expected ${app.id}, got ${other.id}; nothing was signed`,
      },
      {
        name: "another chain id",
        change: (c: { domain: object }) => ({ ...c, domain: { ...c.domain, chainId: 8453 } }),
        message: (): string =>
          `the gateway's challenge differs at domain.chainId: expected ${chainId()}, got 8453; nothing was signed`,
      },
      {
        name: "another operator",
        change: (c: { message: object }) => ({
          ...c,
          message: { ...c.message, operator: stack.anvil.accounts[9]!.address },
        }),
        message: (): string =>
          `the gateway's challenge differs at message.operator: expected ${getAddress(stack.roles.operator.address)}, got ${stack.anvil.accounts[9]!.address}; nothing was signed`,
      },
    ])("bind-key, a challenge with $name: nothing signed", async ({ change, message }) => {
      fake.rewrite(route("POST", /\/key-bindings\/challenge$/), change);
      const run = await cli(["provider", "bind-key", chatOffer, "--key-id", app.id]);
      expect(run.stderr).toBe(`${message()}\n`);
      expect(run.code).toBe(1);
      await nothingSigned(`/v1/provider-offers/${chatOffer}/key-bindings`);
    });

    it("bind-key, the happy path through the same gateway: shown, signed, bound", async () => {
      const run = await cli(["provider", "bind-key", chatOffer, "--key-id", app.id]);
      expect(run.code).toBe(0);
      expect(run.stderr).toMatch(
        new RegExp(
          `^about to sign BindOfferKey as the operator of offer ${chatOffer} \\(chain ${chainId()}, market ${market()}\\):\n` +
            `  offer       ${chatOffer}\n` +
            `  operator    ${getAddress(stack.roles.operator.address)}\n` +
            `  API key     ${app.id} \\(--key-id\\)\n` +
            `  expires     \\d+ \\(.*, in 30 days\\)\n` +
            `  deployment  ${deployment} \\(pinned\\)\n$`,
        ),
      );
      expect(run.stdout).toMatch(new RegExp(`^bound API key ${app.id} to offer ${chatOffer}`));
      expect(fake.signaturesReceived().map((r) => r.path)).toEqual([
        `/v1/provider-offers/${chatOffer}/key-bindings`,
      ]);
    });
  });
  describe("a gateway that substitutes the key id or the deployment gets no signature, terminal or not (issue 37)", () => {
    const lying = `dep_${"5e".repeat(16)}`;
    /** The gateway lies consistently: GET /v1/gateway and every challenge name `lying`. */
    const lieAboutDeployment = () => {
      fake.rewrite(route("GET", "/v1/gateway"), (g) => ({ ...g, deployment: lying }));
      fake.rewrite(route("POST", challengePath), (c) => ({
        ...c,
        message: { ...c.message, deployment: lying },
      }));
      fake.rewrite(route("POST", /\/key-bindings\/challenge$/), (c) => ({
        ...c,
        message: { ...c.message, deployment: lying },
      }));
    };
    /** The CLI in this process, as a terminal would run it: every question answered yes. */
    const atTerminal = async (
      run: typeof runPermitCommand,
      args: string[],
      runEnv: NodeJS.ProcessEnv,
    ) => {
      const lines: string[] = [];
      const questions: string[] = [];
      const code = await run(args, runEnv, {
        log: (line) => lines.push(line),
        error: (line) => lines.push(line),
        ask: async (question) => {
          questions.push(question);
          return true;
        },
      });
      return { code, lines, questions };
    };
    const gatewaySays = `the gateway's GET /v1/gateway differs at deployment: expected ${"DEP"}, got ${lying}; nothing was signed`;

    it("authorize: another key id in the challenge, no --key-id: refused (the id is derived), terminal or not", async () => {
      fake.rewrite(route("POST", challengePath), (c) => ({
        ...c,
        message: { ...c.message, keyId: other.id },
      }));
      const expected = `the gateway's challenge differs at message.keyId: expected ${app.id}, got ${other.id}; nothing was signed`;
      const script = await cli(["permit", "authorize", "--permit", permitId()]);
      expect(script.code).toBe(1);
      expect(script.stderr).toBe(`${expected}\n`);
      const terminal = await atTerminal(
        runPermitCommand,
        ["authorize", "--permit", permitId()],
        env({ GATEWAY_DEPLOYMENT_ID: "" }),
      );
      expect(terminal).toEqual({ code: 1, lines: [expected], questions: [] });
      await nothingSigned("/v1/permit-authorizations");
      expect(await heldBy(other.key)).toEqual([]);
    });

    it("authorize: another deployment, pinned: refused before any challenge, terminal or not", async () => {
      lieAboutDeployment();
      const script = await cli(["permit", "authorize", "--permit", permitId()]);
      expect(script.code).toBe(1);
      expect(script.stderr).toBe(`${gatewaySays.replace("DEP", deployment)}\n`);
      const terminal = await atTerminal(
        runPermitCommand,
        ["authorize", "--permit", permitId(), "--deployment", deployment],
        env({ GATEWAY_DEPLOYMENT_ID: "" }),
      );
      expect(terminal).toEqual({
        code: 1,
        lines: [gatewaySays.replace("DEP", deployment)],
        questions: [],
      });
      expect(fake.received.map((r) => `${r.method} ${r.path}`)).toEqual([
        "GET /v1/gateway",
        "GET /v1/gateway",
      ]);
      await nothingSigned("/v1/permit-authorizations");
    });

    it("without a terminal and without a pinned deployment, nothing is sent or signed (exit 2), --yes or not", async () => {
      lieAboutDeployment();
      const unpinned = env({ GATEWAY_DEPLOYMENT_ID: "" });
      for (const args of [
        ["permit", "authorize", "--permit", permitId()],
        ["permit", "authorize", "--permit", permitId(), "--yes"],
        ["provider", "bind-key", chatOffer],
        ["permit", "revoke", "--key", other.id],
        ["permit", "authorizations"],
      ]) {
        const run = await cli(args, unpinned);
        expect(run.code, args.join(" ")).toBe(2);
        expect(run.stderr).toBe(
          `${args[1] === "bind-key" ? "bind-key" : args[1]} signs for a gateway deployment; with no one to confirm it (stdin is not a terminal, or --yes) it must be pinned: pass --deployment DEPLOYMENT_ID or set GATEWAY_DEPLOYMENT_ID (the id the gateway's operator published; GET /v1/gateway answers it); nothing was sent or signed\n`,
        );
      }
      expect(fake.received).toEqual([]);
    });

    it("at a terminal without a pin, the deployment is shown as not pinned before the question", async () => {
      const terminal = await atTerminal(
        runPermitCommand,
        ["authorize", "--permit", permitId(), "--expires-in", "1d"],
        env({ GATEWAY_DEPLOYMENT_ID: "" }),
      );
      expect(terminal.code).toBe(0);
      expect(terminal.questions).toEqual(["sign it? [y/N] "]);
      expect(terminal.lines).toContain(
        `  deployment   ${deployment} (GET /v1/gateway: not pinned)`,
      );
    });

    it("bind-key and the payer's revoke --key: another deployment, pinned: refused, terminal or not", async () => {
      lieAboutDeployment();
      const bind = await cli(["provider", "bind-key", chatOffer]);
      expect(bind.code).toBe(1);
      expect(bind.stderr).toBe(`${gatewaySays.replace("DEP", deployment)}\n`);
      const bindAtTerminal = await atTerminal(runProviderCommand, ["bind-key", chatOffer], env());
      expect(bindAtTerminal).toEqual({
        code: 1,
        lines: [gatewaySays.replace("DEP", deployment)],
        questions: [],
      });
      const revoke = await cli(["permit", "revoke", "--key", other.id]);
      expect(revoke.code).toBe(1);
      expect(revoke.stderr).toBe(`${gatewaySays.replace("DEP", deployment)}\n`);
      expect(fake.signaturesReceived()).toEqual([]);
      expect(fake.received.every((r) => r.path === "/v1/gateway")).toBe(true);
    });
  });
});

import { randomBytes } from "node:crypto";
import { deploymentId } from "../../src/adapters/pg/permit-authorizations.js";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { encryptKeystoreJsonSync } from "ethers";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Hex } from "viem";
import { createApiKey } from "../../src/adapters/pg/api-keys.js";
import { formatAmount } from "../../src/domain/token-units.js";
import type { FakeUpstream } from "../helpers/fake-upstream.js";
import { auditSecret } from "../helpers/log-audit.js";
import { advanceChainTime, mintCredits } from "../helpers/market.js";
import { closedPort, runGatewayCli, type CliRun } from "../helpers/processes.js";
import { chainPermit, flush, settlingEnv, tokenBalance } from "../helpers/settlement.js";
import { eventually, json, startChatStack, type TestStack } from "../helpers/stack.js";

/**
 * `gateway permit open|balance|close|finalize` (issue 22, item 1): a payer's whole permit
 * lifecycle from the CLI, as real processes against anvil and a gateway, and what the other
 * participants (a key holder, a stranger with a funded key of its own) cannot do with it.
 */

const hash = expect.stringMatching(/^0x[0-9a-f]{64}$/);
const token = 10n ** 18n;
/** The demo market's close grace period (seconds). */
const grace = 3600;

describe("gateway permit: a payer's permit from open to refund", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  // Accounts of their own, so balances here move only by what this suite does.
  let payer: { address: Hex; privateKey: Hex };
  let stranger: { address: Hex; privateKey: Hex };
  let outputs: CliRun[];

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack(settlingEnv));
    payer = stack.anvil.accounts[5]!;
    stranger = stack.anvil.accounts[6]!;
    await mintCredits(stack, payer.address, 1000n * token);
    await mintCredits(stack, stranger.address, 1000n * token);
    outputs = [];
  }, 120_000);
  afterAll(async () => {
    // No output of any run, refused or not, carries a private key.
    for (const run of outputs ?? [])
      for (const key of [payer.privateKey, stranger.privateKey, stack.roles.payer.privateKey]) {
        expect(run.stdout + run.stderr).not.toContain(key.slice(2));
      }
    await fake?.stop();
    await stack?.close();
  });

  /** The chain only; a gateway where the test gives one. */
  const chainEnv = () => ({
    PATH: process.env.PATH ?? "",
    RPC_URL: stack.config.rpcUrl,
    CHAIN_ID: String(stack.config.chainId),
    MARKET_ADDRESS: stack.demo.market,
  });
  const cli = async (args: string[], env: NodeJS.ProcessEnv): Promise<CliRun> => {
    const run = await runGatewayCli(["permit", ...args], env);
    outputs.push(run);
    return run;
  };
  const chat = (key: string, permitId: Hex) =>
    fetch(`${stack.gateway.url}/v1/chat/completions`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${key}`,
        "x-gateway-permit": permitId,
        "content-type": "application/json",
      },
      body: JSON.stringify({
        model: "demo-chat",
        messages: [{ role: "user", content: "hi" }],
        max_tokens: 16,
      }),
    });
  const chainTime = async () => (await stack.clients.publicClient.getBlock()).timestamp;

  it("open, authorize, chat, settle, close, finalize: the refund is deposit minus settled, to the payer's balance exactly", async () => {
    const app = await createApiKey(stack.database.db.pool, "permit cli app");
    auditSecret("api key", app.key);
    const env = {
      ...chainEnv(),
      GATEWAY_URL: stack.gateway.url,
      GATEWAY_API_KEY: app.key,
      PAYER_PRIVATE_KEY: payer.privateKey,
      // No terminal: the deployment is pinned, or nothing is signed (issue 37).
      GATEWAY_DEPLOYMENT_ID: await deploymentId(stack.database.db.pool),
    };
    const startBalance = await tokenBalance(stack, 0, payer.address);

    // The alias resolves through the gateway; the token and the money move on the chain.
    const before = await chainTime();
    const opened = await cli(["open", "chat", "--deposit", "20tokens", "--json"], env);
    expect(opened.stderr).toBe("");
    expect(opened.code).toBe(0);
    const permit = JSON.parse(opened.stdout) as { permit_id: Hex; expires_at: number };
    expect(permit).toEqual({
      permit_id: hash,
      payer: payer.address.toLowerCase(),
      model_id: stack.demo.models[0]!.modelId,
      offer_id: null,
      deposit: (20n * token).toString(),
      expires_at: expect.any(Number),
      credit_token: stack.demo.models[0]!.creditToken.toLowerCase(),
      decimals: 18,
      transactions: { approve: hash, open: hash },
    });
    // Default expiry: 30 days of chain time from the block it read.
    expect(BigInt(permit.expires_at) - before).toBeGreaterThanOrEqual(30n * 86_400n);
    expect(BigInt(permit.expires_at) - before).toBeLessThanOrEqual(30n * 86_400n + 5n);
    const permitId = permit.permit_id;
    const onChain = await chainPermit(stack, permitId);
    expect(onChain).toMatchObject({
      payer: payer.address,
      deposit: 20n * token,
      settled: 0n,
      state: 1,
      expiresAt: BigInt(permit.expires_at),
    });
    expect(await tokenBalance(stack, 0, payer.address)).toBe(startBalance - 20n * token);

    // The key holder cannot spend it before the payer signs for it.
    const refused = await chat(app.key, permitId);
    expect(refused.status).toBe(403);
    expect((await json(refused)).error.code).toBe("permit_not_authorized");

    const authorized = await cli(["authorize", "--permit", permitId], env);
    expect(authorized.stderr).toMatch(/^about to sign AuthorizeKey as the payer /);
    expect(authorized.code).toBe(0);
    const served = await chat(app.key, permitId);
    expect(served.status).toBe(200);
    await served.arrayBuffer();
    const charged = BigInt(served.headers.get("x-gateway-credits-charged")!);
    expect(charged).toBeGreaterThan(0n);

    // The gateway's view with the authorized key: charged, not yet settled.
    let view: Record<string, unknown> = {};
    await eventually(async () => {
      const balance = await cli(["balance", permitId, "--json"], env);
      expect(balance.code).toBe(0);
      view = JSON.parse(balance.stdout) as Record<string, unknown>;
      return view.reserved === "0";
    });
    expect(view).toEqual({
      source: "gateway",
      permit_id: permitId,
      state: "open",
      model_id: stack.demo.models[0]!.modelId,
      offer_id: null,
      payer: payer.address.toLowerCase(),
      expires_at: permit.expires_at,
      closable_at: null,
      deposit: (20n * token).toString(),
      settled: "0",
      charged_unsettled: charged.toString(),
      reserved: "0",
      available: (20n * token - charged).toString(),
    });
    // For a person: every amount in DCHAT, the exact base units beside it (issue 38, item 3).
    const read = await cli(["balance", permitId], env);
    expect(read.code).toBe(0);
    expect(read.stdout).toContain(`  deposit           20 DCHAT (${20n * token} base units)\n`);
    expect(read.stdout).toContain(`  settled           0 DCHAT (0 base units)\n`);
    expect(read.stdout).toContain(
      `  charged_unsettled ${formatAmount(charged, { decimals: 18, symbol: "DCHAT" })} (${charged} base units)\n`,
    );

    const flushed = await flush(stack);
    expect(flushed.status).toBe(200);
    expect(flushed.body.settled_credits).toBe(charged.toString());
    expect((await chainPermit(stack, permitId)).settled).toBe(charged);

    // The key holder cannot close the payer's permit: its own key is not the payer's.
    const keyHolderClose = await cli(["close", permitId], {
      ...env,
      PAYER_PRIVATE_KEY: stranger.privateKey,
    });
    expect(keyHolderClose.code).toBe(1);
    expect(keyHolderClose.stderr).toBe(
      `the chain refused: only the permit's payer (${payer.address}) may request its close; ${stranger.address} is not\n`,
    );
    expect((await chainPermit(stack, permitId)).state).toBe(1);

    const closed = await cli(["close", permitId, "--json"], env);
    expect(closed.stderr).toBe("");
    expect(closed.code).toBe(0);
    const closing = JSON.parse(closed.stdout) as { closable_at: number; tx: Hex };
    const closeBlock = await stack.clients.publicClient.getTransactionReceipt({ hash: closing.tx });
    const closeTime = (
      await stack.clients.publicClient.getBlock({ blockNumber: closeBlock.blockNumber })
    ).timestamp;
    expect(closing).toEqual({
      permit_id: permitId,
      state: "closing",
      closable_at: Number(closeTime) + grace,
      tx: hash,
    });
    expect((await chainPermit(stack, permitId)).closableAt).toBe(BigInt(closing.closable_at));

    // Before the grace period ends, the chain refuses and the CLI says until when.
    const early = await cli(["finalize", permitId], env);
    expect(early.code).toBe(1);
    expect(early.stderr).toBe(
      `the chain refused: the close grace period of permit ${permitId} ends at ${closing.closable_at} (${new Date(closing.closable_at * 1000).toISOString()}): finalize after it\n`,
    );
    expect((await chainPermit(stack, permitId)).state).toBe(2);

    await advanceChainTime(stack, grace);
    const beforeRefund = await tokenBalance(stack, 0, payer.address);
    const finalized = await cli(["finalize", permitId, "--json"], env);
    expect(finalized.stderr).toBe("");
    expect(finalized.code).toBe(0);
    expect(JSON.parse(finalized.stdout)).toEqual({
      permit_id: permitId,
      state: "closed",
      payer: payer.address.toLowerCase(),
      deposit: (20n * token).toString(),
      settled: charged.toString(),
      refund: (20n * token - charged).toString(),
      tx: hash,
    });
    expect((await tokenBalance(stack, 0, payer.address)) - beforeRefund).toBe(
      20n * token - charged,
    );
    // Over the whole lifecycle the payer paid exactly what settled.
    expect(await tokenBalance(stack, 0, payer.address)).toBe(startBalance - charged);

    // A closed permit is spent by no one.
    const afterClose = await chat(app.key, permitId);
    expect(afterClose.status).toBe(402);
    await afterClose.arrayBuffer();
  }, 180_000);

  it("a stranger cannot close someone's permit, and finalizing it for them refunds the payer, never the stranger", async () => {
    const env = { ...chainEnv(), PAYER_PRIVATE_KEY: payer.privateKey };
    const strangerEnv = { ...chainEnv(), PAYER_PRIVATE_KEY: stranger.privateKey };
    // A model id needs no gateway.
    const opened = await cli(
      ["open", stack.demo.models[0]!.modelId, "--deposit", "3000000", "--expires-in", "2h"],
      env,
    );
    expect(opened.stderr).toBe("");
    expect(opened.code).toBe(0);
    const permitId = /^opened permit (0x[0-9a-f]{64})$/m.exec(opened.stdout)![1] as Hex;
    expect(opened.stdout).toContain(`  deposit    0.000000000003 DCHAT (3000000 base units)\n`);
    expect(opened.stdout).toContain(`next: let an API key spend it: gateway permit authorize`);

    const refused = await cli(["close", permitId], strangerEnv);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(/^the chain refused: only the permit's payer/);
    // Finalizing is no way around it: the permit is open, the chain refuses.
    const notClosing = await cli(["finalize", permitId], strangerEnv);
    expect(notClosing.code).toBe(1);
    expect(notClosing.stderr).toBe(
      `the chain refused: permit ${permitId} is open: request its close first (gateway permit close ${permitId})\n`,
    );
    expect((await chainPermit(stack, permitId)).state).toBe(1);

    expect((await cli(["close", permitId], env)).code).toBe(0);
    const again = await cli(["close", permitId], env);
    expect(again.code).toBe(1);
    expect(again.stderr).toBe(`the chain refused: permit ${permitId} is already closing\n`);
    await advanceChainTime(stack, grace);
    const payerBefore = await tokenBalance(stack, 0, payer.address);
    const strangerBefore = await tokenBalance(stack, 0, stranger.address);
    // The market lets anyone finalize once the grace is over (a keeper may); the refund goes to
    // the payer whoever sends it.
    const finalized = await cli(["finalize", permitId], strangerEnv);
    expect(finalized.stderr).toBe("");
    expect(finalized.code).toBe(0);
    expect(finalized.stdout).toBe(
      `closed permit ${permitId}: refunded 0.000000000003 DCHAT (3000000 base units) to the payer ${payer.address}\n` +
        `  deposit 0.000000000003 DCHAT (3000000 base units), settled 0 DCHAT (0 base units) (sent by ${stranger.address}, not the payer: the refund went to the payer)\n` +
        `  tx ${/ {2}tx (0x[0-9a-f]{64})/.exec(finalized.stdout)![1]}\n`,
    );
    expect((await tokenBalance(stack, 0, payer.address)) - payerBefore).toBe(3_000_000n);
    expect(await tokenBalance(stack, 0, stranger.address)).toBe(strangerBefore);
    const twice = await cli(["finalize", permitId], env);
    expect(twice.code).toBe(1);
    expect(twice.stderr).toBe(`the chain refused: permit ${permitId} is already closed\n`);
  }, 180_000);

  it("converts whole tokens exactly by the token's decimals (a key or a keystore signs) and refuses a finer fraction before sending anything", async () => {
    const env = { ...chainEnv(), PAYER_PRIVATE_KEY: payer.privateKey };
    const modelId = stack.demo.models[0]!.modelId;
    const deposits: [string[], bigint][] = [
      [["--deposit", "12.5", "--tokens"], 12_500_000_000_000_000_000n],
      [["--deposit", "0.000000000000000001tokens"], 1n],
      [["--deposit", "123456789.123456789123456789tokens"], 123_456_789_123_456_789_123_456_789n],
    ];
    await mintCredits(stack, payer.address, 123_456_790n * token);
    for (const [args, expected] of deposits) {
      const opened = await cli(["open", modelId, ...args, "--json"], env);
      expect(opened.stderr).toBe("");
      expect(opened.code).toBe(0);
      const { permit_id, deposit } = JSON.parse(opened.stdout) as {
        permit_id: Hex;
        deposit: string;
      };
      expect(deposit).toBe(expected.toString());
      expect((await chainPermit(stack, permit_id)).deposit).toBe(expected);
    }

    // The payer's key from an encrypted keystore, as `authorize` takes it.
    const dir = await mkdtemp(join(tmpdir(), "gw-permit-open-"));
    try {
      const password = randomBytes(8).toString("hex");
      const keystore = join(dir, "payer.json");
      await writeFile(
        keystore,
        encryptKeystoreJsonSync(payer, password, { scrypt: { N: 1 << 10 } }),
      );
      const fromKeystore = await cli(
        ["open", modelId, "--deposit", "2tokens", "--keystore", keystore, "--json"],
        { ...chainEnv(), KEYSTORE_PASSWORD: password },
      );
      expect(fromKeystore.stderr).toBe("");
      expect(JSON.parse(fromKeystore.stdout)).toMatchObject({
        payer: payer.address.toLowerCase(),
        deposit: (2n * token).toString(),
      });
    } finally {
      await rm(dir, { recursive: true, force: true });
    }

    const nonce = await stack.clients.publicClient.getTransactionCount({ address: payer.address });
    const finer = await cli(["open", modelId, "--deposit", "1.0000000000000000001tokens"], env);
    expect(finer.code).toBe(2);
    expect(finer.stderr).toMatch(
      /^--deposit 1\.0000000000000000001tokens: the token has 18 decimals, so at most 18 fractional digits\n/,
    );
    const fraction = await cli(["open", modelId, "--deposit", "1.5"], env);
    expect(fraction.code).toBe(2);
    expect(fraction.stderr).toMatch(/^--deposit in base units is a whole number/);
    expect(await stack.clients.publicClient.getTransactionCount({ address: payer.address })).toBe(
      nonce,
    );
  }, 180_000);

  it("refuses what the chain refuses, and what cannot be right, in one line with the exit code", async () => {
    const env = { ...chainEnv(), PAYER_PRIVATE_KEY: payer.privateKey };
    const modelId = stack.demo.models[0]!.modelId;
    const nonce = () => stack.clients.publicClient.getTransactionCount({ address: payer.address });
    const sent = await nonce();
    const taken = await cli(
      ["open", modelId, "--deposit", "1000", "--id", stack.demo.permitId],
      env,
    );
    expect(taken.code).toBe(1);
    expect(taken.stderr).toBe(
      `the chain refused: a permit with id ${stack.demo.permitId} already exists\n`,
    );
    // An offer of the other model.
    const coderOffer = stack.demo.offers.find((o) => o.modelId !== modelId)!.offerId;
    const mismatch = await cli(["open", modelId, "--deposit", "1000", "--offer", coderOffer], env);
    expect(mismatch.code).toBe(1);
    expect(mismatch.stderr).toBe(
      `the chain refused: offer ${coderOffer} does not serve model ${modelId}\n`,
    );
    const poor = await cli(["open", modelId, "--deposit", "1000"], {
      ...env,
      PAYER_PRIVATE_KEY: stack.anvil.accounts[8]!.privateKey,
    });
    expect(poor.code).toBe(1);
    expect(poor.stderr).toBe(
      "the chain refused: the payer holds 0 base units of the credit token, the deposit is 1000\n",
    );
    const past = await cli(["open", modelId, "--deposit", "1000", "--expires-at", "1000"], env);
    expect(past.code).toBe(1);
    expect(past.stderr).toMatch(/^the chain refused: the market refused the permit: .*expiry/);
    // A permit the market would refuse costs the payer no approval first.
    expect(await nonce()).toBe(sent);
    const unknown = await cli(["close", `0x${"ab".repeat(32)}`], env);
    expect(unknown.code).toBe(1);
    expect(unknown.stderr).toBe(
      `the chain refused: no permit 0x${"ab".repeat(32)} on the market\n`,
    );

    // A chain that does not answer: one line, without the RPC URL (it may carry a provider's key).
    const silent = `http://127.0.0.1:${await closedPort()}/secret-rpc-key`;
    const down = await cli(["balance", stack.demo.permitId], { ...chainEnv(), RPC_URL: silent });
    expect(down.code).toBe(1);
    expect(down.stderr).toBe("the chain call failed: HTTP request failed.\n");

    // Usage: exit 2, the problem first, the usage after it.
    const usage: [string[], NodeJS.ProcessEnv, RegExp][] = [
      [["open", modelId], env, /^--deposit AMOUNT is required\n\nusage: gateway permit/],
      [["open", "chat", "--deposit", "1"], env, /^'chat' is not a model id .* needs GATEWAY_URL/],
      [["close", "0x12"], env, /^a permit id \(0x \+ 64 hex digits\) is required/],
      [["close", stack.demo.permitId], chainEnv(), /^set PAYER_PRIVATE_KEY or pass --keystore/],
      [
        ["close", stack.demo.permitId],
        { ...env, MARKET_ADDRESS: "" },
        /^MARKET_ADDRESS is required/,
      ],
      [
        ["close", stack.demo.permitId],
        { ...env, CHAIN_ID: "1" },
        /^RPC_URL serves chain \d+, CHAIN_ID says 1\n$/,
      ],
      [["open", modelId, "--deposit", "1", "--expires-in", "soon"], env, /^--expires-in must be/],
      [["frobnicate"], env, /^unknown permit command 'frobnicate'/],
    ];
    for (const [args, runEnv, message] of usage) {
      const run = await cli(args, runEnv);
      expect(run.code, args.join(" ")).toBe(2);
      expect(run.stderr).toMatch(message);
    }
    // Flags stand in for the environment.
    const flagged = await cli(
      [
        "balance",
        stack.demo.permitId,
        "--rpc-url",
        stack.config.rpcUrl,
        "--market",
        stack.demo.market,
        "--chain-id",
        String(stack.config.chainId),
        "--json",
      ],
      { PATH: process.env.PATH ?? "" },
    );
    expect(flagged.code).toBe(0);
    expect(JSON.parse(flagged.stdout)).toMatchObject({
      source: "chain",
      permit_id: stack.demo.permitId,
    });
  }, 180_000);

  it("balance: the gateway's view for an authorized key, refused for another key, the chain's without one", async () => {
    const permitId = stack.demo.permitId;
    const other = await createApiKey(stack.database.db.pool, "permit cli other");
    auditSecret("api key", other.key);
    const refused = await cli(["balance", permitId], {
      ...chainEnv(),
      GATEWAY_URL: stack.gateway.url,
      GATEWAY_API_KEY: other.key,
    });
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(/^the gateway refused \(403 permit_not_authorized\)/);

    const authorized = await cli(["balance", permitId], {
      ...chainEnv(),
      GATEWAY_URL: stack.gateway.url,
      GATEWAY_API_KEY: stack.apiKey,
    });
    expect(authorized.code).toBe(0);
    expect(authorized.stdout).toMatch(
      new RegExp(`^permit ${permitId} \\(open\\), as the gateway accounts for it\n`),
    );
    expect(authorized.stdout).toContain(`  available         `);

    const fromChain = await cli(["balance", permitId, "--json"], chainEnv());
    expect(fromChain.code).toBe(0);
    const onChain = await chainPermit(stack, permitId);
    expect(JSON.parse(fromChain.stdout)).toEqual({
      source: "chain",
      permit_id: permitId,
      state: "open",
      model_id: stack.demo.models[0]!.modelId,
      offer_id: null,
      payer: stack.roles.payer.address.toLowerCase(),
      expires_at: Number(onChain.expiresAt),
      closable_at: null,
      deposit: stack.demo.permitDeposit.toString(),
      settled: onChain.settled.toString(),
    });
    const text = await cli(["balance", permitId], chainEnv());
    expect(text.stdout).toMatch(
      /read from the chain: no GATEWAY_API_KEY, so charges not yet settled/,
    );
  }, 180_000);
});

import { spawn, type ChildProcess } from "node:child_process";
import { deploymentId } from "../../src/adapters/pg/permit-authorizations.js";
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import type { DevManifest } from "../../src/dev/sandbox.js";
import { encryptKeystoreJsonSync, verifyTypedData } from "ethers";
import { createApiKey } from "../../src/adapters/pg/api-keys.js";
import { openDatabase } from "../../src/adapters/pg/database.js";
import { markPaymentsFailed } from "../../src/adapters/pg/x402.js";
import type { FakeUpstream } from "../helpers/fake-upstream.js";
import { startSettlementFixture, type SettlementFixture } from "../helpers/settlement-fixture.js";
import { auditChildLogs, auditSecret } from "../helpers/log-audit.js";
import { closedPort, gatewayCli, runGatewayCli } from "../helpers/processes.js";
import { eventually, json, startChatStack, type TestStack } from "../helpers/stack.js";

const run = promisify(execFile);
const cli = gatewayCli;

function exited(child: ChildProcess): Promise<number | null> {
  return new Promise((resolve) => {
    if (child.exitCode !== null) resolve(child.exitCode);
    else child.once("exit", (code) => resolve(code));
  });
}

describe("npm start (gateway dev)", () => {
  const dirs: string[] = [];
  afterAll(async () => {
    for (const dir of dirs) await rm(dir, { recursive: true, force: true });
  });

  it("writes the manifest within 60 s, serves the demo market, and stops everything on SIGTERM", async () => {
    const stateDir = await mkdtemp(join(tmpdir(), "gw-dev-"));
    dirs.push(stateDir);
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      PORT: "0",
      GATEWAY_STATE_DIR: stateDir,
      LOG_LEVEL: "warn",
    };
    delete env.DATABASE_URL;
    const child = spawn(process.execPath, [...cli, "dev"], {
      env,
      stdio: ["ignore", "pipe", "pipe"],
    });
    auditChildLogs(child, "gateway dev");
    let output = "";
    child.stdout.on("data", (d: Buffer) => (output += d.toString()));
    child.stderr.on("data", (d: Buffer) => (output += d.toString()));
    try {
      let manifest: DevManifest | undefined;
      await eventually(
        async () => {
          if (child.exitCode !== null) throw new Error(`dev exited early:\n${output}`);
          try {
            manifest = JSON.parse(
              await readFile(join(stateDir, "dev.json"), "utf8"),
            ) as DevManifest;
            return true;
          } catch {
            return false;
          }
        },
        60_000,
        250,
      );
      const m = manifest!;
      auditSecret("api key", m.apiKey);
      auditSecret("operator token", m.settlementOperatorToken);
      auditSecret("private key", m.payer.privateKey);
      for (const key of [
        "baseUrl",
        "grpcUrl",
        "apiKey",
        "rpcUrl",
        "chainId",
        "marketAddress",
        "settlementOperatorToken",
        "models",
        "offers",
        "payer",
        "operator",
        "permitId",
        "settlement",
        "receiptSigner",
      ]) {
        expect(m).toHaveProperty(key);
      }
      expect(m.models.length).toBeGreaterThanOrEqual(2);
      expect(m.offers).toHaveLength(3);
      expect(m.offers.filter((o) => o.status === "paused")).toHaveLength(1);
      expect(m.payer.privateKey).toMatch(/^0x[0-9a-f]{64}$/);

      expect((await fetch(`${m.baseUrl}/health`)).status).toBe(200);
      const models = await fetch(`${m.baseUrl}/v1/models`, {
        headers: { authorization: `Bearer ${m.apiKey}` },
      });
      expect(models.status).toBe(200);
      const body = (await json(models)) as { data: { id: string }[] };
      expect(body.data.map((x) => x.id).sort()).toEqual(m.models.map((x) => x.id).sort());
      await eventually(async () => output.includes("curl"), 5000);
      expect(output).toContain(`${m.baseUrl}/v1/models`);
      expect(output).toContain(`Console: ${m.baseUrl}/console`);
      expect(m.settlement).toEqual({
        account: expect.stringMatching(/^0x[0-9a-fA-F]{40}$/),
        workerIntervalMs: 2000,
        flushUrl: `${m.baseUrl}/settlements/flush`,
      });
      expect(output).toContain(`curl -s -X POST ${m.settlement.flushUrl}`);
      expect(output).toContain(`${m.baseUrl}/v1/requests/$REQUEST_ID`);
      // How to let another key spend the demo payer's permits.
      expect(output).toContain(
        `RPC_URL=${m.rpcUrl} MARKET_ADDRESS=${m.marketAddress} GATEWAY_URL=${m.baseUrl} GATEWAY_API_KEY=`,
      );
      expect(output).toContain("npm run gateway -- permit authorize");
      // The CLI reaches the sandbox over gRPC with the manifest's token; the sandbox settles from
      // the demo market's settlement account.
      const reconciled = await runCli(["settle", "reconcile"], {
        PATH: process.env.PATH ?? "",
        GATEWAY_URL: m.grpcUrl,
        SETTLEMENT_OPERATOR_TOKEN: m.settlementOperatorToken,
      });
      expect(reconciled.stderr).toBe("");
      expect(reconciled.code).toBe(0);
      expect((JSON.parse(reconciled.stdout) as { account: string }).account.toLowerCase()).toBe(
        m.settlement.account.toLowerCase(),
      );
      // The sandbox's own worker settles a chat request without anyone calling flush.
      const chat = await fetch(`${m.baseUrl}/v1/chat/completions`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${m.apiKey}`,
          "x-gateway-permit": m.permitId,
          "content-type": "application/json",
        },
        body: JSON.stringify({
          model: m.models[0]!.id,
          messages: [{ role: "user", content: "hi" }],
        }),
      });
      expect(chat.status).toBe(200);
      await chat.arrayBuffer();
      const requestId = chat.headers.get("x-gateway-request-id")!;
      let settlement: { status: string; tx_hash: string | null } | undefined;
      await eventually(
        async () => {
          const record = await fetch(`${m.baseUrl}/v1/requests/${requestId}`, {
            headers: { authorization: `Bearer ${m.apiKey}` },
          });
          settlement = ((await json(record)) as { settlement: typeof settlement }).settlement;
          return settlement?.status === "settled";
        },
        20_000,
        250,
      );
      expect(settlement?.tx_hash).toMatch(/^0x[0-9a-f]{64}$/);
      // The sandbox signs usage receipts with a key of its run; /v1/gateway publishes its
      // address, the manifest names it, and the chat's receipt verifies to it.
      const facts = (await json(await fetch(`${m.baseUrl}/v1/gateway`))) as {
        receipt_signer: string;
      };
      expect(facts.receipt_signer).toBe(m.receiptSigner);
      expect(output).toContain(`${m.baseUrl}/v1/requests/$REQUEST_ID/receipt`);
      const signed = (await json(
        await fetch(`${m.baseUrl}/v1/requests/${requestId}/receipt`, {
          headers: { authorization: `Bearer ${m.apiKey}` },
        }),
      )) as {
        receipt: {
          domain: Record<string, unknown>;
          types: Record<string, { name: string; type: string }[]>;
          message: Record<string, unknown>;
        };
        signature: string;
      };
      const { EIP712Domain: _domain, ...types } = signed.receipt.types;
      expect(
        verifyTypedData(signed.receipt.domain, types, signed.receipt.message, signed.signature),
      ).toBe(m.receiptSigner);

      // The printed command opens a second permit as the demo payer (its key read from the
      // manifest, never printed), and the demo key spends it at once.
      const openLine = output.split("\n").find((line) => line.includes(" permit open "));
      expect(openLine).toBeDefined();
      expect(output).not.toContain(m.payer.privateKey.slice(2));
      const opened = await run("bash", ["-c", `${openLine!.trim()} --json`], {
        env: { ...process.env, npm_config_loglevel: "silent" },
      });
      const second = JSON.parse(opened.stdout.slice(opened.stdout.indexOf("{"))) as {
        permit_id: string;
        payer: string;
        deposit: string;
      };
      expect(second).toMatchObject({
        payer: m.payer.address.toLowerCase(),
        model_id: m.models[0]!.modelId,
        deposit: (10n * 10n ** 18n).toString(),
      });
      const onSecond = await fetch(`${m.baseUrl}/v1/chat/completions`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${m.apiKey}`,
          "x-gateway-permit": second.permit_id,
          "content-type": "application/json",
        },
        body: JSON.stringify({
          model: m.models[0]!.id,
          messages: [{ role: "user", content: "hi" }],
        }),
      });
      expect(onSecond.status).toBe(200);
      await onSecond.arrayBuffer();

      // The printed agent example (issue 37, item 7), run as it is: an unmodified x402 client
      // pays per request as the demo payer, with no API key and no permit.
      const lines = output.split("\n");
      const from = lines.findIndex((line) =>
        line.startsWith("An agent pays per request with x402"),
      );
      expect(from).toBeGreaterThan(-1);
      const example = lines.slice(from + 2, from + 12).map((line) => line.slice(2));
      expect(example.length).toBe(10);
      const script = join(process.cwd(), `.agent-example-${process.pid}.mjs`);
      await writeFile(script, `${example.join("\n")}\n`);
      try {
        const paid = await run(process.execPath, [script]);
        expect(paid.stdout).toMatch(/^200 \d+ /);
      } finally {
        await rm(script, { force: true });
      }

      child.kill("SIGTERM");
      expect(await exited(child)).toBe(0);
      // anvil went with it: its RPC port no longer answers.
      const rpc = await fetch(m.rpcUrl, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "eth_chainId", params: [] }),
      }).catch((error: unknown) => error);
      expect(rpc).toBeInstanceOf(Error);
    } finally {
      if (child.exitCode === null) child.kill("SIGKILL");
    }
  });

  it("migrates the database, and manages API keys: create prints the key once, list never shows it, revoke disables it", async () => {
    const stateDir = await mkdtemp(join(tmpdir(), "gw-keys-"));
    dirs.push(stateDir);
    const env: NodeJS.ProcessEnv = { ...process.env, GATEWAY_STATE_DIR: stateDir };
    delete env.DATABASE_URL;
    // `gateway migrate` makes the database current.
    const migrated = await run(process.execPath, [...cli, "migrate"], { env });
    expect(migrated.stdout).toBe("database is up to date\n");
    const created = await run(process.execPath, [...cli, "keys", "create", "--name", "ci"], {
      env,
    });
    const key = /gw_[0-9A-Za-z]{40}/.exec(created.stdout)?.[0];
    expect(key).toBeDefined();
    const id = /key_[0-9a-f]+/.exec(created.stdout)?.[0];
    const listed = await run(process.execPath, [...cli, "keys", "list"], { env });
    expect(listed.stdout).toContain(id!);
    expect(listed.stdout).toContain("active");
    expect(listed.stdout).not.toContain(key!);
    await run(process.execPath, [...cli, "keys", "revoke", id!], { env });
    const after = await run(process.execPath, [...cli, "keys", "list"], { env });
    expect(after.stdout).toMatch(/revoked/);
    const unknown = await run(process.execPath, [...cli, "keys", "revoke", "key_nope"], {
      env,
    }).catch((e: { code: number }) => e);
    expect((unknown as { code: number }).code).toBe(1);
  }, 120_000);

  it("x402: lists the payers refused since a settlement failed, and clears one (on the database every process reads)", async () => {
    const stateDir = await mkdtemp(join(tmpdir(), "gw-x402-"));
    dirs.push(stateDir);
    const env: NodeJS.ProcessEnv = { ...process.env, GATEWAY_STATE_DIR: stateDir };
    delete env.DATABASE_URL;
    const none = await run(process.execPath, [...cli, "x402", "blocked"], { env });
    expect(none.stdout).toBe("no payer is refused x402 payments\n");
    // A failed settlement blocked a payer (the settlement's own marking, as the worker does it).
    const payer = "0x00000000000000000000000000000000000a11ce";
    const permitId = `0x${"42".repeat(32)}`;
    const db = await openDatabase({ dataDir: join(stateDir, "pgdata") });
    try {
      await db.pool.query(
        `INSERT INTO x402_payments (payer, nonce, permit_id, token, signed_amount, maximum, deadline, payload, created_at)
         VALUES ($1, 7, $2, '0xtoken', 10, 10, 1900000000, '{}', 1800000000)`,
        [payer, permitId],
      );
      const client = await db.pool.connect();
      try {
        await markPaymentsFailed(
          client,
          [{ permitId, reason: "payment_failed: TRANSFER_FROM_FAILED" }],
          1_800_000_100,
        );
      } finally {
        client.release();
      }
    } finally {
      await db.close();
    }
    const blocked = await run(process.execPath, [...cli, "x402", "blocked"], { env });
    expect(blocked.stdout).toBe(
      `${payer}\t${new Date(1_800_000_100_000).toISOString()}\t${permitId}\tpayment_failed: TRANSFER_FROM_FAILED\n`,
    );
    const cleared = await run(
      process.execPath,
      [...cli, "x402", "clear", "0x00000000000000000000000000000000000A11CE"],
      { env },
    );
    expect(cleared.stdout).toBe(`cleared ${payer}: it may pay with x402 again\n`);
    expect((await run(process.execPath, [...cli, "x402", "blocked"], { env })).stdout).toBe(
      "no payer is refused x402 payments\n",
    );
    const again = await run(process.execPath, [...cli, "x402", "clear", payer], { env }).catch(
      (e: { code: number; stderr: string }) => e,
    );
    expect(again).toMatchObject({ code: 1, stderr: `${payer} is not refused x402 payments\n` });
    const bad = await run(process.execPath, [...cli, "x402", "clear", "nobody"], { env }).catch(
      (e: { code: number; stderr: string }) => e,
    );
    expect((bad as { code: number }).code).toBe(2);
  }, 120_000);

  it("refuses bad configuration with every problem named", async () => {
    const env = { PATH: process.env.PATH ?? "", CHAIN_ID: "x" };
    const result = await run(process.execPath, [...cli, "serve"], { env }).catch(
      (e: { code: number; stderr: string }) => e,
    );
    const failure = result as { code: number; stderr: string };
    expect(failure.code).toBe(2);
    expect(failure.stderr).toMatch(/RPC_URL is required/);
    expect(failure.stderr).toMatch(/MARKET_ADDRESS is required/);
    expect(failure.stderr).toMatch(/CHAIN_ID must be/);
  });
});

const runCli = runGatewayCli;

describe("gateway settle (gRPC client of SettlementService)", () => {
  const token = `op_${randomBytes(16).toString("hex")}`;
  let fixture: SettlementFixture;
  let env: NodeJS.ProcessEnv;

  beforeEach(async () => {
    fixture = await startSettlementFixture(token);
    env = {
      PATH: process.env.PATH ?? "",
      GATEWAY_URL: fixture.url,
      SETTLEMENT_OPERATOR_TOKEN: token,
    };
  });
  afterEach(async () => {
    await fixture.close();
  });

  it("runs the worker: flushes with the token on the interval and exits 0 on SIGTERM", async () => {
    const child = spawn(process.execPath, [...cli, "settle"], {
      env: { ...env, SETTLE_INTERVAL_MS: "200", SETTLE_MAX_REQUESTS: "50", LOG_LEVEL: "debug" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    auditSecret("operator token", token);
    auditChildLogs(child, "gateway settle");
    let output = "";
    child.stdout.on("data", (d: Buffer) => (output += d.toString()));
    child.stderr.on("data", (d: Buffer) => (output += d.toString()));
    try {
      await eventually(
        async () => {
          if (child.exitCode !== null) throw new Error(`settle exited early:\n${output}`);
          return fixture.calls.length >= 2;
        },
        30_000,
        50,
      );
      for (const call of fixture.calls) {
        expect(call).toMatchObject({ method: "flush", protocol: "grpc" });
        expect(call.authorization).toBe(`Bearer ${token}`);
        expect(call.request?.maxRequests).toBe(50);
      }
      await eventually(async () => output.includes("settlement batch"), 5000);
      const stopping = Date.now();
      child.kill("SIGTERM");
      expect(await exited(child)).toBe(0);
      expect(Date.now() - stopping).toBeLessThan(5000);
      expect(output).toContain("settlement worker stopped");
      expect(output).not.toContain(token);
    } finally {
      if (child.exitCode === null) child.kill("SIGKILL");
    }
  });

  it("refuses to start without a token (exit 2, usage on stderr)", async () => {
    const result = await runCli(["settle"], { PATH: env.PATH, GATEWAY_URL: fixture.url });
    expect(result.code).toBe(2);
    expect(result.stderr).toMatch(/SETTLEMENT_OPERATOR_TOKEN is required/);
    expect(result.stderr).toMatch(/usage: gateway settle/);
    const bad = await runCli(["settle"], { ...env, SETTLE_INTERVAL_MS: "soon" });
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/SETTLE_INTERVAL_MS must be/);
    expect((await runCli(["settle", "nope"], env)).code).toBe(2);
    expect(fixture.calls).toHaveLength(0);
  });

  it("reconcile prints the answer as JSON and exits 0 without drift", async () => {
    const result = await runCli(["settle", "reconcile"], env);
    expect(result.code).toBe(0);
    const body = JSON.parse(result.stdout) as Record<string, unknown>;
    expect(body).toEqual({
      permits: [],
      offers: [],
      drift: false,
      account: `0x${"11".repeat(20)}`,
    });
    expect(fixture.calls).toMatchObject([
      { method: "reconcile", authorization: `Bearer ${token}` },
    ]);
  });

  it("reconcile exits 1 on drift, still prints the JSON, and names what drifts on stderr", async () => {
    const permitId = `0x${"aa".repeat(32)}`;
    const offerId = `0x${"bb".repeat(32)}`;
    fixture.reconcileAnswer = {
      account: `0x${"11".repeat(20)}`,
      drift: true,
      permits: [
        {
          permitId,
          gatewaySettled: "100",
          ledgerSettled: "100",
          chainSettled: "90",
          unsettleable: "0",
          drift: true,
        },
        {
          permitId: `0x${"cc".repeat(32)}`,
          gatewaySettled: "5",
          ledgerSettled: "5",
          chainSettled: "5",
          unsettleable: "0",
          drift: false,
        },
      ],
      offers: [{ offerId, gatewayPaid: "100", chainPaid: "90", drift: true }],
    };
    const result = await runCli(["settle", "reconcile"], env);
    expect(result.code).toBe(1);
    const body = JSON.parse(result.stdout) as {
      drift: boolean;
      permits: { permitId: string; chainSettled: string; drift: boolean }[];
    };
    expect(body.drift).toBe(true);
    expect(body.permits[0]).toMatchObject({ permitId, chainSettled: "90", drift: true });
    expect(result.stderr).toContain(permitId);
    expect(result.stderr).toContain(offerId);
    expect(result.stderr).not.toContain(`0x${"cc".repeat(32)}`);
  });

  it("flush sends --dry-run and --max-requests and prints the answer", async () => {
    const result = await runCli(["settle", "flush", "--dry-run", "--max-requests", "7"], env);
    expect(result.code).toBe(0);
    expect(fixture.calls[0]?.request).toMatchObject({ dryRun: true, maxRequests: 7 });
    const body = JSON.parse(result.stdout) as Record<string, unknown>;
    expect(body).toMatchObject({ settledCredits: "1500", settledRequests: "3", busy: false });
    expect((await runCli(["settle", "flush", "--max-requests", "0"], env)).code).toBe(2);
  });

  it("exits 1 without printing the token when the gateway is unreachable or refuses", async () => {
    const port = await closedPort();
    const down = await runCli(["settle", "reconcile"], {
      ...env,
      GATEWAY_URL: `http://127.0.0.1:${port}`,
    });
    expect(down.code).toBe(1);
    expect(down.stderr).toMatch(/cannot reach the gateway/);
    expect(down.stdout + down.stderr).not.toContain(token);

    const wrong = `op_${randomBytes(16).toString("hex")}`;
    const refused = await runCli(["settle", "flush"], { ...env, SETTLEMENT_OPERATOR_TOKEN: wrong });
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(/refused \(unauthenticated invalid_operator_token\)/);
    expect(refused.stdout + refused.stderr).not.toContain(wrong);
  });
});

describe("gateway permit (the payer's CLI)", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let dir: string;
  beforeAll(async () => {
    ({ stack, fake } = await startChatStack());
    dir = await mkdtemp(join(tmpdir(), "gw-permit-cli-"));
  }, 120_000);
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
    if (dir !== undefined) await rm(dir, { recursive: true, force: true });
  });

  const chat = (key: string) =>
    fetch(`${stack.gateway.url}/v1/chat/completions`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${key}`,
        "x-gateway-permit": stack.demo.permitId,
        "content-type": "application/json",
      },
      body: JSON.stringify({ model: "demo-chat", messages: [{ role: "user", content: "hi" }] }),
    });

  it("authorize signs as the payer for the API key given (JSON with --json); revoke signs the payer's revocation", async () => {
    const app = await createApiKey(stack.database.db.pool, "cli app");
    auditSecret("api key", app.key);
    expect((await chat(app.key)).status).toBe(403);
    const env = {
      PATH: process.env.PATH ?? "",
      GATEWAY_URL: stack.gateway.url,
      GATEWAY_API_KEY: app.key,
      PAYER_PRIVATE_KEY: stack.roles.payer.privateKey,
      // The chain the payer signs for is its own configuration's (here without an RPC).
      CHAIN_ID: String(stack.config.chainId),
      MARKET_ADDRESS: stack.demo.market,
      // No terminal: the deployment is pinned, or nothing is signed (issue 37).
      GATEWAY_DEPLOYMENT_ID: await deploymentId(stack.database.db.pool),
    };
    const authorized = await runCli(
      ["permit", "authorize", "--permit", stack.demo.permitId, "--json"],
      env,
    );
    // What the payer signs is shown on stderr first (stdin is no terminal: no question).
    expect(authorized.stderr).toMatch(/^about to sign AuthorizeKey as the payer /);
    expect(authorized.code).toBe(0);
    const { authorization } = JSON.parse(authorized.stdout) as {
      authorization: { id: string; api_key_id: string; payer: string; permit_id: string };
    };
    expect(authorization).toMatchObject({
      api_key_id: app.id,
      payer: stack.roles.payer.address.toLowerCase(),
      permit_id: stack.demo.permitId,
      status: "active",
    });
    for (const secret of [app.key, stack.roles.payer.privateKey])
      expect(authorized.stdout).not.toContain(secret);
    const served = await chat(app.key);
    expect(served.status).toBe(200);
    await served.arrayBuffer();

    // The payer revokes it with its own key's connection (the stack's), not the app's.
    const revoked = await runCli(["permit", "revoke", authorization.id], {
      ...env,
      GATEWAY_API_KEY: stack.apiKey,
    });
    expect(revoked.stderr).toMatch(/^about to sign RevokeKeyAuthorization as the payer /);
    expect(revoked.code).toBe(0);
    expect(revoked.stdout).toBe(`revoked ${authorization.id} (API key ${app.id}, by the payer)\n`);
    expect((await chat(app.key)).status).toBe(403);
  });

  it("signs from an encrypted keystore, and exits 1 when the gateway refuses (a key that is not the payer's)", async () => {
    const app = await createApiKey(stack.database.db.pool, "cli keystore app");
    auditSecret("api key", app.key);
    const password = randomBytes(8).toString("hex");
    const keystore = join(dir, "payer.json");
    await writeFile(
      keystore,
      encryptKeystoreJsonSync(
        { address: stack.roles.payer.address, privateKey: stack.roles.payer.privateKey },
        password,
        { scrypt: { N: 1 << 10 } },
      ),
    );
    const env = {
      PATH: process.env.PATH ?? "",
      GATEWAY_URL: stack.gateway.url,
      GATEWAY_API_KEY: app.key,
      KEYSTORE_PASSWORD: password,
      RPC_URL: stack.config.rpcUrl,
      MARKET_ADDRESS: stack.demo.market,
      GATEWAY_DEPLOYMENT_ID: await deploymentId(stack.database.db.pool),
    };
    const authorized = await runCli(["permit", "authorize", "--keystore", keystore], env);
    expect(authorized.stderr).toMatch(/^about to sign AuthorizeKey as the payer /);
    expect(authorized.code).toBe(0);
    expect(authorized.stdout).toMatch(
      new RegExp(
        `^authorized API key ${app.id} to spend every permit of ${stack.roles.payer.address.toLowerCase()} until \\d+ \\(pauth_[0-9a-f]{24}\\)\n`,
      ),
    );
    const served = await chat(app.key);
    expect(served.status).toBe(200);
    await served.arrayBuffer();

    // Someone else's key claiming to sign for the payer.
    const other = await createApiKey(stack.database.db.pool, "cli other");
    auditSecret("api key", other.key);
    const refused = await runCli(["permit", "authorize", "--payer", stack.roles.payer.address], {
      PATH: process.env.PATH ?? "",
      GATEWAY_URL: stack.gateway.url,
      GATEWAY_API_KEY: other.key,
      PAYER_PRIVATE_KEY: stack.anvil.accounts[7]!.privateKey,
      RPC_URL: stack.config.rpcUrl,
      MARKET_ADDRESS: stack.demo.market,
      GATEWAY_DEPLOYMENT_ID: await deploymentId(stack.database.db.pool),
    });
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(/\nthe gateway refused \(401 invalid_signature\)/);
    expect((await chat(other.key)).status).toBe(403);

    const usage = await runCli(["permit", "authorize", "--permit", "0x12"], env);
    expect(usage.code).toBe(2);
    expect(usage.stderr).toContain("--permit must be a permit id");
  });

  it("caps typed in token units (2.5tokens, or --tokens) are signed in base units, shown before signing in tokens with the symbol and the exact base units, and listed in tokens; a fraction finer than the token is refused", async () => {
    const app = await createApiKey(stack.database.db.pool, "cli units app");
    auditSecret("api key", app.key);
    const env = {
      PATH: process.env.PATH ?? "",
      GATEWAY_URL: stack.gateway.url,
      GATEWAY_API_KEY: app.key,
      PAYER_PRIVATE_KEY: stack.roles.payer.privateKey,
      // The token's decimals and symbol are the chain's (the permit's model's credit token).
      RPC_URL: stack.config.rpcUrl,
      MARKET_ADDRESS: stack.demo.market,
      GATEWAY_DEPLOYMENT_ID: await deploymentId(stack.database.db.pool),
    };
    const permit = ["permit", "authorize", "--permit", stack.demo.permitId];
    const authorized = await runCli(
      [
        ...permit,
        ...["--total-cap", "2.5tokens", "--per-request-cap", "100000000000000000"],
        ...["--period", "day", "--period-cap", "1.25tokens", "--warn-at", "1tokens", "--json"],
      ],
      env,
    );
    expect(authorized.code).toBe(0);
    const summary = authorized.stderr;
    expect(summary).toContain("  total cap    2.5 DCHAT (2500000000000000000 base units)");
    expect(summary).toContain("  per request  0.1 DCHAT (100000000000000000 base units)");
    expect(summary).toContain(
      "  per period   1.25 DCHAT (1250000000000000000 base units) per UTC day",
    );
    expect(summary).toContain(
      "  warn at      1 DCHAT (1000000000000000000 base units) of use per UTC day",
    );
    const { authorization } = JSON.parse(authorized.stdout) as {
      authorization: {
        total_cap: string;
        per_request_cap: string;
        period_cap: string;
        warn_at: string;
      };
    };
    expect(authorization).toMatchObject({
      total_cap: "2500000000000000000",
      per_request_cap: "100000000000000000",
      period_cap: "1250000000000000000",
      warn_at: "1000000000000000000",
    });

    // --tokens: every cap in tokens.
    const tokens = await runCli([...permit, "--total-cap", "3", "--tokens", "--json"], env);
    expect(tokens.code).toBe(0);
    expect(JSON.parse(tokens.stdout).authorization.total_cap).toBe("3000000000000000000");

    // The payer's listing reads them in tokens with the symbol.
    const listed = await runCli(["permit", "authorizations"], env);
    expect(listed.code).toBe(0);
    expect(listed.stdout).toContain(
      "cap 2.5 DCHAT total, 0.1 DCHAT per request, 1.25 DCHAT per day (used 0 DCHAT, renews ",
    );
    expect(listed.stdout).toContain(", warn at 1 DCHAT  used 0 DCHAT");
    expect(listed.stdout).toContain("cap 3 DCHAT total, none per request");

    for (const [args, message] of [
      [["--total-cap", "0.0000000000000000001tokens"], "at most 18 fractional digits"],
      [["--total-cap", "2.5"], 'for tokens write "2.5tokens" or add --tokens'],
      [["--warn-at", "1e18"], "--warn-at must be base units (1000000) or tokens (12.5tokens)"],
    ] as const) {
      const refused = await runCli([...permit, ...args], env);
      expect(refused.code).toBe(2);
      expect(refused.stderr).toContain(message);
    }
    // Without RPC_URL the token's decimals are not read: token units are refused, base units
    // still sign.
    const { RPC_URL: _rpc, ...noRpc } = env;
    const unread = await runCli([...permit, "--total-cap", "1tokens"], {
      ...noRpc,
      CHAIN_ID: String(stack.config.chainId),
    });
    expect(unread.code).toBe(2);
    expect(unread.stderr).toContain("the token's decimals are unknown");
  });
});

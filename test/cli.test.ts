import { spawn, type ChildProcess } from "node:child_process";
import { execFile } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, describe, expect, it } from "vitest";
import type { DevManifest } from "../src/dev/sandbox.js";
import { eventually, json } from "./helpers/stack.js";

const run = promisify(execFile);
const cli = ["--import", "tsx", "src/cli/main.ts"];

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

  it("manages API keys: create prints the key once, list never shows it, revoke disables it", async () => {
    const stateDir = await mkdtemp(join(tmpdir(), "gw-keys-"));
    dirs.push(stateDir);
    const env: NodeJS.ProcessEnv = { ...process.env, GATEWAY_STATE_DIR: stateDir };
    delete env.DATABASE_URL;
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
  });

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

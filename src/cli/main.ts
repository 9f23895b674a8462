import { sandboxAgentExample } from "../dev/agent-example.js";
import { join } from "node:path";
import { createInterface } from "node:readline/promises";
import { BaseError } from "../domain/base-error.js";
import { parseArgs } from "node:util";
import { createApiKey, listApiKeys, revokeApiKey } from "../adapters/pg/api-keys.js";
import { openDatabase } from "../adapters/pg/database.js";
import { migrate } from "../adapters/pg/migrate.js";
import { adoptDeployment, storedDeployment } from "../adapters/pg/deployment.js";
import { clearBlockedPayer, listBlockedPayers } from "../adapters/pg/x402.js";
import { isAddress } from "viem";
import { startGateway } from "../app.js";
import { ConfigError, parseConfig, parseLocalConfig } from "../config.js";
import { sandboxPermitOpenCommand, sandboxShutdownGraceMs, startSandbox } from "../dev/sandbox.js";
import { createLogger } from "../runtime/logger.js";
import { runAuditsBudget } from "./audits-budget.js";
import { runAuditsExport } from "./audits-export.js";
import { runPermitCommand } from "./permit.js";
import { runProviderCommand } from "./provider.js";
import { runSettleCommand } from "./settle.js";
import { runAuditsCommand } from "./audits.js";
import type { CommandOutput } from "./signing.js";

const usage = `usage: gateway <command>

commands:
  dev                       run everything on embedded defaults (anvil, PGlite, demo market)
  serve                     run the gateway with configuration from the environment
  migrate                   apply database migrations and exit
  keys create [--name N]    create an API key (printed once)
  keys list                 list API keys (never the keys themselves)
  keys revoke <id|prefix>   revoke an API key
  deployment                the database's gateway deployment id and GATEWAY_DEPLOYMENT_ID
  deployment adopt          make GATEWAY_DEPLOYMENT_ID the database's deployment id (a restored or
                            cloned database in this environment: signatures made for its old id
                            are refused from then on)
  permit open MODEL --deposit AMOUNT
                            open a permit as the payer (approve the credit token, escrow a deposit)
  permit authorize ...      let an API key spend a payer's permits, signed as the payer
  permit revoke ID          revoke an authorization with the payer's signature
  permit authorizations     list every authorization of the payer (signed as the payer, no API key)
  permit revoke --key KEY_ID [--permit ID] | --permit ID | --all
                            revoke the payer's authorizations by key, permit or all (no API key)
  permit balance ID         a permit's balance (the gateway's view, or the chain's without an API key)
  permit close ID           request a permit's close (payer only); permit finalize ID after the grace
                            period refunds what was not settled (see 'gateway permit')
  permit audit ID           check a permit's signed usage receipts against the chain
  provider ...              onboard an offer's endpoint, read its earnings (see 'gateway provider')
  audits budget [--day YYYY-MM-DD]
                            what the blind audits spent on a UTC day (today), per model and offer,
                            against AUDIT_DAILY_BUDGET_PER_OFFER / _PER_MODEL; exit 1 when over
  audits export-reference --model MODEL [--out DIR]
                            a model's border inputs and logprob reference from its anchor's audit
                            samples (AUDIT_ANCHORS), as corpus files to ship, with their SHA-256
  x402 blocked              the payers refused x402 payments since a settlement of theirs failed
  x402 clear ADDRESS        let a refused payer pay with x402 again (every gateway process)
  settle                    run the settlement worker (Flush over gRPC on an interval)
  settle reconcile          compare settled sums with the chain; exit 1 on drift
  settle flush [--dry-run] [--max-requests N]
                            one Flush now (see 'gateway settle help')
  audits [--model ID] [--json]
                            every offer's audit standing with its evidence (operator token; see
                            'gateway audits help')

Environment: see README.md ("Configuration").`;

/**
 * Where a wallet command writes, and, when stdin is a terminal, how it asks before signing
 * (src/cli/signing.ts): the question goes to stderr, the answer comes from stdin.
 */
function walletOutput(): CommandOutput {
  const ask = async (question: string): Promise<boolean> => {
    const terminal = createInterface({ input: process.stdin, output: process.stderr });
    try {
      return /^y(es)?$/i.test((await terminal.question(question)).trim());
    } finally {
      terminal.close();
    }
  };
  return {
    log: (line) => process.stdout.write(`${line}\n`),
    error: (line) => process.stderr.write(`${line}\n`),
    ...(process.stdin.isTTY ? { ask } : {}),
  };
}

class UsageError extends BaseError {
  override readonly name = "UsageError";
  readonly reason = "usage";
}

/**
 * SIGTERM/SIGINT stop what `started` resolves to (a signal that comes while it is still
 * starting waits for it, so no child process such as anvil is left behind), then exit 0. A
 * shutdown still running `graceMs` plus a margin later exits 1 (anvil is killed on exit).
 */
function onShutdown(
  started: Promise<{ close(): Promise<void> }>,
  log: { info(msg: string): void; error(obj: object, msg: string): void },
  graceMs: number,
): void {
  let stopping = false;
  const stop = (signal: string) => {
    // Once: `npm start` under a terminal gets Ctrl-C twice (from the terminal and from npm).
    if (stopping) return;
    stopping = true;
    log.info(`${signal}: shutting down`);
    const force = setTimeout(() => process.exit(1), graceMs + 10_000);
    force.unref();
    started
      .then((running) => running.close())
      .then(
        () => process.exit(0),
        (error: unknown) => {
          log.error({ err: error }, "shutdown failed");
          process.exit(1);
        },
      );
  };
  process.on("SIGINT", () => stop("SIGINT"));
  process.on("SIGTERM", () => stop("SIGTERM"));
}

/** Resolves on the first SIGTERM/SIGINT; exits the process if shutting down then takes too long. */
function stopSignal(): Promise<string> {
  return new Promise((resolve) => {
    const stop = (signal: string) => {
      process.off("SIGINT", onInt);
      process.off("SIGTERM", onTerm);
      setTimeout(() => process.exit(1), 20_000).unref();
      resolve(signal);
    };
    const onInt = () => stop("SIGINT");
    const onTerm = () => stop("SIGTERM");
    process.once("SIGINT", onInt);
    process.once("SIGTERM", onTerm);
  });
}

/** Lines a gRPC command prints: answers on stdout, failures on stderr. */
const lineOutput = {
  out: (line: string) => process.stdout.write(`${line}\n`),
  error: (line: string) => process.stderr.write(`${line}\n`),
};

/** The database a management command works on: DATABASE_URL, else the embedded one under the state dir. */
async function managementDatabase() {
  const {
    databaseUrl: url,
    databaseDirectUrl: directUrl,
    stateDir,
  } = parseLocalConfig(process.env);
  const db = await openDatabase({
    url,
    directUrl,
    dataDir: url === undefined ? join(stateDir, "pgdata") : undefined,
  });
  await migrate(db.session);
  return db;
}

/** `gateway x402 blocked | clear ADDRESS`: the payers refused x402 payments after a failed settlement. */
async function runX402Command(rest: string[]): Promise<void> {
  const [action, target] = rest;
  if (action === "clear" ? !isAddress(target ?? "", { strict: false }) : action !== "blocked")
    throw new UsageError("x402: expected 'blocked' or 'clear <payer address>'");
  const db = await managementDatabase();
  try {
    if (action === "blocked") {
      const blocked = await listBlockedPayers(db.pool);
      if (blocked.length === 0) process.stdout.write("no payer is refused x402 payments\n");
      for (const b of blocked)
        process.stdout.write(
          `${b.payer}\t${new Date(b.blockedAt * 1000).toISOString()}\t${b.permitId}\t${b.reason}\n`,
        );
    } else if (await clearBlockedPayer(db.pool, target as `0x${string}`)) {
      process.stdout.write(`cleared ${target!.toLowerCase()}: it may pay with x402 again\n`);
    } else {
      process.stderr.write(`${target} is not refused x402 payments\n`);
      process.exitCode = 1;
    }
  } finally {
    await db.close();
  }
}

/** `gateway audits budget [--day YYYY-MM-DD]`: the day's audit spend against the budgets. */
async function runAuditsBudgetCommand(args: string[]): Promise<void> {
  const db = await managementDatabase();
  try {
    process.exitCode = await runAuditsBudget(db.pool, args, process.env, {
      out: (line) => process.stdout.write(`${line}\n`),
    });
  } catch (error) {
    if (error instanceof RangeError) throw new UsageError(error.message);
    throw error;
  } finally {
    await db.close();
  }
}

/** `gateway audits export-reference`: a model's reference from its anchor, as files to ship. */
async function runAuditsExportCommand(args: string[]): Promise<void> {
  const db = await managementDatabase();
  try {
    process.exitCode = await runAuditsExport(db.pool, args, process.env, lineOutput);
  } catch (error) {
    if (error instanceof RangeError) throw new UsageError(error.message);
    throw error;
  } finally {
    await db.close();
  }
}

async function run(argv: string[]): Promise<void> {
  const [command, ...rest] = argv;
  switch (command) {
    case "dev": {
      const { logLevel, port, stateDir } = parseLocalConfig(process.env);
      const logger = createLogger(logLevel);
      const starting = startSandbox({ stateDir, port, logger });
      onShutdown(starting, logger, sandboxShutdownGraceMs);
      const sandbox = await starting;
      const { manifest } = sandbox;
      const model = manifest.models[0]?.id ?? "";
      process.stdout.write(
        `\nGateway ready at ${manifest.baseUrl} (REST, Connect, gRPC and gRPC-Web on one port).\n` +
          `Manifest: ${sandbox.manifestPath}\n` +
          `Console: ${manifest.baseUrl}/console (paste the API key below)\n\nTry:\n` +
          `  curl -s ${manifest.baseUrl}/v1/models -H 'Authorization: Bearer ${manifest.apiKey}'\n` +
          `  curl -s ${manifest.baseUrl}/v1/models/${model} -H 'Authorization: Bearer ${manifest.apiKey}'\n\n` +
          `Settlement: a worker flushes every ${manifest.settlement.workerIntervalMs / 1000} s from ${manifest.settlement.account}.\n` +
          `A chat request (its X-Gateway-Request-Id header names the request):\n` +
          `  curl -si ${manifest.baseUrl}/v1/chat/completions -H 'Authorization: Bearer ${manifest.apiKey}' -H 'X-Gateway-Permit: ${manifest.permitId}' -H 'Content-Type: application/json' -d '{"model": "${model}", "messages": [{"role": "user", "content": "hi"}]}'\n` +
          `Its record, settlement status included (set REQUEST_ID to that header):\n` +
          `  curl -s ${manifest.baseUrl}/v1/requests/$REQUEST_ID -H 'Authorization: Bearer ${manifest.apiKey}'\n` +
          `Its usage receipt, signed by ${manifest.receiptSigner} (GET /v1/gateway publishes it):\n` +
          `  curl -s ${manifest.baseUrl}/v1/requests/$REQUEST_ID/receipt -H 'Authorization: Bearer ${manifest.apiKey}'\n` +
          `Flush now instead of waiting (settlement operator token):\n` +
          `  curl -s -X POST ${manifest.settlement.flushUrl} -H 'Authorization: Bearer ${manifest.settlementOperatorToken}'\n\n` +
          `The demo key may spend the demo payer's permits because the payer signed for it. To let another\n` +
          `API key spend them (the payer signs; the key asks and submits):\n` +
          `  RPC_URL=${manifest.rpcUrl} MARKET_ADDRESS=${manifest.marketAddress} GATEWAY_URL=${manifest.baseUrl} GATEWAY_API_KEY=<the other key> PAYER_PRIVATE_KEY=<the payer's key, in ${sandbox.manifestPath}> npm run gateway -- permit authorize\n` +
          `  (it shows what the payer signs and asks first; the chain and market are yours, never the gateway's)\n\n` +
          `Open a second permit as the demo payer (10 ${model} tokens, 30 days; the demo key may spend it at once),\n` +
          `the payer's key read from the manifest:\n` +
          `  ${sandboxPermitOpenCommand(manifest, sandbox.manifestPath)}\n` +
          `then chat with X-Gateway-Permit set to the permit id it prints; 'permit balance', 'permit close'\n` +
          `and 'permit finalize' take the same environment (see 'npm run gateway -- permit').\n\n` +
          sandboxAgentExample(manifest, sandbox.manifestPath),
      );
      return;
    }
    case "serve": {
      const config = parseConfig(process.env);
      const logger = createLogger(config.logLevel);
      const starting = startGateway(config, { logger });
      onShutdown(starting, logger, config.shutdownGraceMs);
      await starting;
      return;
    }
    case "migrate": {
      const db = await managementDatabase();
      await db.close();
      process.stdout.write("database is up to date\n");
      return;
    }
    case "keys": {
      const { values, positionals } = parseArgs({
        args: rest,
        options: { name: { type: "string" } },
        allowPositionals: true,
      });
      const [action, target] = positionals;
      const db = await managementDatabase();
      try {
        if (action === "create") {
          const key = await createApiKey(db.pool, values.name ?? "default");
          process.stdout.write(
            `created ${key.id} (${key.name})\n${key.key}\nstore it now: it is not shown again\n`,
          );
        } else if (action === "list") {
          for (const key of await listApiKeys(db.pool)) {
            const state = key.revokedAt ? `revoked ${key.revokedAt.toISOString()}` : "active";
            process.stdout.write(
              `${key.id}\t${key.prefix}…\t${key.name}\t${key.createdAt.toISOString()}\t${state}\n`,
            );
          }
        } else if (action === "revoke" && target !== undefined) {
          if (!(await revokeApiKey(db.pool, target))) {
            process.stderr.write(`no active key matches '${target}'\n`);
            process.exitCode = 1;
          } else process.stdout.write(`revoked ${target}\n`);
        } else {
          throw new UsageError("keys: expected 'create', 'list' or 'revoke <id|prefix>'");
        }
      } finally {
        await db.close();
      }
      return;
    }
    case "deployment": {
      const [action] = rest;
      if (action !== undefined && action !== "adopt")
        throw new UsageError("deployment: expected nothing or 'adopt'");
      const { deploymentId: configured } = parseLocalConfig(process.env);
      if (action === "adopt" && configured === undefined)
        throw new UsageError(
          "deployment adopt: set GATEWAY_DEPLOYMENT_ID to the id this environment uses",
        );
      const db = await managementDatabase();
      try {
        if (action === "adopt") {
          const { previous, id } = await adoptDeployment(db.pool, configured!);
          process.stdout.write(
            previous === id
              ? `the database's deployment is ${id} already\n`
              : `the database's deployment is now ${id} (was ${previous}); signatures made for ${previous} are refused from now on\n`,
          );
        } else {
          const stored = await storedDeployment(db.pool);
          process.stdout.write(
            `database: ${stored.id} (${stored.configuredAt === null ? "never configured" : `configured ${stored.configuredAt.toISOString()}`})\n` +
              `GATEWAY_DEPLOYMENT_ID: ${configured ?? "not set"}\n`,
          );
          if (configured !== undefined && configured !== stored.id) process.exitCode = 1;
        }
      } finally {
        await db.close();
      }
      return;
    }
    case "permit": {
      process.exitCode = await runPermitCommand(rest, process.env, walletOutput());
      return;
    }
    case "provider": {
      process.exitCode = await runProviderCommand(rest, process.env, walletOutput());
      return;
    }
    case "x402": {
      await runX402Command(rest);
      return;
    }
    case "audits": {
      if (rest[0] === "budget") await runAuditsBudgetCommand(rest.slice(1));
      else if (rest[0] === "export-reference") await runAuditsExportCommand(rest.slice(1));
      else process.exitCode = await runAuditsCommand(rest, process.env, lineOutput);
      return;
    }
    case "settle": {
      process.exitCode = await runSettleCommand(rest, process.env, { ...lineOutput, stopSignal });
      return;
    }
    default:
      throw new UsageError(
        command === undefined ? "missing command" : `unknown command '${command}'`,
      );
  }
}

run(process.argv.slice(2)).catch((error: unknown) => {
  if (error instanceof UsageError) {
    process.stderr.write(`${error.message}\n\n${usage}\n`);
    process.exit(2);
  }
  if (error instanceof ConfigError) {
    process.stderr.write(`${error.message}\n`);
    process.exit(2);
  }
  process.stderr.write(`gateway: ${(error as Error).message}\n`);
  process.exit(1);
});

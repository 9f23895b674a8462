import { parseArgs } from "node:util";
import { BaseError } from "../domain/base-error.js";
import { toJson, type DescMessage, type MessageShape } from "@bufbuild/protobuf";
import {
  FlushResponseSchema,
  ReconcileResponseSchema,
} from "../../gen/gateway/v1/settlement_pb.js";
import { ConfigError, parseSettleConfig, type SettleConfig } from "../config.js";
import { createLogger } from "../runtime/logger.js";
import { connectSettlement, describeRpcFailure, operatorAuth } from "../clients/settlement.js";
import { createSettlementWorker } from "../runtime/settlement-worker.js";

export const settleUsage = `usage: gateway settle [command]

  (none)                  run the settlement worker: Flush every SETTLE_INTERVAL_MS until SIGTERM/SIGINT
  reconcile               compare the gateway's settled sums with the chain's; exit 1 on drift
  flush [--dry-run] [--max-requests N]
                          one Flush now; prints the answer
  help                    this text

Answers are printed as protobuf JSON (camelCase fields, enum names, 64-bit integers as strings).
Gateway:  GATEWAY_URL (default http://127.0.0.1:8080), SETTLEMENT_OPERATOR_TOKEN (required)
Worker:   SETTLE_INTERVAL_MS (default 10000), SETTLE_MAX_REQUESTS (default: all pending), LOG_LEVEL`;

export class SettleUsageError extends BaseError {
  override readonly name = "SettleUsageError";
  readonly reason = "usage";
}

function positiveInt(name: string, raw: string | undefined, max: number): number | undefined {
  const value = raw?.trim();
  if (value === undefined || value === "") return undefined;
  const n = Number(value);
  if (!/^\d+$/.test(value) || !Number.isSafeInteger(n) || n < 1 || n > max)
    throw new SettleUsageError(`${name} must be an integer from 1 to ${max}`);
  return n;
}

const uint32Max = 0xffffffff;

function printJson<T extends DescMessage>(
  schema: T,
  message: MessageShape<T>,
  out: (line: string) => void,
): void {
  // alwaysEmitImplicit: `drift: false` and `busy: false` are answers a script reads.
  out(JSON.stringify(toJson(schema, message, { alwaysEmitImplicit: true }), null, 2));
}

export interface SettleIo {
  out(line: string): void;
  error(line: string): void;
  /** Resolves when the process is asked to stop (SIGTERM/SIGINT). */
  stopSignal(): Promise<string>;
}

async function runWorker(gateway: SettleConfig, io: SettleIo) {
  const logger = createLogger(gateway.logLevel);
  const worker = createSettlementWorker({
    ...connectSettlement(gateway.url),
    token: gateway.token,
    intervalMs: gateway.intervalMs,
    maxRequests: gateway.maxRequests,
    logger,
  });
  logger.info({ gateway: gateway.url }, "settlement worker connecting");
  worker.start();
  const signal = await io.stopSignal();
  logger.info(`${signal}: stopping the settlement worker`);
  await worker.stop();
  return 0;
}

/**
 * `gateway settle …`: the settlement worker as its own process, and one-shot
 * Flush and Reconcile for operators. Returns the exit code: 0 done, 1 drift or
 * the gateway could not be reached or refused, 2 usage. The operator token
 * goes out as gRPC metadata only; no message printed here contains it.
 */
export async function runSettleCommand(
  args: string[],
  env: NodeJS.ProcessEnv,
  io: SettleIo,
): Promise<number> {
  try {
    let parsed;
    try {
      parsed = parseArgs({
        args,
        allowPositionals: true,
        options: {
          "dry-run": { type: "boolean" },
          "max-requests": { type: "string" },
        },
      });
    } catch (error) {
      throw new SettleUsageError((error as Error).message);
    }
    const { values, positionals } = parsed;
    const [action, extra] = positionals;
    if (extra !== undefined) throw new SettleUsageError(`unexpected argument '${extra}'`);
    if (
      action !== "flush" &&
      (values["dry-run"] !== undefined || values["max-requests"] !== undefined)
    )
      throw new SettleUsageError("--dry-run and --max-requests belong to 'settle flush'");
    if (action === "help") {
      io.out(settleUsage);
      return 0;
    }
    if (action !== undefined && action !== "reconcile" && action !== "flush")
      throw new SettleUsageError(`unknown settle command '${action}'`);
    const gateway = parseSettleConfig(env);
    if (action === undefined) return await runWorker(gateway, io);
    const maxRequests = positiveInt("--max-requests", values["max-requests"], uint32Max);

    const connection = connectSettlement(gateway.url);
    try {
      if (action === "reconcile") {
        const res = await connection.client.reconcile({}, operatorAuth(gateway.token));
        printJson(ReconcileResponseSchema, res, io.out);
        if (!res.drift) return 0;
        const permits = res.permits.filter((p) => p.drift).map((p) => p.permitId);
        const offers = res.offers.filter((o) => o.drift).map((o) => o.offerId);
        io.error(
          `drift: permits [${permits.join(", ")}], offers [${offers.join(", ")}] (account ${res.account})`,
        );
        return 1;
      }
      const res = await connection.client.flush(
        {
          ...(maxRequests === undefined ? {} : { maxRequests }),
          dryRun: values["dry-run"] === true,
        },
        operatorAuth(gateway.token),
      );
      printJson(FlushResponseSchema, res, io.out);
      return 0;
    } catch (error) {
      const failure = describeRpcFailure(error);
      io.error(
        failure.unreachable
          ? `cannot reach the gateway at ${gateway.url}: ${failure.message}`
          : `the gateway refused (${failure.code}${failure.reason === undefined ? "" : ` ${failure.reason}`}): ${failure.message}`,
      );
      return 1;
    } finally {
      connection.close();
    }
  } catch (error) {
    if (error instanceof SettleUsageError) {
      io.error(`${error.message}\n\n${settleUsage}`);
      return 2;
    }
    if (error instanceof ConfigError) {
      io.error(`${error.message}\n\n${settleUsage}`);
      return 2;
    }
    throw error;
  }
}

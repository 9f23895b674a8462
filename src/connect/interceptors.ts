import { createHash, timingSafeEqual } from "node:crypto";
import { ConnectError, type Interceptor } from "@connectrpc/connect";
import type { Logger } from "pino";
import { SettlementService } from "../../gen/gateway/v1/settlement_pb.js";
import { GatewayError } from "../domain/errors.js";
import { randomHex } from "../domain/random-id.js";
import { callerKey, requestIdKey } from "./context.js";
import { errorCodeOf, toConnectError } from "./errors.js";

const requestIdPattern = /^[A-Za-z0-9._-]{1,128}$/;

export function newRequestId(): string {
  return randomHex(12);
}

/**
 * Outermost interceptor: gives the call a request id, logs the outcome with it, and turns every failure, unary or mid-stream,
 * into a ConnectError through {@link toConnectError}.
 */
export function observabilityInterceptor(logger: Logger): Interceptor {
  return (next) => async (req) => {
    let requestId = req.contextValues.get(requestIdKey);
    if (requestId === "") {
      const header = req.header.get("x-request-id");
      requestId = header !== null && requestIdPattern.test(header) ? header : newRequestId();
      req.contextValues.set(requestIdKey, requestId);
    }
    // The child logger is made only when a line is written: most calls log nothing.
    let child: Logger | undefined;
    const log = (): Logger =>
      (child ??= logger.child({
        reqId: requestId,
        rpc: `${req.service.typeName}/${req.method.name}`,
      }));
    const debug = logger.isLevelEnabled("debug");
    const started = performance.now();
    const fail = (error: unknown): ConnectError => {
      const connectError = toConnectError(error);
      const code = errorCodeOf(connectError);
      const fields = { code, ms: Math.round(performance.now() - started) };
      if (code === "internal_error")
        log().error({ ...fields, err: connectError.cause ?? error }, "rpc failed");
      else log().info(fields, "rpc rejected");
      return connectError;
    };
    try {
      const res = await next(req);
      if (!res.stream) {
        if (debug) log().debug({ ms: Math.round(performance.now() - started) }, "rpc ok");
        return res;
      }
      const inner = res.message;
      return {
        ...res,
        message: (async function* () {
          try {
            yield* inner;
            if (debug)
              log().debug({ ms: Math.round(performance.now() - started) }, "rpc stream ok");
          } catch (error) {
            throw fail(error);
          }
        })(),
      };
    } catch (error) {
      throw fail(error);
    }
  };
}

export interface AuthOptions {
  /** Looks an API key up; null when unknown or revoked. */
  readonly findApiKey: (key: string) => Promise<{ id: string } | null>;
  readonly settlementOperatorToken: string;
}

function bearer(header: string | null): string | undefined {
  if (header === null) return undefined;
  const match = /^Bearer\s+(\S+)\s*$/i.exec(header);
  return match?.[1];
}

function digest(value: string): Buffer {
  return createHash("sha256").update(value).digest();
}

/**
 * Every RPC needs credentials: the settlement service the operator token,
 * everything else an API key.
 */
export function authInterceptor(options: AuthOptions): Interceptor {
  const operatorDigest = digest(options.settlementOperatorToken);
  return (next) => async (req) => {
    const token = bearer(req.header.get("authorization"));
    if (req.service.typeName === SettlementService.typeName) {
      if (token === undefined || !timingSafeEqual(digest(token), operatorDigest)) {
        throw new GatewayError(
          "invalid_operator_token",
          "settlement operations need the settlement operator token",
        );
      }
      return next(req);
    }
    if (token === undefined) {
      throw new GatewayError(
        "missing_api_key",
        "missing API key: send it as 'Authorization: Bearer <API key>'",
      );
    }
    let found: { id: string } | null;
    try {
      found = await options.findApiKey(token);
    } catch (error) {
      throw new GatewayError("database_unavailable", "the API key store cannot be reached", {
        cause: error,
      });
    }
    if (found === null) throw new GatewayError("invalid_api_key", "invalid API key");
    req.contextValues.set(callerKey, { apiKeyId: found.id });
    return next(req);
  };
}

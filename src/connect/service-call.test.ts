import { Code, ConnectError, type HandlerContext } from "@connectrpc/connect";
import pino from "pino";
import { describe, expect, it } from "vitest";
import { CatalogService } from "../../gen/gateway/v1/catalog_pb.js";
import { InferenceService } from "../../gen/gateway/v1/inference_pb.js";
import { GatewayError } from "../domain/errors.js";
import type { SpendingAuthority } from "../domain/permit-authorization/index.js";
import { createCallGuard, requestIdOf, type CallRequest } from "./call-guard.js";
import { callerKey } from "./context.js";
import { HeaderView } from "./header-view.js";
import type { Services } from "./routes.js";
import { createServiceCalls } from "./service-call.js";

/**
 * The REST facade's direct calls of the service methods through the call guard (what the
 * in-process transport's interceptor chain did before issue 36): the guard's admission, the
 * context the method gets, message defaults, `unimplemented`, and one outcome per call.
 */

const authority = {} as SpendingAuthority;

function setup(options: { take?: (key: string) => void } = {}) {
  const lines: { level: number; msg: string; reqId?: string; code?: string; rpc?: string }[] = [];
  const logger = pino(
    { level: "debug" },
    { write: (line: string) => lines.push(JSON.parse(line) as (typeof lines)[number]) },
  );
  const rejected: string[] = [];
  const lookups: string[] = [];
  const guard = createCallGuard({
    logger,
    observer: { call: () => undefined, rejected: (code, rpc) => rejected.push(`${rpc} ${code}`) },
    settlementOperatorToken: "operator-token",
    findApiKey: async (key) => {
      lookups.push(key);
      return key === "good" ? { id: "key_1", authority } : null;
    },
    rateLimiter: {
      take: (key) => options.take?.(key),
      acquireStream: () => () => undefined,
      size: 0,
    },
  });
  let seen: HandlerContext | undefined;
  const services: Services = {
    catalog: {} as Services["catalog"],
    inference: {
      getRequest: (req, ctx) => {
        seen = ctx;
        // A partial answer: the caller still gets a message, its defaults filled.
        return { request: { id: req.id } } as never;
      },
    },
  };
  const calls = createServiceCalls(services, guard);
  const request = (headers: Record<string, string>, extra: Partial<CallRequest> = {}) => ({
    requestId: requestIdOf(headers["x-request-id"]),
    signal: new AbortController().signal,
    header: new HeaderView(headers),
    ...extra,
  });
  return { calls, request, lines, rejected, lookups, seen: () => seen };
}

describe("direct service calls through the call guard", () => {
  it("admits the caller, hands the method the guard's context, and answers a message", async () => {
    const t = setup();
    const unary = t.calls(t.request({ authorization: "Bearer good", "x-request-id": "req-1" }));
    const answer = await unary(InferenceService.method.getRequest, { id: "abc" });
    expect(answer.request?.id).toBe("abc");
    expect(answer.request?.model).toBe("");
    expect(t.seen()?.values.get(callerKey)).toEqual({ apiKeyId: "key_1", authority });
    expect(t.seen()?.requestHeader.get("x-request-id")).toBe("req-1");
    expect(t.lines.filter((l) => l.msg === "rpc ok")).toEqual([
      expect.objectContaining({ reqId: "req-1", rpc: "gateway.v1.InferenceService/GetRequest" }),
    ]);
  });

  it("takes credentials checked before the body as they are, and the key's rate once", async () => {
    const t = setup();
    const taken: string[] = [];
    const withRate = setup({ take: (key) => taken.push(key) });
    // GetRequest takes an API key or a payer's token (`apiKeyOrPayer`).
    const checked = {
      need: "apiKeyOrPayer" as const,
      operator: false as const,
      caller: { apiKeyId: "key_9", authority },
    };
    const unary = withRate.calls(withRate.request({}, { checked }));
    await unary(InferenceService.method.getRequest, { id: "x" });
    expect(withRate.lookups).toEqual([]);
    expect(withRate.seen()?.values.get(callerKey)?.apiKeyId).toBe("key_9");
    expect(taken).toEqual(["key_9"]);
    expect(t.lookups).toEqual([]);
  });

  it("reads the Messages dialect's x-api-key only where the route takes it", async () => {
    const t = setup();
    const plain = t.calls(t.request({ "x-api-key": "good" }));
    const refused = await plain(InferenceService.method.getRequest, { id: "x" }).catch(
      (e: unknown) => e,
    );
    expect(refused).toBeInstanceOf(ConnectError);
    expect((refused as ConnectError).code).toBe(Code.Unauthenticated);
    const dialect = t.calls(t.request({ "x-api-key": "good" }, { apiKeyHeader: true }));
    await dialect(InferenceService.method.getRequest, { id: "x" });
    expect(t.lookups).toEqual(["good"]);
  });

  it("answers unimplemented for a method without an implementation, logged and counted once", async () => {
    const t = setup();
    const unary = t.calls(t.request({ authorization: "Bearer good" }));
    const error = await unary(CatalogService.method.listModels, {}).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ConnectError);
    expect((error as ConnectError).code).toBe(Code.Unimplemented);
    expect(t.lines.filter((l) => l.msg === "rpc rejected")).toHaveLength(1);
    expect(t.rejected).toEqual(["gateway.v1.CatalogService/ListModels not_implemented"]);
  });

  it("a refusal of the rate is the call's one outcome, under the RPC's name", async () => {
    const t = setup({
      take: () => {
        throw new GatewayError("rate_limited", "slow down", { retryAfterSeconds: 1 });
      },
    });
    const unary = t.calls(t.request({ authorization: "Bearer good", "x-request-id": "r" }));
    const error = await unary(InferenceService.method.getRequest, { id: "x" }).catch(
      (e: unknown) => e,
    );
    expect((error as ConnectError).code).toBe(Code.ResourceExhausted);
    expect(t.rejected).toEqual(["gateway.v1.InferenceService/GetRequest rate_limited"]);
    expect(t.lines.filter((l) => l.msg === "rpc rejected")).toEqual([
      expect.objectContaining({ reqId: "r", code: "rate_limited" }),
    ]);
    expect(t.seen()).toBeUndefined();
  });
});

describe("request ids", () => {
  it("keeps a client's sane X-Request-Id and makes one otherwise", () => {
    expect(requestIdOf("abc-1.2_3")).toBe("abc-1.2_3");
    for (const bad of [undefined, null, "", "a b", "x".repeat(129), "évil"]) {
      expect(requestIdOf(bad)).toMatch(/^[0-9a-f]{24}$/);
    }
  });
});

describe("header view", () => {
  it("reads Node's headers in place and changes a copy, never the request's", () => {
    const headers: Record<string, string | string[]> = {
      authorization: "Bearer k",
      "x-many": ["a", "b"],
      ":path": "/x",
    };
    const view = new HeaderView(headers);
    expect(view.get("Authorization")).toBe("Bearer k");
    expect(view.get("x-many")).toBe("a, b");
    expect(view.get("x-missing")).toBeNull();
    expect(view.has("authorization")).toBe(true);
    view.set("authorization", "Bearer other");
    expect(view.get("authorization")).toBe("Bearer other");
    expect([...view].map(([k]) => k)).toEqual(["authorization", "x-many"]);
    expect(headers.authorization).toBe("Bearer k");
  });
});

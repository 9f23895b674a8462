import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, type ConnectRouter } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { ErrorInfoSchema } from "../../gen/google/rpc/error_details_pb.js";
import {
  FlushResponseSchema,
  ReconcileResponseSchema,
  SettlementService,
  type FlushRequest,
} from "../../gen/gateway/v1/settlement_pb.js";

export interface FixtureCall {
  readonly method: "flush" | "reconcile";
  /** Date.now() when the call arrived and when the fixture answered (or gave up). */
  readonly at: number;
  endedAt: number | undefined;
  readonly authorization: string | null;
  readonly contentType: string | null;
  readonly protocol: string;
  readonly request: FlushRequest | undefined;
  /** True when the caller went away before the answer (ctx.signal aborted). */
  aborted: boolean;
}

/**
 * A stand-in for the gateway's SettlementService: a real connect-node server
 * over h2c on port 0 (as the gateway serves gRPC), checking the operator token
 * as the gateway does, recording every call, and told by the test what to
 * answer. It is the server side of the worker's contract, not a mock of the
 * worker.
 */
export interface SettlementFixture {
  readonly url: string;
  readonly calls: FixtureCall[];
  /** The next `n` calls fail with `code` (default `unavailable`). */
  failNext(n: number, code?: Code): void;
  /** The next `n` flushes answer `busy`. */
  busyNext(n: number): void;
  /** Every flush waits this long before answering (unless the caller aborts). */
  flushDelayMs: number;
  flushAnswer: MessageInitShape<typeof FlushResponseSchema>;
  reconcileAnswer: MessageInitShape<typeof ReconcileResponseSchema>;
  /** HTTP/2 sessions (client connections) open right now. */
  openSessions(): number;
  close(): Promise<void>;
}

export const settledFlush: MessageInitShape<typeof FlushResponseSchema> = {
  batches: [
    {
      batchId: `0x${"ab".repeat(32)}`,
      requests: 3n,
      credits: "1500",
      charges: 2n,
      txHash: `0x${"cd".repeat(32)}`,
      status: 3, // SETTLED
    },
  ],
  settledRequests: 3n,
  settledCredits: "1500",
  unsettleable: [
    {
      permitId: `0x${"01".repeat(32)}`,
      offerId: `0x${"02".repeat(32)}`,
      requests: 1n,
      credits: "70",
      reason: "permit_closed",
    },
  ],
};

export async function startSettlementFixture(token: string): Promise<SettlementFixture> {
  let failures: { n: number; code: Code } = { n: 0, code: Code.Unavailable };
  let busy = 0;
  const calls: FixtureCall[] = [];
  const sessions = new Set<http2.ServerHttp2Session>();

  const fixture: SettlementFixture = {
    url: "",
    calls,
    failNext(n, code = Code.Unavailable) {
      failures = { n, code };
    },
    busyNext(n) {
      busy = n;
    },
    flushDelayMs: 0,
    flushAnswer: settledFlush,
    reconcileAnswer: { account: `0x${"11".repeat(20)}`, drift: false, permits: [], offers: [] },
    openSessions: () => sessions.size,
    close: async () => {},
  };

  const record = (
    method: FixtureCall["method"],
    ctx: { requestHeader: Headers; protocolName: string; signal: AbortSignal },
    request?: FlushRequest,
  ): FixtureCall => {
    const call: FixtureCall = {
      method,
      at: Date.now(),
      endedAt: undefined,
      authorization: ctx.requestHeader.get("authorization"),
      contentType: ctx.requestHeader.get("content-type"),
      protocol: ctx.protocolName,
      request,
      aborted: false,
    };
    calls.push(call);
    // connect-node also aborts the signal once a call is done; only an abort before the answer counts.
    ctx.signal.addEventListener(
      "abort",
      () => {
        if (call.endedAt === undefined) call.aborted = true;
      },
      { once: true },
    );
    if (call.authorization !== `Bearer ${token}`) {
      call.endedAt = Date.now();
      throw new ConnectError(
        "settlement operations need the settlement operator token",
        Code.Unauthenticated,
        undefined,
        [
          {
            desc: ErrorInfoSchema,
            value: { reason: "invalid_operator_token", domain: "gateway.v1" },
          },
        ],
      );
    }
    if (failures.n > 0) {
      failures.n -= 1;
      call.endedAt = Date.now();
      throw new ConnectError("told to fail", failures.code);
    }
    return call;
  };

  const routes = (router: ConnectRouter) =>
    router.service(SettlementService, {
      async flush(req, ctx) {
        const call = record("flush", ctx, req);
        try {
          if (fixture.flushDelayMs > 0) {
            await new Promise<void>((resolve, reject) => {
              const timer = setTimeout(resolve, fixture.flushDelayMs);
              ctx.signal.addEventListener(
                "abort",
                () => {
                  clearTimeout(timer);
                  reject(new ConnectError("caller went away", Code.Canceled));
                },
                { once: true },
              );
            });
          }
          if (busy > 0) {
            busy -= 1;
            return create(FlushResponseSchema, { busy: true });
          }
          return create(FlushResponseSchema, fixture.flushAnswer);
        } finally {
          call.endedAt = Date.now();
        }
      },
      async reconcile(_req, ctx) {
        const call = record("reconcile", ctx);
        call.endedAt = Date.now();
        return create(ReconcileResponseSchema, fixture.reconcileAnswer);
      },
    });

  const server = http2.createServer(connectNodeAdapter({ routes }));
  server.on("session", (session) => {
    sessions.add(session);
    session.once("close", () => sessions.delete(session));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return Object.assign(fixture, {
    url: `http://127.0.0.1:${port}`,
    // Waits for every client connection to go: a client that leaks its session makes this hang.
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  });
}

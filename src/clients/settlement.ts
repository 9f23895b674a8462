import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { ErrorInfoSchema } from "../../gen/google/rpc/error_details_pb.js";
import { SettlementService } from "../../gen/gateway/v1/settlement_pb.js";

/** A typed gRPC client of `gateway.v1.SettlementService`. */
export type SettlementClient = Client<typeof SettlementService>;

export interface SettlementConnection {
  readonly client: SettlementClient;
  /** Closes the HTTP/2 connection, and with it any call still on it. Safe to call twice. */
  close(): void;
}

/**
 * A gRPC client of the gateway's SettlementService over one HTTP/2 connection
 * (h2c with prior knowledge for `http:`, TLS for `https:`), the way DESIGN.md
 * says internal callers reach the gateway. The session manager is ours rather
 * than one per call so that {@link SettlementConnection.close} can drop the
 * socket: a stopped worker must not keep a process or a test alive. PINGs
 * while a call is open notice a dead connection during a long Flush (which
 * waits for receipts) instead of waiting forever.
 */
export function connectSettlement(baseUrl: string): SettlementConnection {
  const sessionManager = new Http2SessionManager(baseUrl, {
    pingIntervalMs: 30_000,
    pingTimeoutMs: 15_000,
  });
  const transport = createGrpcTransport({ baseUrl, sessionManager });
  return {
    client: createClient(SettlementService, transport),
    close: () => sessionManager.abort(),
  };
}

/** Call options that carry the settlement operator token as gRPC metadata. */
export function operatorAuth(token: string): { headers: Record<string, string> } {
  return { headers: { authorization: `Bearer ${token}` } };
}

/** What went wrong with a settlement RPC, in words safe to log or print (never the token). */
export interface RpcFailure {
  /** The gRPC code as Connect names it: `unavailable`, `unauthenticated`, ... */
  readonly code: string;
  /** The gateway's error code (ErrorInfo reason), when it sent one: `invalid_operator_token`, ... */
  readonly reason: string | undefined;
  readonly message: string;
  /** True when the gateway was never reached (connection refused, reset, DNS). */
  readonly unreachable: boolean;
}

export function describeRpcFailure(error: unknown): RpcFailure {
  const connectError = ConnectError.from(error);
  const reason = connectError
    .findDetails(ErrorInfoSchema)
    .find((info) => info.domain === "gateway.v1")?.reason;
  return {
    code: Code[connectError.code].replace(/[A-Z]/g, (c, i: number) =>
      i === 0 ? c.toLowerCase() : `_${c.toLowerCase()}`,
    ),
    reason,
    message: connectError.rawMessage,
    unreachable: connectError.code === Code.Unavailable && reason === undefined,
  };
}

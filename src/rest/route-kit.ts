import type { Static, TSchema } from "@sinclair/typebox";
import type { CallGuard, CallRequest } from "../connect/call-guard.js";
import type { Services } from "../connect/routes.js";
import type { UnaryCall } from "../connect/service-call.js";
import { GatewayError } from "../domain/errors.js";
import { compileBody, type BodyCheck } from "../domain/body-check.js";
import type { NodeRequest, NodeResponse } from "./body.js";
import type { ErrorBody as ErrorBodyValue } from "./errors.js";
import type { RouteSpec } from "./route-spec.js";
import { parseStatusFilter } from "./views/challenges.js";

/**
 * What a REST route is (its declaration for the document and its handler) and the helpers the
 * route files of src/rest/routes/ share; the facade (src/rest/facade.ts) serves the routes it
 * is handed.
 */

export interface Readiness {
  readonly ok: boolean;
  /** The process is stopping (SIGTERM): `GET /ready` answers 503 `shutting_down` without checks. */
  readonly shuttingDown?: boolean;
  readonly checks: Record<
    string,
    { ok: boolean; error?: string; loading?: readonly string[]; failed?: readonly string[] }
  >;
}

/** What the routes use of the facade's dependencies (src/rest/facade.ts's FacadeDeps). */
export interface RouteDeps {
  readonly bodyLimitBytes: number;
  /**
   * Chat requests without credentials may pay with x402 (issue 37): the facade hands them to
   * their route, which prices them (402) or takes their payment; absent or false: 401.
   */
  readonly x402?: boolean | undefined;
  readonly readiness: () => Promise<Readiness>;
}

export interface Call<Body = unknown> {
  readonly req: NodeRequest;
  readonly res: NodeResponse;
  /** The query string, without its `?` ("" when there is none). */
  readonly query: string;
  readonly params: readonly string[];
  /**
   * What the call guard knows of this request: its id, signal (the client left, or shutdown cut
   * it), headers and the credentials checked before its body.
   */
  readonly request: CallRequest;
  /** The call guard, which a route's call passes once (`unary` does; the chat route itself). */
  readonly guard: CallGuard;
  /** The service implementations, called directly (no transport, no interceptor chain). */
  readonly services: Services;
  /** A unary service method called directly, through the guard (src/connect/service-call.ts). */
  readonly unary: UnaryCall;
  readonly deps: RouteDeps;
  /** The JSON body, validated against the route's body schema (routes whose facade reads it). */
  readonly body: Body;
}

export interface Reply {
  readonly status?: number;
  readonly body: unknown;
  readonly headers?: Record<string, string>;
}

export interface Route extends RouteSpec {
  readonly handle: (call: Call) => Promise<Reply | undefined>;
  /**
   * Validates the JSON body before the handler runs (the facade reads it); absent: the handler
   * reads the raw bytes itself and the core validates them (chat, quotes, dialects).
   */
  readonly checkBody?: BodyCheck<TSchema>;
  /** The route's own error body (a dialect's shape); default the spec's `{error: {...}}`. */
  readonly errorBody?: (error: ErrorBodyValue["error"]) => unknown;
  /** A smaller bound than BODY_LIMIT_BYTES on the JSON body the facade reads (413 above it). */
  readonly bodyLimitBytes?: number;
  /** The API key may come as `x-api-key` when there is no `Authorization` (Anthropic's clients). */
  readonly apiKeyHeader?: boolean;
  /** A request without credentials may pay for itself with x402 (the chat routes). */
  readonly payable?: boolean;
}

/** A route whose JSON body the facade validates: the handler gets it typed. */
export function withBody<S extends TSchema>(
  schema: S,
  route: Omit<Route, "handle" | "body" | "checkBody"> & {
    readonly optional?: boolean;
    readonly handle: (call: Call<Static<S>>) => Promise<Reply | undefined>;
  },
): Route {
  const { optional, handle, ...rest } = route;
  return {
    ...rest,
    body: { schema, ...(optional === true ? { optional } : {}) },
    checkBody: compileBody(schema),
    handle: handle as Route["handle"],
  };
}

export const statusOf = <T extends number>(
  schema: Parameters<typeof parseStatusFilter>[0],
  query: string,
): T | undefined => {
  const word = query === "" ? null : new URLSearchParams(query).get("status");
  const value = parseStatusFilter<T>(schema, word);
  if (word !== null && word !== "" && value === undefined) {
    throw new GatewayError("invalid_request", `unknown status filter '${word.slice(0, 40)}'`);
  }
  return value;
};

/** A query parameter that is a non-negative integer (Unix seconds, a count); else 400. */
export function integerQuery(query: string, name: string): number | undefined {
  const word = query === "" ? null : new URLSearchParams(query).get(name);
  if (word === null || word === "") return undefined;
  if (!/^[0-9]{1,15}$/.test(word))
    throw new GatewayError("invalid_request", `'${name}' must be a non-negative integer`);
  return Number(word);
}

/** Unix seconds of an optional request member, for an RPC's optional int64. */
export function seconds(value: number | null | undefined): bigint | undefined {
  return value === undefined || value === null ? undefined : BigInt(value);
}

export const typedDataAnswer = (schema: TSchema) => ({
  description: "Wallet-ready typed data (eth_signTypedData_v4)",
  schema,
});
